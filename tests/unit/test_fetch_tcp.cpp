// The TCP fetch transport on one host: its server under hostile clients (malformed, oversize, out-of-range and
// truncated requests cost no descriptor and no memory, and valid clients keep being served), its connection cap,
// negotiation (an older or newer member, a member or server without direct reads, refused clearly within 2 s), the
// served memory's lifetime (released blocks are not read), and faults with real processes (a source killed or
// stopped mid-fetch is reported within 5 s naming the blocks not known to have landed).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "common/socket.hpp"
#include "fetch/transport/negotiation.hpp"
#include "fetch/transport/net/wire.hpp"
#include "fetch/transport/tcp/tcp_server.hpp"
#include "fetch/transport/tcp/tcp_transport.hpp"
#include "kvcomm/bootstrap.hpp"
#include "kvcomm/comm.hpp"
#include "kvcomm/error.hpp"
#include "kvcomm/fetch.hpp"
#include "support/fetch_hostile.hpp"
#include "support/processes.hpp"
#include "support/sanitizers.hpp"
#include "verify/fetch_oracle.hpp"
#include "verify/memory.hpp"

namespace {

using namespace kvcomm::detail;
using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

size_t rssBytes() {
  std::ifstream f("/proc/self/statm");
  size_t pages = 0, resident = 0;
  f >> pages >> resident;
  return resident * static_cast<size_t>(sysconf(_SC_PAGESIZE));
}

// A server over `blocks` 4 KiB blocks of fresh random bytes (a 1 GiB reservation whose first part is written: the
// served layout may claim more blocks than were written, for oversize requests that must be refused unread).
class ServerFixture {
 public:
  static constexpr uint64_t kBlock = 4096;
  ServerFixture(uint64_t blocks, uint64_t written, TcpServerOptions o = {}) {
    base_ = static_cast<char*>(
        mmap(nullptr, kSpan, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0));
    std::mt19937_64 rng(42);
    for (uint64_t i = 0; i < written * kBlock / 8; ++i) reinterpret_cast<uint64_t*>(base_)[i] = rng();
    mem_ = std::make_shared<ServedMemory>();
    mem_->base = base_;
    mem_->regionId = 0xabcdef;
    mem_->groupId = 0x1234;
    mem_->regions = {{0, kBlock, kBlock, blocks}};
    mem_->minBlocks = blocks;
    mem_->blockBytesSum = kBlock;
    mem_->generation = 5;
    mem_->layoutHash = 0x77;
    mem_->backed = {{0, blocks * kBlock}};
    server_ = std::make_unique<TcpServer>(mem_, SockAddr::parse("127.0.0.1:0"), o);
    server_->start();
  }
  ~ServerFixture() {
    server_.reset();
    munmap(base_, kSpan);
  }
  TcpServer& server() { return *server_; }
  ServedMemory& memory() { return *mem_; }
  const char* base() const { return base_; }
  SockAddr addr() const { return server_->endpoint(); }

 private:
  static constexpr size_t kSpan = 1ull << 30;
  char* base_ = nullptr;
  std::shared_ptr<ServedMemory> mem_;
  std::unique_ptr<TcpServer> server_;
};

using kvtest::RawFetchClient;

kvtest::FetchTarget target(ServerFixture& f) {
  kvtest::FetchTarget t;
  t.addr = f.addr();
  t.regionId = 0xabcdef;
  t.groupId = 0x1234;
  t.generation = 5;
  t.layoutHash = 0x77;
  t.minBlocks = f.memory().minBlocks;
  t.blockBytesSum = ServerFixture::kBlock;
  return t;
}

WireRequest req(uint32_t runs, uint64_t generation = 5, uint64_t hash = 0x77) {
  static uint64_t id = 0;
  return WireRequest{kWireRequestMagic, runs, ++id, generation, hash};
}

// Waits until the server has at most `keep` connections left (handlers exit after EOF).
void waitIdle(TcpServer& s, int keep = 0) {
  for (int i = 0; i < 400 && s.stats().open > keep; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
}

// One valid read of `n` blocks from `first`, checked byte for byte.
void expectValidRead(ServerFixture& f, RawFetchClient& c, int64_t first, int64_t n) {
  std::vector<char> got;
  WireReply r = c.request(req(1), {{first, n}}, &got);
  ASSERT_EQ(r.status, 0);
  ASSERT_EQ(got.size(), static_cast<size_t>(n) * ServerFixture::kBlock);
  EXPECT_EQ(std::memcmp(got.data(), f.base() + first * ServerFixture::kBlock, got.size()), 0);
}

TEST(TcpFetchServer, ThousandMalformedRequestsCostNoDescriptorAndNoMemoryAndValidClientsAreServed) {
  TcpServerOptions o;
  o.netTimeoutMs = 300;  // stalled requests are dropped quickly
  o.helloMs = 300;
  ServerFixture f(1 << 18, 256, o);  // layout claims 1 GiB; the first 1 MiB holds data
  std::atomic<bool> stop{false};
  std::atomic<int> validReads{0}, validFailures{0};
  // A well-behaved client keeps reading (and checking) throughout.
  std::thread valid([&] {
    RawFetchClient c(f.addr());
    c.hello(0xabcdef, 0x1234);
    std::mt19937_64 rng(7);
    while (!stop) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));  // leave the (2) cores to the hostile clients
      int64_t first = static_cast<int64_t>(rng() % 200), n = 1 + static_cast<int64_t>(rng() % 40);
      std::vector<char> got;
      WireReply r = c.request(req(1), {{first, n}}, &got);
      if (r.status != 0 || got.size() != static_cast<size_t>(n) * 4096 ||
          std::memcmp(got.data(), f.base() + first * 4096, got.size()) != 0)
        ++validFailures;
      ++validReads;
    }
  });
  const kvtest::FetchTarget t = target(f);
  auto one = [&](int k) { EXPECT_EQ(kvtest::sendMalformed(t, k, 2000), "") << kvtest::malformedKindName(k); };
  // Every kind in turn; a stalled request (dropped after the 300 ms deadline) one time in 100.
  auto kind = [](int i) { return i % 100 == 99 ? 14 : i % 14; };
  for (int i = 0; i < 150; ++i) one(kind(i));  // warm-up: thread stacks, allocator arenas
  waitIdle(f.server(), 1);
  const int fds0 = kvtest::countFds();
  const size_t rss0 = rssBytes();
  const uint64_t rejected0 = f.server().stats().rejected;
  for (int i = 0; i < 1000; ++i) one(kind(i));
  waitIdle(f.server(), 1);
  const int fds1 = kvtest::countFds();  // the valid client still holds its connection, as at the start
  const size_t rss1 = rssBytes();
  stop = true;
  valid.join();
  TcpServer::Stats s = f.server().stats();
  std::fprintf(stderr,
               "1000 malformed requests: fds %d -> %d, RSS %.1f -> %.1f MiB, %d valid reads meanwhile, %llu rejected\n",
               fds0, fds1, rss0 / 1048576.0, rss1 / 1048576.0, validReads.load(),
               static_cast<unsigned long long>(s.rejected - rejected0));
  EXPECT_EQ(fds1, fds0);
  if (kvtest::kSanitizerAllocator)  // freed memory stays in the sanitizer's quarantine; ASan's leak check covers it
    std::fprintf(stderr, "RSS not compared: built with a sanitizer's allocator\n");
  else
    EXPECT_LT(rss1, rss0 + (2u << 20));
  EXPECT_EQ(validFailures.load(), 0);
  EXPECT_GT(validReads.load(), 10);
  EXPECT_GE(s.rejected - rejected0, 1000u * 11 / 14 - 10);  // every answered kind was refused
  EXPECT_LE(s.open, 1);                                     // the valid client's connection only
}

TEST(TcpFetchServer, ConnectionsBeyondTheCapAreRefusedBusy) {
  TcpServerOptions o;
  o.maxConnections = 3;
  ServerFixture f(64, 64, o);
  std::vector<std::unique_ptr<RawFetchClient>> held;
  for (int i = 0; i < 3; ++i) {
    held.push_back(std::make_unique<RawFetchClient>(f.addr()));
    ASSERT_EQ(held.back()->hello(0xabcdef, 0x1234).status, 0);
  }
  RawFetchClient extra(f.addr());
  WireHelloReply r{};
  ASSERT_TRUE(extra.recv(&r, sizeof(r)));  // refused before it says anything
  EXPECT_EQ(r.status, static_cast<int32_t>(WireStatus::Busy));
  EXPECT_NE(std::string(r.reason).find("cap of 3"), std::string::npos) << r.reason;
  EXPECT_TRUE(extra.closedByPeer());
  held.pop_back();
  waitIdle(f.server(), 2);
  RawFetchClient again(f.addr());
  EXPECT_EQ(again.hello(0xabcdef, 0x1234).status, 0);
  expectValidRead(f, again, 0, 8);
  EXPECT_GE(f.server().stats().refused, 1u);
}

TEST(TcpFetchServer, ReleasedOrClosedMemoryIsNeverRead) {
  ServerFixture f(64, 64);
  RawFetchClient c(f.addr());
  ASSERT_EQ(c.hello(0xabcdef, 0x1234).status, 0);
  expectValidRead(f, c, 10, 4);
  f.memory().unback({{12 * 4096, 4096}});  // block 12 released (as SymmetricBuffer::release would announce)
  std::string err;
  EXPECT_EQ(c.request(req(1), {{10, 4}}, nullptr, &err).status, static_cast<int32_t>(WireStatus::NotBacked)) << err;
  EXPECT_NE(err.find("not backed"), std::string::npos) << err;
  expectValidRead(f, c, 13, 4);  // the rest is still served
  f.memory().close();
  EXPECT_EQ(c.request(req(1), {{0, 1}}, nullptr, &err).status, static_cast<int32_t>(WireStatus::Closing));
}

// A fake fetch server that answers every hello with `reply` (or with nothing, or garbage).
class FakeServer {
 public:
  enum Mode { Reply, Silent, Garbage };
  FakeServer(Mode mode, WireHelloReply reply) : mode_(mode), reply_(reply) {
    listener_ = listenTcp(SockAddr::parse("127.0.0.1:0"), &addr_);
    thread_ = std::thread([this] {
      int fd = accept(listener_.get(), nullptr, nullptr);
      if (fd < 0) return;
      Fd conn(fd);
      WireHello h{};
      try {
        recvAll(fd, &h, sizeof(h), deadlineIn(2000), "client");
        if (mode_ == Reply) sendAll(fd, &reply_, sizeof(reply_), deadlineIn(2000), "client");
        if (mode_ == Garbage) {
          char junk[sizeof(WireHelloReply)];
          std::memset(junk, 0x5a, sizeof(junk));
          sendAll(fd, junk, sizeof(junk), deadlineIn(2000), "client");
        }
      } catch (const kvcomm::Error&) {
      }
      while (!done_) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    });
  }
  ~FakeServer() {
    done_ = true;
    ::shutdown(listener_.get(), SHUT_RDWR);
    thread_.join();
  }
  SockAddr addr() const { return addr_; }

 private:
  Mode mode_;
  WireHelloReply reply_;
  Fd listener_;
  SockAddr addr_;
  std::atomic<bool> done_{false};
  std::thread thread_;
};

// A TCP transport of rank 0 whose rank 1 is `server`; one block of 4 KiB from it. Returns the error (or "").
std::string fetchOneBlockFrom(const SockAddr& server, double* seconds) {
  MemberLayouts t;
  t.numRegions = 1;
  t.blockBytesSum = t.minBlockBytes = 4096;
  for (int r = 0; r < 2; ++r) {
    t.views.push_back({0, 4096, 4096, 16});
    t.minBlocks.push_back(16);
    t.hashes.push_back(0x77);
    t.contiguous.push_back(1);
  }
  std::vector<char> local(16 * 4096);
  NetContext c;
  c.local = local.data();
  c.rank = 0;
  c.groupId = 0x1234;
  c.table = &t;
  c.descs.resize(2);
  c.descs[1].head = makeHead(kCapDirect | kCapTcp);
  c.descs[1].tcp = server;
  c.descs[1].regionId = 0xabcdef;
  c.netTimeoutMs = 1000;
  c.connectionsPerSource = 1;
  auto tcp = makeTcpTransport(c);
  PlanOutput plan;
  plan.runs.push_back({1, 0, 0, 1, 0, kvcomm::FetchPath::Host});
  plan.generation = 5;
  auto t0 = Clock::now();
  std::string error;
  try {
    tcp->submit(plan, {0}, nullptr);
  } catch (const kvcomm::Error& e) {
    error = e.what();
  }
  *seconds = secondsSince(t0);
  return error;
}

TEST(TcpFetchNegotiation, OldNonDirectOrForeignServersAreRefusedClearlyWithinTwoSeconds) {
  struct Case {
    const char* name;
    FakeServer::Mode mode;
    WireHelloReply reply;
    std::vector<std::string> want;
  };
  WireHelloReply older = makeHelloReply(WireStatus::Ok, 0, kCapDirect | kCapTcp, 0xabcdef, "");
  WireHelloReply refused = makeHelloReply(WireStatus::VersionMismatch, 9, kCapDirect | kCapTcp, 0xabcdef,
                                          "the server speaks fetch protocol 9 to 9");
  WireHelloReply noDirect = makeHelloReply(WireStatus::Ok, kFetchProtocolVersion, kCapTcp, 0xabcdef, "");
  WireHelloReply otherRegion = makeHelloReply(WireStatus::Ok, kFetchProtocolVersion, kCapDirect | kCapTcp, 0x1, "");
  const Case cases[] = {
      {"older server", FakeServer::Reply, older, {"source rank 1", "fetch protocol version 0", "older"}},
      {"server refusing the version", FakeServer::Reply, refused, {"refused the connection", "version mismatch"}},
      {"server without direct reads", FakeServer::Reply, noDirect, {"does not serve direct"}},
      {"server of another region", FakeServer::Reply, otherRegion, {"stale descriptor"}},
      {"not a kvcomm server", FakeServer::Garbage, older, {"not a kvcomm fetch server"}},
      {"silent server", FakeServer::Silent, older, {"no hello reply"}},
  };
  for (const Case& k : cases) {
    FakeServer s(k.mode, k.reply);
    double sec = 0;
    std::string e = fetchOneBlockFrom(s.addr(), &sec);
    std::fprintf(stderr, "%s: refused after %.3f s: %s\n", k.name, sec, e.c_str());
    EXPECT_LT(sec, 2.0) << k.name;
    for (const std::string& w : k.want) EXPECT_NE(e.find(w), std::string::npos) << k.name << ": " << e;
    EXPECT_NE(e.find("1 destination blocks not known to have landed: 0"), std::string::npos) << e;
  }
}

// Runs `body` in 2 processes forming one group (TCP bootstrap) with `env` set in each.
std::vector<int> group2(const std::function<bool(int, kvcomm::Communicator&)>& body, const char* transport = "tcp") {
  kvcomm::UniqueId id = kvcomm::TcpBootstrap::createUniqueId();
  return kvtest::runProcesses(2, [&](int rank) {
    setenv("KVCOMM_FETCH_TRANSPORT", transport, 1);
    auto comm = kvcomm::Communicator::create(std::make_shared<kvcomm::TcpBootstrap>(id, rank, 2, 20000));
    return body(rank, comm);
  });
}

TEST(TcpFetchNegotiation, AnOlderOrNewerMemberIsRefusedAtCreateOnEveryRankWithinTwoSeconds) {
  for (bool older : {true, false}) {
    auto codes = group2([&](int rank, kvcomm::Communicator& comm) {
      if (rank == 1) {
        fetchTestHooks().overrideVersion = true;
        fetchTestHooks().version = fetchTestHooks().minVersion = older ? 0 : kFetchProtocolVersion + 1;
      }
      auto buf = kvcomm::SymmetricBuffer::create(comm, 1 << 20, 1 << 20, kvcomm::MemoryKind::Host);
      kvcomm::KvLayout l;
      l.regions.push_back({0, 4096, 0, 64});
      auto t0 = Clock::now();
      try {
        kvcomm::Fetcher::create(buf, l);
      } catch (const kvcomm::Error& e) {
        std::string m = e.what();
        std::fprintf(stderr, "rank %d refused after %.3f s: %s\n", rank, secondsSince(t0), m.c_str());
        return e.code() == kvcomm::ErrorCode::Unsupported && m.find("rank 1") != std::string::npos &&
               m.find(older ? "older" : "newer") != std::string::npos && secondsSince(t0) < 2.0;
      }
      return false;
    });
    EXPECT_EQ(codes[0], 0) << (older ? "older" : "newer");
    EXPECT_EQ(codes[1], 0) << (older ? "older" : "newer");
  }
}

TEST(TcpFetchNegotiation, AMemberWithoutDirectReadsIsNeverSilentlyIgnored) {
  auto codes = group2([&](int rank, kvcomm::Communicator& comm) {
    if (rank == 1) fetchTestHooks().withhold = kCapDirect;
    auto buf = kvcomm::SymmetricBuffer::create(comm, 1 << 20, 1 << 20, kvcomm::MemoryKind::Host);
    kvcomm::KvLayout l;
    l.regions.push_back({0, 4096, 0, 64});
    auto f = kvcomm::Fetcher::create(buf, l);
    bool ok = f.transport(rank == 0 ? 1 : 0) ==
              (rank == 0 ? kvcomm::FetchTransportKind::None : kvcomm::FetchTransportKind::Tcp);
    if (rank == 0) {
      std::vector<int64_t> s{1}, d{2};
      auto t0 = Clock::now();
      try {
        f.fetch({{1, s.data(), d.data(), 1, 0}});
        ok = false;
      } catch (const kvcomm::Error& e) {
        std::string m = e.what();
        std::fprintf(stderr, "refused after %.3f s: %s\n", secondsSince(t0), m.c_str());
        ok = ok && e.code() == kvcomm::ErrorCode::Unsupported && m.find("does not serve direct") != std::string::npos &&
             m.find("rank 1") != std::string::npos && secondsSince(t0) < 2.0;
      }
    }
    comm.barrier();
    return ok;
  });
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[1], 0);
}

// The source dies (kill -9) or stops (as behind a link that went down: no reset reaches the requester) in the
// middle of a paced polled fetch over TCP: the requester reports it within 5 s, and every block is either verified
// or named failed.
void sourceFaultMidFetch(bool kill) {
  const uint64_t seed = static_cast<uint64_t>(Clock::now().time_since_epoch().count());
  constexpr size_t kBlock = 1 << 20, kBlocks = 64;
  kvtest::Shared<int> started(1);  // set by the requester once its fetch is under way
  auto codes = group2([&](int rank, kvcomm::Communicator& comm) {
    auto buf = kvcomm::SymmetricBuffer::create(comm, kBlock * kBlocks, kBlock * kBlocks, kvcomm::MemoryKind::Host);
    kvcomm::KvLayout layout = kvtest::fillOneRegion(buf, seed, rank, kBlock, kBlocks);
    auto fetcher = kvcomm::Fetcher::create(buf, layout);
    if (fetcher.transport(1 - rank) != kvcomm::FetchTransportKind::Tcp) return false;
    const int sourcePid = comm.topology().members[1].pid;
    comm.barrier();
    if (rank == 1) {  // timed from the fetch's start, not from this rank's barrier exit
      kvtest::waitFor([&] { return __atomic_load_n(&started[0], __ATOMIC_ACQUIRE) == 1; }, 20000);
      std::this_thread::sleep_for(std::chrono::milliseconds(400));
      raise(kill ? SIGKILL : SIGSTOP);
      return true;  // stopped: the requester kills it once it has checked
    }
    std::vector<int64_t> src, dst;
    for (int64_t b = 0; b < 32; ++b) src.push_back(b), dst.push_back(32 + b);
    kvcomm::FetchOptions o;
    o.maxBytesPerSecond = 16u << 20;  // about 2 s if the source stayed
    auto t0 = Clock::now();
    kvcomm::FetchOperation op = fetcher.start({{1, src.data(), dst.data(), src.size(), 0}}, o);
    __atomic_store_n(&started[0], 1, __ATOMIC_RELEASE);
    kvcomm::FetchStatus s = op.wait(10000);
    double sec = secondsSince(t0);
    std::fprintf(
        stderr,
        "source %s ~0.4 s after the start; requester saw state %d after %.3f s: %s (%zu of %zu bytes, %zu failed)\n",
        kill ? "killed" : "stopped", static_cast<int>(s.state), sec, s.error.c_str(), s.bytesDone, s.bytesTotal,
        s.failedBlocks.size());
    if (!kill) ::kill(sourcePid, SIGKILL);
    if (s.state != kvcomm::FetchState::Failed || sec > 5.0) return false;
    if (s.error.find("source rank 1") == std::string::npos) return false;
    if (s.error.find(kill ? "closed the connection" : "no progress") == std::string::npos) return false;
    if (s.failedBlocks.empty() || s.bytesDone >= s.bytesTotal) return false;
    std::set<int64_t> failed(s.failedBlocks.begin(), s.failedBlocks.end());
    size_t verified = 0;
    for (size_t i = 0; i < dst.size(); ++i) {
      if (failed.count(dst[i])) continue;
      auto want = kvtest::blockContent(seed, 1, 0, src[i], kBlock);
      if (std::memcmp(static_cast<char*>(buf.local()) + dst[i] * kBlock, want.data(), kBlock) != 0) return false;
      ++verified;
    }
    return verified * kBlock == s.bytesDone && verified + failed.size() == dst.size();
  });
  EXPECT_EQ(codes[0], 0) << "requester";
  EXPECT_EQ(codes[1], -SIGKILL) << "source";
}

TEST(TcpFetchFaults, SourceKilledMidFetchIsReportedWithinFiveSeconds) {
  sourceFaultMidFetch(true);
}

TEST(TcpFetchFaults, SourceThatStopsAnsweringIsReportedWithinFiveSeconds) {
  sourceFaultMidFetch(false);
}

TEST(TcpFetch, DestroyingAPolledFetchCancelsItAndTheFetcherKeepsWorking) {
  auto codes = group2([&](int rank, kvcomm::Communicator& comm) {
    constexpr size_t kBlock = 1 << 20;
    kvcomm::KvLayout layout;
    layout.regions.push_back({0, kBlock, 0, 32});
    auto buf = kvcomm::SymmetricBuffer::create(comm, 32 * kBlock, 32 * kBlock, kvcomm::MemoryKind::Host);
    std::memset(buf.local(), rank + 1, 32 * kBlock);
    auto f = kvcomm::Fetcher::create(buf, layout);
    comm.barrier();
    bool ok = true;
    if (rank == 0) {
      std::vector<int64_t> src, dst;
      for (int64_t b = 0; b < 16; ++b) src.push_back(b), dst.push_back(16 + b);
      kvcomm::FetchOptions o;
      o.maxBytesPerSecond = 8u << 20;
      auto t0 = Clock::now();
      {
        kvcomm::FetchOperation op = f.start({{1, src.data(), dst.data(), src.size(), 0}}, o);
        ok = op.wait(100).state == kvcomm::FetchState::InProgress;
      }  // destroyed mid-flight: returns once nothing can write any more
      ok = ok && secondsSince(t0) < 1.5;
      std::memset(static_cast<char*>(buf.local()) + 16 * kBlock, 0, 16 * kBlock);
      f.fetch({{1, src.data(), dst.data(), src.size(), 0}});
      for (size_t i = 16 * kBlock; i < 32 * kBlock; ++i) ok = ok && static_cast<char*>(buf.local())[i] == 2;
    }
    comm.barrier();
    return ok;
  });
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[1], 0);
}

}  // namespace
