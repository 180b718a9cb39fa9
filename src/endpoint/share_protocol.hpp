// The same-host share protocol of endpoints: how a peer on this host maps a registration instead of copying it over
// TCP. Each endpoint listens on an abstract Unix socket named after its id (SOCK_SEQPACKET; abstract sockets live in
// the network namespace, as the metadata's host key does). The server checks the peer's uid (SO_PEERCRED) before it
// reads a byte, then the request's capability (constant time) and generation, before it says anything about the
// memory.
//
//   client -> server  ShareRequest
//   server -> client  ShareReply; granted: `count` PieceMeta, then the fds in batches (fd_exchange's framing); a
//                     cudaMalloc registration travels as a legacy IPC handle inside the reply (count 0)
//   the connection stays open: it is the lease. The owner sends a ShareNotice when the registration is revoked or
//   unregistered or the endpoint closes; the client stops every transfer that touches the mapping, unmaps it and
//   closes the connection, which is the owner's acknowledgement (a client that dies closes it too).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "fetch/transport/net/wire.hpp"

namespace kvcomm::detail {

inline constexpr uint32_t kShareMagic = 0x5345564bu;  // "KVES"
inline constexpr uint32_t kShareVersion = 1;

/// How a registration's memory travels to a same-host peer (0: it cannot; metadata carries it).
enum class ShareKind : uint32_t {
  None = 0,
  MemFd = 1,        ///< host memory of memfd or shm mappings (kvcomm arenas and buffers): fds, mmap
  CudaPosixFd = 2,  ///< CUDA VMM allocations made exportable: fds, cuMemImportFromShareableHandle + cuMemMap
  CudaIpc = 3,      ///< cudaMalloc memory (the caching allocator's blocks): a legacy IPC handle
};
const char* shareKindName(ShareKind k);

enum class ShareStatus : int32_t {
  Granted = 0,
  WrongUser = 1,
  Malformed = 2,
  Unknown = 3,  ///< no such registration (never, or no longer: unregistered)
  Unauthorized = 4,
  Stale = 5,  ///< an older generation (revoked)
  NotShareable = 6,
  Busy = 7,       ///< too many leases
  Gone = 8,       ///< (client side) nobody listens on the owner's socket: it exited or restarted
  MapFailed = 9,  ///< (client side) granted, but this process could not map it (no P2P between the GPUs, ...)
};

struct ShareRequest {
  uint32_t magic;
  uint32_t version;
  uint64_t regionId;
  uint64_t generation;
  WireCapability capability;
};
static_assert(sizeof(ShareRequest) == 40 && std::is_trivially_copyable_v<ShareRequest>);

struct ShareReply {
  uint32_t magic;
  int32_t status;  // ShareStatus
  uint32_t kind;   // ShareKind
  uint32_t count;  // pieces (and fds) that follow
  int32_t device;  // CUDA ordinal of the memory (-1: host)
  int32_t reserved;
  uint64_t span;      // bytes the importer reserves (MemFd, CudaPosixFd)
  uint64_t offset;    // where the registration starts in the span, or in the IPC allocation
  uint8_t ipc[64];    // CudaIpc: the CUipcMemHandle
  char message[160];  // refused: why
};
static_assert(sizeof(ShareReply) == 264 && std::is_trivially_copyable_v<ShareReply>);

/// Why the owner ended a lease.
enum class ShareEnd : uint32_t { Revoked = 1, Unregistered = 2, Closed = 3 };

struct ShareNotice {
  uint32_t magic;
  uint32_t end;  // ShareEnd
};

/// The abstract socket name of endpoint `endpointId`'s share server.
std::string shareSocketName(uint64_t endpointId);

}  // namespace kvcomm::detail
