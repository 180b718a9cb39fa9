#include "fetch/transport/tcp/tcp_server.hpp"

#include <fcntl.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "common/check.hpp"
#include "common/log.hpp"
#include "fetch/device_copy.hpp"
#include "fetch/transport/negotiation.hpp"
#include "fetch/transport/net/net_io.hpp"
#include "fetch/transport/net/staged_io.hpp"

namespace kvcomm::detail {

ServedView ServedMemory::view() const {
  ServedView v;
  v.generation = generation;
  v.layoutHash = layoutHash;
  v.regions = regions.data();
  v.numRegions = regions.size();
  v.minBlocks = minBlocks;
  v.blockBytesSum = blockBytesSum;
  v.backed = backed.data();
  v.numBacked = backed.size();
  v.staleAdvice = staleAdvice.c_str();
  return v;
}

void ServedDirectory::add(std::shared_ptr<ServedMemory> memory) {
  std::lock_guard<std::mutex> lock(mu_);
  map_[memory->regionId] = std::move(memory);
}

void ServedDirectory::remove(uint64_t regionId) {
  std::lock_guard<std::mutex> lock(mu_);
  map_.erase(regionId);
}

std::shared_ptr<ServedMemory> ServedDirectory::find(uint64_t regionId) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = map_.find(regionId);
  return it == map_.end() ? nullptr : it->second;
}

uint64_t ServedDirectory::soleId() const {
  std::lock_guard<std::mutex> lock(mu_);
  return map_.size() == 1 ? map_.begin()->first : 0;
}

void ServedMemory::unback(const std::vector<Range>& ranges) {
  std::unique_lock<std::shared_mutex> lock(mu);  // waits for every read in flight
  std::vector<Range> keep;
  for (const Range& b : backed) {
    // Subtract every released range from b.
    std::vector<Range> parts{b};
    for (const Range& r : ranges) {
      std::vector<Range> next;
      for (const Range& p : parts) {
        size_t lo = std::max(p.offset, r.offset), hi = std::min(p.offset + p.bytes, r.offset + r.bytes);
        if (lo >= hi) {
          next.push_back(p);
          continue;
        }
        if (p.offset < lo) next.push_back({p.offset, lo - p.offset});
        if (hi < p.offset + p.bytes) next.push_back({hi, p.offset + p.bytes - hi});
      }
      parts.swap(next);
    }
    keep.insert(keep.end(), parts.begin(), parts.end());
  }
  backed.swap(keep);
}

void ServedMemory::close() {
  std::unique_lock<std::shared_mutex> lock(mu);
  open = false;
  backed.clear();
}

namespace {

std::shared_ptr<ServedDirectory> directoryOf(std::shared_ptr<ServedMemory> memory) {
  auto d = std::make_shared<ServedDirectory>();
  d->add(std::move(memory));
  return d;
}

}  // namespace

TcpServer::TcpServer(std::shared_ptr<ServedMemory> memory, const SockAddr& addr, const TcpServerOptions& options)
    : TcpServer(directoryOf(std::move(memory)), addr, options) {}

TcpServer::TcpServer(std::shared_ptr<ServedDirectory> directory, const SockAddr& addr, const TcpServerOptions& options)
    : dir_(std::move(directory)), opt_(options) {
  listener_ = listenTcp(addr, &endpoint_);
  int p[2];
  KVCOMM_CHECK_SYS(pipe2(p, O_CLOEXEC | O_NONBLOCK));
  wakeRead_.reset(p[0]);
  wakeWrite_.reset(p[1]);
  setNonBlocking(listener_.get(), true);
}

TcpServer::~TcpServer() {
  stop_ = true;
  if (wakeWrite_) {
    char c = 1;
    if (::write(wakeWrite_.get(), &c, 1) < 0) {
      // The acceptor also polls its stop flag: a lost wake-up only delays the join by one poll period.
    }
  }
  if (acceptor_.joinable()) acceptor_.join();
  {
    std::lock_guard<std::mutex> lock(connsMu_);
    for (auto& c : conns_)
      if (c->fd) ::shutdown(c->fd.get(), SHUT_RDWR);  // cuts blocking I/O; handlers see stop_ too
  }
  reap(true);
}

void TcpServer::start() {
  if (!acceptor_.joinable()) acceptor_ = std::thread([this] { acceptLoop(); });
}

TcpServer::Stats TcpServer::stats() const {
  Stats s;
  s.accepted = accepted_;
  s.refused = refused_;
  s.served = served_;
  s.written = written_;
  s.rejected = rejected_;
  s.open = open_;
  return s;
}

void TcpServer::reap(bool all) {
  std::list<std::unique_ptr<Conn>> finished;
  {
    std::lock_guard<std::mutex> lock(connsMu_);
    for (auto it = conns_.begin(); it != conns_.end();) {
      if (all || (*it)->done) {
        finished.push_back(std::move(*it));
        it = conns_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& c : finished)
    if (c->thread.joinable()) c->thread.join();
}

void TcpServer::acceptLoop() {
  bool exhaustedLogged = false;
  while (!stop_) {
    pollfd p[2] = {{listener_.get(), POLLIN, 0}, {wakeRead_.get(), POLLIN, 0}};
    int rc = poll(p, 2, 200);
    reap(false);
    if (stop_) break;
    if (rc <= 0 || !(p[0].revents & POLLIN)) continue;
    int fd = accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        if (!exhaustedLogged) KVCOMM_WARN("fetch server: accept: ", std::strerror(errno), " (retrying)");
        exhaustedLogged = true;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));  // no spin while descriptors are exhausted
      }
      continue;
    }
    Fd conn(fd);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (open_.load() >= opt_.maxConnections) {
      // Best effort: the refusal fits any socket buffer; a peer that sent nothing yet still reads it.
      WireHelloReply r = makeHelloReply(WireStatus::Busy, kFetchProtocolVersion, 0, dir_->soleId(),
                                        cat("the fetch server is at its cap of ", opt_.maxConnections, " connections"));
      (void)::send(fd, &r, sizeof(r), MSG_NOSIGNAL | MSG_DONTWAIT);
      ++refused_;
      continue;
    }
    auto c = std::make_unique<Conn>();
    c->fd = std::move(conn);
    Conn* raw = c.get();
    ++open_;
    ++accepted_;
    std::lock_guard<std::mutex> lock(connsMu_);
    conns_.push_back(std::move(c));
    raw->thread = std::thread([this, raw] {
      try {
        serve(*raw);
      } catch (const std::exception& e) {
        KVCOMM_WARN("fetch server: connection ended: ", e.what());
      }
      {
        std::lock_guard<std::mutex> lock(connsMu_);  // the destructor shuts descriptors down under this lock
        raw->fd.reset();                             // closed now, not when the acceptor reaps the thread
      }
      --open_;
      raw->done = true;
    });
  }
}

namespace {

bool sendStruct(int fd, const void* p, size_t n, int64_t stallMs, const std::atomic<bool>* stop) {
  iovec v{const_cast<void*>(p), n};
  int err = 0;
  return writeAll(fd, &v, 1, stallMs, stop, &err) == IoResult::Ok;
}

bool sendError(int fd, WireStatus status, uint64_t requestId, const std::string& why, int64_t stallMs,
               const std::atomic<bool>* stop) {
  WireReply r{};
  r.magic = kWireReplyMagic;
  r.status = static_cast<int32_t>(status);
  r.requestId = requestId;
  r.errorBytes = static_cast<uint32_t>(std::min<size_t>(why.size(), kMaxWireErrorText));
  iovec v[2] = {{&r, sizeof(r)}, {const_cast<char*>(why.data()), r.errorBytes}};
  int err = 0;
  return writeAll(fd, v, 2, stallMs, stop, &err) == IoResult::Ok;
}

}  // namespace

void TcpServer::serve(Conn& c) {
  const int fd = c.fd.get();
  const int64_t stall = opt_.netTimeoutMs;
  int err = 0;
  // Phase 1: the hello (and the capability it announces).
  WireHello hello{};
  if (readExact(fd, &hello, sizeof(hello), opt_.helloMs, opt_.helloMs, &stop_, &err) != IoResult::Ok) return;
  std::string why = decodeHello(&hello, sizeof(hello), &hello);
  WireCapability presented{};
  const bool auth = why.empty() && (hello.caps & kCapAuth);
  if (auth && readExact(fd, &presented, sizeof(presented), opt_.helloMs, opt_.helloMs, &stop_, &err) != IoResult::Ok)
    return;
  std::shared_ptr<ServedMemory> mem = why.empty() ? dir_->find(hello.regionId) : nullptr;
  WireStatus refusal = WireStatus::Ok;
  uint16_t version = 0;
  if (!why.empty()) {
    refusal = WireStatus::Malformed;
  } else if ((version = agreeVersion(kFetchProtocolVersion, kFetchMinProtocolVersion, hello.version,
                                     hello.minVersion)) == 0) {
    refusal = WireStatus::VersionMismatch;
    why = cat("the server speaks fetch protocol ", kFetchMinProtocolVersion, " to ", kFetchProtocolVersion,
              ", the requester ", hello.minVersion, " to ", hello.version);
  } else if (!mem || hello.groupId != mem->groupId) {
    refusal = WireStatus::WrongRegion;
    const uint64_t owner = dir_->endpointId();
    if (!owner)
      why = cat("this server serves region 0x", std::hex, dir_->soleId(), " of group 0x",
                mem ? mem->groupId : hello.groupId, ", not region 0x", hello.regionId, " of group 0x", hello.groupId,
                " (a stale descriptor?)");
    else if (hello.groupId != owner)
      why = cat("endpoint 0x", std::hex, hello.groupId, " restarted (now 0x", owner,
                "): ask the peer for its new metadata");  // fits the reply's 112 bytes
    else
      why = cat("registration 0x", std::hex, hello.regionId, " was unregistered by its owner");
    mem.reset();
  } else {
    std::shared_lock<std::shared_mutex> lock(mem->mu);
    // Constant time: the comparison says nothing about how much of a guess was right.
    uint8_t diff = 0;
    for (size_t i = 0; i < sizeof(presented.bytes); ++i) diff |= presented.bytes[i] ^ mem->capability.bytes[i];
    if (mem->needsCapability && (!auth || diff != 0)) {
      refusal = WireStatus::Unauthorized;
      why = auth ? "the capability does not match (revoked or rotated by the owner, or not its own)"
                 : "this registration needs its capability (from the owner's metadata)";
      mem.reset();  // refused before anything about the memory is said
    }
  }
  const uint32_t caps =
      ((kCapDirect | kCapTcp) | (mem && mem->writable ? uint32_t{kCapWrite} : 0u)) & ~fetchTestHooks().withhold;
  WireHelloReply reply = makeHelloReply(refusal, refusal == WireStatus::Ok ? version : kFetchProtocolVersion, caps,
                                        mem ? mem->regionId : 0, why);
  if (!sendStruct(fd, &reply, sizeof(reply), stall, &stop_) || refusal != WireStatus::Ok) {
    if (refusal != WireStatus::Ok) ++rejected_;
    return;
  }

  // Phase 2: requests, one at a time. Storage is fixed: a request costs no allocation.
  WireRun runs[kMaxRunsPerRequest];
  std::unique_ptr<HostStaging> staging;      // CUDA memory, made on first use on this thread
  std::vector<std::shared_ptr<void>> holds;  // what control requests set up: released when the connection ends
  for (;;) {
    IoResult idle = waitReadable(fd, opt_.idleMs, &stop_);
    if (idle == IoResult::Timeout && !holds.empty()) continue;  // a lease: idle for as long as the peer keeps it
    if (idle != IoResult::Ok) return;                           // idle too long, or stopping
    WireRequest req{};
    if (readExact(fd, &req, sizeof(req), stall, stall, &stop_, &err) != IoResult::Ok) return;  // EOF or truncated
    why = decodeRequest(&req, sizeof(req), &req);
    if (!why.empty()) {
      ++rejected_;
      const bool known =
          req.magic == kWireRequestMagic || req.magic == kWireWriteMagic || req.magic == kWireControlMagic;
      WireStatus s = known && req.numRuns > kMaxRunsPerRequest ? WireStatus::Oversize : WireStatus::Malformed;
      sendError(fd, s, req.requestId, why, stall, &stop_);
      return;  // the stream cannot be trusted after a header that is not a request
    }
    if (readExact(fd, runs, req.numRuns * sizeof(WireRun), stall, stall, &stop_, &err) != IoResult::Ok) return;
    if (req.magic == kWireControlMagic) {
      if (!serveControl(fd, *mem, req, runs, holds)) return;
      continue;
    }
    const bool write = req.magic == kWireWriteMagic;
    std::shared_lock<std::shared_mutex> lock(mem->mu);
    uint64_t payload = 0;
    WireStatus st = WireStatus::Closing;
    if (!mem->open) {
      why = mem->closedReason;
    } else if (write && !mem->writable) {
      st = WireStatus::ReadOnly;
      why = "this memory is served for reads only";
    } else {
      st = validateRequest(req, runs, mem->view(), &payload, &why);
    }
    if (st != WireStatus::Ok) {
      lock.unlock();
      ++rejected_;
      // A refused write's payload is still on the stream: the connection cannot go on.
      if (!sendError(fd, st, req.requestId, why, stall, &stop_) || st == WireStatus::Closing || write) return;
      continue;
    }
    WireReply head{};
    head.magic = kWireReplyMagic;
    head.requestId = req.requestId;
    head.payloadBytes = payload;
    SegmentCursor cursor(mem->regions.data(), mem->regions.size(), runs, req.numRuns);
    if (write) {
      if (!receiveWrite(fd, *mem, cursor, payload, staging)) return;
      lock.unlock();  // the bytes are in memory (CUDA: the copies finished) before the reply says so
      if (!sendStruct(fd, &head, sizeof(head), stall, &stop_)) return;
      ++written_;
      continue;
    }
    if (mem->kind == MemoryKind::Host) {
      // The header leaves with the first segments: one system call (and one packet) for a small reply.
      if (sendSegments(fd, cursor, mem->base, payload, stall, &stop_, &err, &head, sizeof(head)) != IoResult::Ok)
        return;
    } else {
      if (!staging) staging = makeHostStaging(mem->device, opt_.stagingSlotBytes, 2);
      if (!sendStruct(fd, &head, sizeof(head), stall, &stop_)) return;
      if (sendStaged(fd, cursor, mem->base, payload, *staging, stall, &stop_, &err) != IoResult::Ok) return;
    }
    ++served_;
  }
}

bool TcpServer::serveControl(int fd, const ServedMemory& mem, const WireRequest& req, const WireRun* runs,
                             std::vector<std::shared_ptr<void>>& holds) {
  const int64_t stall = opt_.netTimeoutMs;
  WireControlHead head{};
  const uint8_t* body = nullptr;
  std::string why = decodeControl(runs, req.numRuns, &head, &body);
  if (!why.empty()) {
    ++rejected_;
    sendError(fd, WireStatus::Malformed, req.requestId, why, stall, &stop_);
    return false;
  }
  std::vector<uint8_t> reply;
  std::shared_ptr<void> hold;
  WireStatus st = WireStatus::Closing;
  bool sent = false;
  {
    // Checked as a read is (open, generation), answered and replied to under the lock: close() waits for the reply
    // too (a notification the handler delivered is acknowledged before the owner can unregister or close under it:
    // else the sender, its acknowledgement lost, resends to a closed endpoint and cannot tell it arrived).
    std::shared_lock<std::shared_mutex> lock(mem.mu);
    if (!mem.open) {
      why = mem.closedReason;
    } else if (req.generation != mem.generation) {
      st = WireStatus::Stale;
      why = cat("the request names generation ", req.generation, ", the server has ", mem.generation, ": ",
                mem.staleAdvice);
    } else if (!mem.control) {
      st = WireStatus::Unsupported;
      why = "this server answers no control requests";
    } else {
      try {
        st = mem.control(head.kind, body, head.bytes, &reply, &hold, &why);
      } catch (const std::exception& e) {
        st = WireStatus::Internal;
        why = e.what();
      }
    }
    if (st == WireStatus::Ok) {
      if (int ms = fetchTestHooks().controlReplyDelayMs) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
      WireReply r{};
      r.magic = kWireReplyMagic;
      r.requestId = req.requestId;
      r.payloadBytes = reply.size();
      iovec v[2] = {{&r, sizeof(r)}, {reply.data(), reply.size()}};
      int err = 0;
      sent = writeAll(fd, v, 2, stall, &stop_, &err) == IoResult::Ok;
    }
  }
  if (st != WireStatus::Ok) {
    ++rejected_;
    return sendError(fd, st, req.requestId, why, stall, &stop_) && st != WireStatus::Closing;
  }
  if (hold) holds.push_back(std::move(hold));
  return sent;
}

bool TcpServer::receiveWrite(int fd, const ServedMemory& mem, SegmentCursor& cursor, uint64_t payload,
                             std::unique_ptr<HostStaging>& staging) {
  const int64_t stall = opt_.netTimeoutMs;
  int err = 0;
  if (mem.kind == MemoryKind::Host) {
    uint64_t got = 0;
    return recvSegments(fd, cursor, mem.base, payload, stall, &stop_, &err, &got) == IoResult::Ok;
  }
  // CUDA: socket -> slot k while slot k^1 is copied to the device; every copy has finished when this returns.
  if (!staging) staging = makeHostStaging(mem.device, opt_.stagingSlotBytes, 2);
  uint64_t left = payload;
  for (int k = 0; left > 0; k ^= 1) {
    staging->waitSlot(k);
    const size_t n = static_cast<size_t>(std::min<uint64_t>(left, staging->slotBytes()));
    if (readExact(fd, staging->slot(k), n, stall, stall, &stop_, &err) != IoResult::Ok) {
      staging->waitSlot(k ^ 1);
      return false;
    }
    std::vector<CopyDesc> copies;
    size_t at = 0;
    uint64_t off = 0, len = 0;
    while (at < n && cursor.take(n - at, &off, &len)) {
      copies.push_back({mem.base + off, staging->slot(k) + at, static_cast<size_t>(len), 1, 0, 0});
      at += len;
    }
    staging->toDevice(k, copies, staging->ownStream());
    left -= n;
  }
  staging->waitSlot(0);
  staging->waitSlot(1);
  return true;
}

}  // namespace kvcomm::detail
