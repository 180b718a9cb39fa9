// The TCP server of one registration: serves reads of this rank's registered memory to members on other hosts
// (the wire protocol is in fetch/transport/net/wire.hpp). It runs on threads of its own, never on the communicator's
// mesh.
//
// Threads: one acceptor (polls the listener and a wake-up pipe) and one handler per connection, at most
// maxConnections at a time; beyond the cap a connection gets a Busy refusal and is closed.
// Checks: every request is decoded into fixed-size storage and re-validated against the ServedMemory snapshot before
// memory is touched. A header that is not a request gets an error reply and the connection is closed (the stream
// cannot be trusted after it); a well-formed request that fails validation (stale generation, another layout, ids
// out of range, blocks not backed, a reply too large) gets an error reply and the connection stays. No request
// allocates.
// Deadlines: the hello within helloMs of accept; a request's header and runs within netTimeoutMs of their first
// byte; every send makes progress within netTimeoutMs; a connection idle for idleMs is closed (requesters reconnect).
// Lifetimes: bytes are read under the snapshot's shared lock, so release()/close() of the buffer (exclusive lock)
// wait until no read of the memory is in flight, and no later request reads it.
#pragma once

#include <atomic>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <thread>
#include <vector>

#include "common/fd.hpp"
#include "common/socket.hpp"
#include "fetch/transport/net/wire.hpp"
#include "kvcomm/symm.hpp"

namespace kvcomm::detail {

/// This rank's registered memory as the network servers see it. Fields below `mu` change only under its exclusive
/// lock; servers read them (and the memory) under its shared lock.
struct ServedMemory {
  char* base = nullptr;
  MemoryKind kind = MemoryKind::Host;
  int device = -1;
  uint64_t regionId = 0;
  uint64_t groupId = 0;
  std::vector<FetchRegionView> regions;  // this rank's layout
  uint64_t minBlocks = 0;
  uint64_t blockBytesSum = 0;

  mutable std::shared_mutex mu;
  uint64_t generation = 0;
  uint64_t layoutHash = 0;
  std::vector<Range> backed;  // sorted, disjoint
  bool open = true;

  /// The snapshot as validateRequest() takes it (hold `mu`).
  ServedView view() const;
  /// Removes `ranges` from what may be read; returns once no read of them is in flight.
  void unback(const std::vector<Range>& ranges);
  /// Serves nothing more; returns once no read is in flight.
  void close();
};

struct TcpServerOptions {
  int maxConnections = 64;
  int64_t netTimeoutMs = 3000;
  int64_t helloMs = 1000;
  int64_t idleMs = 60000;
  size_t stagingSlotBytes = 4u << 20;  // CUDA memory: two pinned slots per connection
};

class TcpServer {
 public:
  /// Listens on `addr` (port 0: an ephemeral port). Throws SystemError when it cannot.
  TcpServer(std::shared_ptr<ServedMemory> memory, const SockAddr& addr, const TcpServerOptions& options);
  /// Stops accepting, ends every connection (in-flight replies are cut), joins every thread.
  ~TcpServer();
  TcpServer(const TcpServer&) = delete;
  TcpServer& operator=(const TcpServer&) = delete;

  const SockAddr& endpoint() const { return endpoint_; }
  /// Starts the acceptor thread (idempotent).
  void start();

  struct Stats {
    uint64_t accepted = 0;  // connections handed to a handler
    uint64_t refused = 0;   // connections refused at the cap
    uint64_t served = 0;    // requests answered with data
    uint64_t rejected = 0;  // requests or hellos answered with an error
    int open = 0;           // handlers running
  };
  Stats stats() const;

 private:
  struct Conn {
    Fd fd;
    std::thread thread;
    std::atomic<bool> done{false};
  };
  void acceptLoop();
  void serve(Conn& c);
  void reap(bool all);

  std::shared_ptr<ServedMemory> mem_;
  TcpServerOptions opt_;
  Fd listener_;
  Fd wakeRead_, wakeWrite_;
  SockAddr endpoint_;
  std::atomic<bool> stop_{false};
  std::thread acceptor_;
  std::mutex connsMu_;
  std::list<std::unique_ptr<Conn>> conns_;
  std::atomic<uint64_t> accepted_{0}, refused_{0}, served_{0}, rejected_{0};
  std::atomic<int> open_{0};
};

}  // namespace kvcomm::detail
