// The TCP server of registered memory: a Fetcher's (one registration: reads of this rank's memory by members on
// other hosts) or an endpoint's (every registration of the process, each behind its capability: reads and writes by
// peers that hold its metadata). The wire protocol is in fetch/transport/net/wire.hpp. It runs on threads of its own,
// never on the communicator's mesh.
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
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/fd.hpp"
#include "common/socket.hpp"
#include "fetch/device_copy.hpp"
#include "fetch/transport/net/segments.hpp"
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

  bool writable = false;  // serves writes (endpoint registrations; a Fetcher serves reads only)
  /// Control requests (endpoints: the RDMA connection of a pair), set before the memory is served: answers `body`
  /// with reply bytes (Ok), or a status and *why. What it puts in *hold lives as long as the connection that asked
  /// (the lease of what it set up). Unset: every control request is Unsupported.
  std::function<WireStatus(uint32_t kind, const uint8_t* body, size_t bytes, std::vector<uint8_t>* reply,
                           std::shared_ptr<void>* hold, std::string* why)>
      control;
  /// Stale requests and closed memory, as the requester reads it.
  std::string staleAdvice = "call Fetcher::refresh() on every member";
  std::string closedReason = "the fetcher serving this memory is closing";

  mutable std::shared_mutex mu;
  uint64_t generation = 0;
  uint64_t layoutHash = 0;
  std::vector<Range> backed;  // sorted, disjoint
  bool open = true;
  bool needsCapability = false;  // a hello must carry `capability` (endpoint registrations)
  WireCapability capability{};

  /// The snapshot as validateRequest() takes it (hold `mu`).
  ServedView view() const;
  /// Removes `ranges` from what may be read; returns once no read of them is in flight.
  void unback(const std::vector<Range>& ranges);
  /// Serves nothing more; returns once no read is in flight.
  void close();
};

/// The registrations one server serves, by region id (a hello names one).
class ServedDirectory {
 public:
  /// `endpointId`: the endpoint whose registrations it serves (0: a Fetcher's, one registration).
  explicit ServedDirectory(uint64_t endpointId = 0) : endpointId_(endpointId) {}
  uint64_t endpointId() const { return endpointId_; }
  void add(std::shared_ptr<ServedMemory> memory);
  /// Later hellos naming it are refused; connections that serve it already see it closed once its owner closes it.
  void remove(uint64_t regionId);
  std::shared_ptr<ServedMemory> find(uint64_t regionId) const;
  /// The id a Busy refusal names (the only registration of a Fetcher's server; 0 for several).
  uint64_t soleId() const;

 private:
  const uint64_t endpointId_;
  mutable std::mutex mu_;
  std::map<uint64_t, std::shared_ptr<ServedMemory>> map_;
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
  /// Listens on `addr` (port 0: an ephemeral port) for the registrations of `directory`. Throws SystemError when it
  /// cannot.
  TcpServer(std::shared_ptr<ServedDirectory> directory, const SockAddr& addr, const TcpServerOptions& options);
  /// One registration (a Fetcher's).
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
    uint64_t served = 0;    // reads answered with data
    uint64_t written = 0;   // writes received into memory
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
  /// Receives a write's payload into `mem` (held under its shared lock). False when the connection failed.
  bool receiveWrite(int fd, const ServedMemory& mem, SegmentCursor& cursor, uint64_t payload,
                    std::unique_ptr<HostStaging>& staging);
  /// Answers a control request (its runs read) through `mem`'s handler; what the handler set up joins `holds`.
  /// False when the connection cannot go on.
  bool serveControl(int fd, const ServedMemory& mem, const WireRequest& req, const WireRun* runs,
                    std::vector<std::shared_ptr<void>>& holds);
  void reap(bool all);

  std::shared_ptr<ServedDirectory> dir_;
  TcpServerOptions opt_;
  Fd listener_;
  Fd wakeRead_, wakeWrite_;
  SockAddr endpoint_;
  std::atomic<bool> stop_{false};
  std::thread acceptor_;
  std::mutex connsMu_;
  std::list<std::unique_ptr<Conn>> conns_;
  std::atomic<uint64_t> accepted_{0}, refused_{0}, served_{0}, written_{0}, rejected_{0};
  std::atomic<int> open_{0};
};

}  // namespace kvcomm::detail
