// A same-host pair of registrations as the peer transport moves blocks between them: the local registration and a
// peer's registration mapped here (PeerMapping), one peer transport per direction (read: local <- remote; write:
// remote <- local, the remote's memory then being the destination member 0), and, per direction, the gather kernel's
// tables and error record, so device-id transfers (Endpoint::readDevice) run in a stream or a CUDA graph.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <shared_mutex>
#include <string>
#include <vector>

#include "device/device_errors.hpp"
#include "device/device_memory.hpp"
#include "endpoint/peer_mapping.hpp"
#include "fetch/device_copy.hpp"
#include "fetch/member_layouts.hpp"
#include "fetch/transport/peer/peer_transport.hpp"
#include "kvcomm/device_error.hpp"

namespace kvcomm::detail {

struct PeerLinkSpec {
  char* localBase = nullptr;
  size_t localBytes = 0;
  MemoryKind kind = MemoryKind::Host;
  int device = -1;
  const MemberLayouts* table = nullptr;       // 0: local, 1: remote
  const MemberLayouts* writeTable = nullptr;  // 0: remote, 1: local
  std::shared_ptr<PeerMapping> mapping;
  int remotePid = 0;
  std::string remoteName;
  DeviceCopier* copier = nullptr;  // CUDA: the endpoint's copier of `device`
};

class PeerLink {
 public:
  /// CUDA: the tables are made on `spec.device` (the caller's current device never changes).
  explicit PeerLink(const PeerLinkSpec& spec);
  ~PeerLink();
  PeerLink(const PeerLink&) = delete;
  PeerLink& operator=(const PeerLink&) = delete;

  /// The direction's peer transport and its context (write: member 0 is the remote's memory).
  FetchTransport& transport(bool write) { return *dir(write).transport; }
  const PeerContext& context(bool write) { return dir(write).ctx; }
  const std::shared_ptr<PeerMapping>& mapping() const { return spec_.mapping; }
  /// The primary context of the device (nullptr for host memory): made current around launches.
  void* cudaContext() const { return cudaCtx_; }
  /// From now on kernel and CPU device-id runs copy nothing (they record BlockOutOfRange); returns once every run
  /// that started before has ended (CUDA: the device's context synchronised). Idempotent.
  void disable() noexcept;
  bool disabled() const { return disabled_; }
  /// Held by a CPU device-id run (host registrations) while it copies: disable() waits for it.
  std::shared_lock<std::shared_mutex> hostRun() { return std::shared_lock<std::shared_mutex>(runs_); }
  /// Reads (and clears) the first recorded error: the read direction's, then the write direction's.
  DeviceError pollError();

 private:
  struct Direction {
    std::shared_ptr<const PeerMemory> memory;
    uint64_t* words = nullptr;  // device memory (CUDA) or hostWords: regions, peers, backed
    std::vector<uint64_t> hostWords;
    std::unique_ptr<ErrorRecordMemory> error;
    std::unique_ptr<DeviceWords> claims;  // CUDA: device-id runs' duplicate destinations (FetchLaunch::claims)
    PeerContext ctx;
    std::unique_ptr<FetchTransport> transport;
  };
  Direction& dir(bool write) { return write ? write_ : read_; }
  void build(Direction& d, bool write);

  PeerLinkSpec spec_;
  void* cudaCtx_ = nullptr;
  std::atomic<bool> disabled_{false};
  std::shared_mutex runs_;
  Direction read_, write_;
};

}  // namespace kvcomm::detail
