// An endpoint's same-host share server (the owner side of share_protocol.hpp): one thread that accepts peers of the
// same uid on the endpoint's abstract socket, answers each request by the registration's capability and generation
// with what backs it, and keeps the connection as the peer's lease until the owner ends it (revoke, unregister,
// close) and the peer lets go, or the peer closes it.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/fd.hpp"
#include "common/listener.hpp"
#include "endpoint/memory_export.hpp"
#include "fetch/transport/tcp/tcp_server.hpp"

namespace kvcomm::detail {

/// A registration as the share server offers it.
struct SharedMemory {
  std::shared_ptr<ServedMemory> served;  // capability and generation, as TCP checks them
  size_t bytes = 0;
  /// kvcomm arenas and buffers: their own pieces (tried before looking the memory up in /proc/self/map_files).
  std::function<std::vector<Piece>()> ownPieces;
  std::mutex mu;  // the export, made at the first request (on the server's thread)
  bool exported = false;
  MemoryExport exp;
};

class ShareServer {
 public:
  /// Listens on shareSocketName(endpointId). Throws SystemError when the socket cannot be made.
  explicit ShareServer(uint64_t endpointId);
  /// Ends every lease (ShareEnd::Closed, not waiting) and joins the thread.
  ~ShareServer();
  ShareServer(const ShareServer&) = delete;
  ShareServer& operator=(const ShareServer&) = delete;

  void add(std::shared_ptr<SharedMemory> memory);
  /// Later requests naming `regionId` are refused as unknown.
  void remove(uint64_t regionId);
  /// Tells every holder of a lease on `regionId` that it ended (`why`), then waits up to `timeoutMs` (< 0: no
  /// bound) until each let go (unmapped and closed, or died). Returns the pids still holding one (empty: none).
  std::vector<int> end(uint64_t regionId, ShareEnd why, int64_t timeoutMs);
  /// Connections refused so far (wrong user, malformed, refused requests).
  uint64_t refused() const { return refusals_.count(); }

 private:
  struct Lease {
    Fd conn;
    uint64_t regionId;
    int pid;
    bool established = false;  // the reply went out: notices may follow it
    bool ended = false;
    ShareEnd endWhy = ShareEnd::Closed;
  };
  void serve();
  void answer(Fd conn, const std::vector<char>& request);
  void refuse(int conn, ShareStatus status, const std::string& why, int pid);

  std::string name_;
  Fd listener_;
  Fd wake_;  // eventfd: stop
  RefusalLog refusals_;
  std::unique_ptr<Acceptor> acceptor_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::map<uint64_t, std::shared_ptr<SharedMemory>> memory_;
  std::vector<std::unique_ptr<Lease>> leases_;
  std::thread thread_;
};

}  // namespace kvcomm::detail
