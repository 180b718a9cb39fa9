// Arena faults between real processes, on each memory kind: kill -9 of an importer holding a lease and an operation
// (reclaimed within 5 s, the owner's descriptors and mappings back to where they were), kill -9 in the middle of an
// import, kill -9 of an owner while the importer reads through a pin (importer calls fail within 5 s, the mapped
// bytes stay readable until close), free/shrink while busy (Busy, never a use after free), and 1,000
// register/import/close cycles with flat descriptor and mapping counts.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <random>
#include <set>
#include <thread>

#include "arena/exchange.hpp"
#include "arena/harness.hpp"
#include "kvcomm/arena.hpp"
#include "kvcomm/error.hpp"

namespace {

using kvcomm::Arena;
using kvcomm::ArenaCapability;
using kvcomm::ArenaImport;
using kvcomm::ArenaPin;
using kvcomm::ArenaServer;
using kvcomm::ArenaSession;
using kvcomm::MemoryKind;
using namespace kvtest::arena;
using Clock = std::chrono::steady_clock;

class ArenaFaults : public ::testing::TestWithParam<MemoryKind> {
 protected:
  void SetUp() override {
    if (GetParam() == MemoryKind::Cuda && gpuCount() == 0) GTEST_SKIP() << noGpuReason();
  }
  MemoryKind kind() const { return GetParam(); }
  int clientDevice() const { return gpuCount() > 1 ? 1 : 0; }
};

std::string kindParamName(const ::testing::TestParamInfo<MemoryKind>& info) {
  return kindName(info.param);
}

// Counts of this process's resources, compared after the fault: descriptors, /proc/self/maps lines, free GPU memory.
struct Counts {
  int fds = 0, maps = 0;
  size_t gpuFree = 0;
  std::vector<std::string> lines;  // /proc/self/maps, to show what differs
  static Counts now(MemoryKind k) {
    Counts c;
    c.gpuFree = deviceFreeBytes(k);  // first: the runtime's first call may open files and map memory of its own
    c.fds = kvtest::arena::fds();
    c.maps = mappings();
    std::ifstream f("/proc/self/maps");
    for (std::string l; std::getline(f, l);) c.lines.push_back(l);
    return c;
  }
};

// Waits (up to 2 s: a session thread may still be closing a socket) for the counts to come back to `base`.
bool backTo(const Counts& base, MemoryKind k, const char* who, double reclaimSec) {
  Counts c = Counts::now(k);
  waitUntil(
      [&] {
        c = Counts::now(k);
        return c.fds == base.fds && c.maps == base.maps;
      },
      2000);
  bool gpuOk = k != MemoryKind::Cuda || c.gpuFree + (2u << 20) >= base.gpuFree;
  if (c.maps != base.maps) {
    std::set<std::string> before(base.lines.begin(), base.lines.end()), after(c.lines.begin(), c.lines.end());
    for (const auto& l : before)
      if (!after.count(l)) std::fprintf(stderr, "  only before: %s\n", l.c_str());
    for (const auto& l : after)
      if (!before.count(l)) std::fprintf(stderr, "  only after:  %s\n", l.c_str());
  }
  std::fprintf(stderr, "[arena] %s: reclaimed after %.3f s; descriptors %d -> %d, mappings %d -> %d%s\n", who,
               reclaimSec, base.fds, c.fds, base.maps, c.maps,
               k == MemoryKind::Cuda ? (", GPU free " + std::to_string(base.gpuFree >> 20) + " -> " +
                                        std::to_string(c.gpuFree >> 20) + " MiB")
                                           .c_str()
                                     : "");
  return c.fds == base.fds && c.maps == base.maps && gpuOk;
}

template <typename F>
bool throwsCode(F&& f, kvcomm::ErrorCode code, const std::string& part, const char* what) {
  try {
    f();
  } catch (const kvcomm::Error& e) {
    std::string m = e.what();
    std::fprintf(stderr, "[pid %d] %s -> %s: %s\n", getpid(), what, kvcomm::errorCodeName(e.code()), m.c_str());
    return e.code() == code && m.find(part) != std::string::npos;
  }
  std::fprintf(stderr, "[pid %d] %s: no error\n", getpid(), what);
  return false;
}

// Runs both; `survivor` must exit 0 and `victim` must end killed by SIGKILL (the survivor kills it).
bool survivorAndVictim(const std::function<bool()>& survivor, const std::function<bool()>& victim) {
  pid_t s = spawn(survivor), v = spawn(victim);
  int vs = reap(v, 60), ss = reap(s, 60);
  if (ss != 0 || vs != -SIGKILL) {
    std::fprintf(stderr, "survivor exit %d, victim exit %d (expected 0 and %d)\n", ss, vs, -SIGKILL);
    return false;
  }
  return true;
}

TEST_P(ArenaFaults, KilledImporterIsReclaimedWithinFiveSecondsWhileAnOperationIsInFlight) {
  const std::string addr = freshAddress();
  MemoryKind k = kind();
  kvcomm::KvLayout layout = testLayout(16);
  Gate measured;
  auto server = [&] {
    if (!useDevice(k, 0)) return false;
    ArenaServer srv = ArenaServer::listen(addr);
    {
      ArenaSession warm = srv.accept(20000);  // one full exchange first: threads and allocators settle
      if (!ownerSide(warm, k, layout, 1)) return false;
      warm.close();
    }
    Counts base = Counts::now(k);
    measured.pass();
    ArenaSession s = srv.accept(20000);
    kvcomm::ArenaOptions o;
    o.kind = k;
    Arena a = Arena::create(layout, o);
    auto img = ownerImage(layout, a.bytes(), 2);
    a.write(0, img.data(), img.size());
    ArenaPin op = a.pin(0, a.bytes());  // the owner's own operation in flight (say, a copy to the host tier)
    sendCapability(s, s.offer(a));
    if (recvText(s) != "holding") return false;
    int victim = s.peerPid();
    bool ok = a.leases() == 1 && a.importers() == std::vector<int>{victim};
    auto t0 = Clock::now();
    kill(victim, SIGKILL);
    ok = waitUntil([&] { return a.leases() == 0; }, 5000) && ok;
    double reclaim = since(t0);
    ok = reclaim < 5.0 && waitUntil([&] { return !s.alive(); }, 5000) && ok;
    // The importer is gone, but this process's own operation still holds the memory.
    ok =
        throwsCode([&] { a.free(); }, kvcomm::ErrorCode::Busy, "1 operation", "free with an operation in flight") && ok;
    ok = compare(a, img).empty() && ok;  // untouched, still mapped
    op.release();
    a.free();
    ok = a.data() == nullptr && ok;
    s = ArenaSession();
    return backTo(base, k, "kill -9 of an importer holding a lease (owner's pin in flight)", reclaim) && ok;
  };
  auto client = [&] {
    if (!useDevice(k, clientDevice())) return false;
    {
      ArenaSession warm = ArenaSession::connect(addr);
      if (!importerSide(warm, layout, 1)) return false;
    }
    if (!measured.wait()) return false;
    ArenaSession s = ArenaSession::connect(addr);
    ArenaImport imp = s.import(recvCapability(s));
    ArenaPin op = imp.pin(0, imp.bytes());  // an operation of its own in flight when it dies
    sendText(s, "holding");
    std::this_thread::sleep_for(std::chrono::seconds(60));
    return false;
  };
  EXPECT_TRUE(survivorAndVictim(server, client));
}

TEST_P(ArenaFaults, KilledInTheMiddleOfAnImportLeavesNothingBehind) {
  const std::string addr = freshAddress();
  MemoryKind k = kind();
  kvcomm::KvLayout layout = testLayout(64);
  constexpr int kRounds = 12;
  int pipeFd[2];
  ASSERT_EQ(pipe(pipeFd), 0);
  auto server = [&] {
    close(pipeFd[0]);
    if (!useDevice(k, 0)) return false;
    ArenaServer srv = ArenaServer::listen(addr);
    kvcomm::ArenaOptions o;
    o.kind = k;
    Arena a = Arena::create(layout, o);
    {
      ArenaSession warm = srv.accept(20000);
      sendCapability(warm, warm.offer(a));
      if (recvText(warm) != "done") return false;
    }
    if (!waitUntil([&] { return a.leases() == 0; }, 5000)) return false;
    Counts base = Counts::now(k);
    char start = 1;
    if (write(pipeFd[1], &start, 1) != 1) return false;
    bool ok = true;
    double worst = 0;
    for (int i = 0; i < kRounds; ++i) {
      ArenaSession s = srv.accept(20000);
      sendCapability(s, s.offer(a));
      auto t0 = Clock::now();
      // The client kills itself at a random moment of its import: reclaim whatever stage it reached.
      ok = waitUntil([&] { return !s.alive(); }, 10000) && ok;
      ok = waitUntil([&] { return a.leases() == 0; }, 5000) && ok;
      worst = std::max(worst, since(t0));
      s = ArenaSession();
      char go = 1;
      if (write(pipeFd[1], &go, 1) != 1) return false;
    }
    ok = worst < 5.0 && ok;
    ok = backTo(base, k, "kill -9 at random points of 12 imports", worst) && ok;
    a.free();
    return ok;
  };
  pid_t s = spawn(server);
  close(pipeFd[1]);
  bool ok = true;
  auto warm = [&] {
    if (!useDevice(k, clientDevice())) return false;
    ArenaSession c = ArenaSession::connect(addr);
    ArenaImport imp = c.import(recvCapability(c));
    imp.close();
    sendText(c, "done");
    return true;
  };
  ok = runAll({warm}) && ok;
  char started = 0;
  ok = read(pipeFd[0], &started, 1) == 1 && ok;  // the server measured its baseline
  std::mt19937 rng(static_cast<unsigned>(getpid()));
  for (int i = 0; i < kRounds && ok; ++i) {
    unsigned delayUs = rng() % 3000;
    pid_t c = spawn([&] {
      if (!useDevice(k, clientDevice())) return false;
      ArenaSession c = ArenaSession::connect(addr);
      ArenaCapability cap = recvCapability(c);
      std::thread killer([delayUs] {
        std::this_thread::sleep_for(std::chrono::microseconds(delayUs));
        raise(SIGKILL);
      });
      try {
        ArenaImport imp = c.import(cap);
        std::this_thread::sleep_for(std::chrono::seconds(60));
      } catch (...) {
      }
      killer.join();
      return false;
    });
    ok = reap(c, 60) == -SIGKILL && ok;
    char go = 0;
    ok = read(pipeFd[0], &go, 1) == 1 && ok;  // the server reclaimed it
  }
  close(pipeFd[0]);
  EXPECT_TRUE(ok);
  EXPECT_EQ(reap(s, 120), 0);
}

TEST_P(ArenaFaults, KilledOwnerMakesImporterCallsFailWhileItsBytesStayReadable) {
  const std::string addr = freshAddress();
  MemoryKind k = kind();
  kvcomm::KvLayout layout = testLayout(16);
  // The importer is the client of a server-owned arena; the client kills the server.
  auto server = [&] {
    if (!useDevice(k, 0)) return false;
    ArenaServer srv = ArenaServer::listen(addr);
    {
      ArenaSession warm = srv.accept(20000);
      if (!ownerSide(warm, k, layout, 1)) return false;
    }
    ArenaSession s = srv.accept(20000);
    kvcomm::ArenaOptions o;
    o.kind = k;
    Arena a = Arena::create(layout, o);
    auto img = ownerImage(layout, a.bytes(), 2);
    a.write(0, img.data(), img.size());
    sendCapability(s, s.offer(a));
    std::this_thread::sleep_for(std::chrono::seconds(60));
    return false;
  };
  auto client = [&] {
    if (!useDevice(k, clientDevice())) return false;
    {
      ArenaSession warm = ArenaSession::connect(addr);
      if (!importerSide(warm, layout, 1)) return false;
    }
    Counts base = Counts::now(k);
    bool ok = true;
    {
      ArenaSession s = ArenaSession::connect(addr);
      ArenaImport imp = s.import(recvCapability(s));
      auto img = ownerImage(layout, imp.bytes(), 2);
      ok = compare(imp, img).empty();
      int owner = s.peerPid();
      auto t0 = Clock::now();
      kill(owner, SIGKILL);
      ok = waitUntil([&] { return !imp.ownerAlive(); }, 5000) && ok;
      double seen = since(t0);
      std::string who = "pid " + std::to_string(owner);
      ok = seen < 5.0 && ok;
      ok = throwsCode([&] { imp.check(); }, kvcomm::ErrorCode::NetworkError, who, "check() after the owner died") && ok;
      ok =
          throwsCode([&] { imp.pin(0, 64); }, kvcomm::ErrorCode::NetworkError, who, "pin() after the owner died") && ok;
      ok = throwsCode(
               [&] {
                 char b[8];
                 imp.read(0, b, sizeof(b));
               },
               kvcomm::ErrorCode::NetworkError, who, "read() after the owner died") &&
           ok;
      ok =
          throwsCode([&] { s.receive(100); }, kvcomm::ErrorCode::NetworkError, who, "receive() after the owner died") &&
          ok;
      ok = throwsCode([&] { sendText(s, "x"); }, kvcomm::ErrorCode::NetworkError, who, "send() after the owner died") &&
           ok;
      ok = !imp.ownerLostReason().empty() && ok;
      // The memory stays mapped and readable until close(): the driver (or the memfd) keeps it alive.
      ok = imp.data() != nullptr && readRaw(k, imp.data(), img.size()) == img && ok;
      std::fprintf(stderr,
                   "[arena] kill -9 of the owner (pid %d): importer calls failed %.3f s later; its %zu mapped "
                   "bytes still read back exactly\n",
                   owner, seen, img.size());
      imp.close();
      ok = imp.data() == nullptr && imp.closed() && ok;
    }
    return backTo(base, k, "the importer after its owner was killed and the import closed", 0) && ok;
  };
  EXPECT_TRUE(survivorAndVictim(client, server));  // here the client kills the server
}

TEST_P(ArenaFaults, ServerReleasesADeadClientsArenaOnceItsOperationEnds) {
  const std::string addr = freshAddress();
  MemoryKind k = kind();
  kvcomm::KvLayout layout = testLayout(16);
  // Client-owned arena imported by the server with OwnerLoss::Release; a server thread is reading through a pin when
  // the client dies.
  Gate measured;
  auto server = [&] {
    if (!useDevice(k, 0)) return false;
    ArenaServer srv = ArenaServer::listen(addr);
    {
      ArenaSession warm = srv.accept(20000);
      if (!importerSide(warm, layout, 1)) return false;
      warm.close();
    }
    // A thread like the reader below, once: its stack and malloc arena are reused, not new, when the reader runs.
    std::thread([&] {
      useDevice(k, 0);
      std::vector<uint8_t> v(1 << 20, 1);
      readRaw(MemoryKind::Host, v.data(), v.size());
    }).join();
    Counts base = Counts::now(k);
    measured.pass();
    bool ok = true;
    double reclaim = 0;
    {
      ArenaSession s = srv.accept(20000);
      kvcomm::ImportOptions io;
      io.onOwnerLoss = kvcomm::OwnerLoss::Release;
      ArenaImport imp = s.import(recvCapability(s), io);
      auto img = ownerImage(layout, imp.bytes(), 2);
      ok = compare(imp, img).empty();
      std::atomic<bool> pinned{false};
      std::atomic<int> reads{0}, bad{0};
      std::thread worker([&] {
        useDevice(k, 0);  // the copies of this thread need the GPU's context
        ArenaPin p = imp.pin(0, img.size());
        pinned = true;
        auto until = Clock::now() + std::chrono::milliseconds(1500);
        while (Clock::now() < until) {  // the copy out of the client's KV goes on through its death
          if (readRaw(k, p.data(), img.size()) != img) ++bad;
          ++reads;
        }
      });
      waitUntil([&] { return pinned.load(); }, 5000);
      int victim = s.peerPid();
      auto t0 = Clock::now();
      kill(victim, SIGKILL);
      ok = waitUntil([&] { return !imp.ownerAlive(); }, 5000) && ok;
      double seen = since(t0);
      ok = imp.data() != nullptr && ok;  // still mapped: the operation is in flight
      worker.join();
      ok = waitUntil([&] { return imp.data() == nullptr; }, 5000) && ok;  // released once the pin ended
      reclaim = since(t0);
      std::fprintf(stderr,
                   "[arena] kill -9 of the owner (pid %d) during a read: noticed after %.3f s, %d reads through "
                   "the pin (%d wrong), mapping released %.3f s after the kill\n",
                   victim, seen, reads.load(), bad.load(), reclaim);
      ok = bad == 0 && reads > 0 && reclaim < 5.0 && seen < 5.0 && ok;
      ok = throwsCode([&] { imp.pin(0, 1); }, kvcomm::ErrorCode::NetworkError, "pid " + std::to_string(victim),
                      "pin() on a released import") &&
           ok;
    }
    return backTo(base, k, "server after a client died during a read (OwnerLoss::Release)", reclaim) && ok;
  };
  auto client = [&] {
    if (!useDevice(k, clientDevice())) return false;
    {
      ArenaSession warm = ArenaSession::connect(addr);
      if (!ownerSide(warm, k, layout, 1)) return false;
    }
    if (!measured.wait()) return false;
    ArenaSession s = ArenaSession::connect(addr);
    kvcomm::ArenaOptions o;
    o.kind = k;
    Arena a = Arena::create(layout, o);
    auto img = ownerImage(layout, a.bytes(), 2);
    a.write(0, img.data(), img.size());
    sendCapability(s, s.offer(a));
    std::this_thread::sleep_for(std::chrono::seconds(60));
    return false;
  };
  EXPECT_TRUE(survivorAndVictim(server, client));
}

TEST_P(ArenaFaults, FreeWhileBusyIsRefusedAndNeverUsesFreedMemory) {
  const std::string addr = freshAddress();
  MemoryKind k = kind();
  kvcomm::KvLayout layout = testLayout(16);
  auto server = [&] {
    if (!useDevice(k, 0)) return false;
    ArenaServer srv = ArenaServer::listen(addr);
    ArenaSession s = srv.accept(20000);
    kvcomm::ArenaOptions o;
    o.kind = k;
    o.capacity = 64u << 20;
    Arena a = Arena::create(layout, o);
    auto img = ownerImage(layout, a.bytes(), 4);
    a.write(0, img.data(), img.size());
    sendCapability(s, s.offer(a));
    if (recvText(s) != "writing") return false;
    std::string pid = std::to_string(s.peerPid());
    bool ok = true;
    // The importer writes into the arena all along; the owner's memory must stay where it is.
    ok = throwsCode([&] { a.free(); }, kvcomm::ErrorCode::Busy, "importer pids " + pid, "free() with a lease") && ok;
    ok = throwsCode(
             [&] {
               a.grow(a.bytes() + a.granularity());
               a.shrink(layout);
             },
             kvcomm::ErrorCode::Busy, "lease", "shrink() back after a grow, with a lease") &&
         ok;
    auto t0 = Clock::now();
    ok = throwsCode([&] { a.free(300); }, kvcomm::ErrorCode::Busy, "1 lease", "free(300 ms) with a lease") && ok;
    ok = since(t0) >= 0.28 && ok;
    ok = a.data() != nullptr && !a.freed() && ok;
    std::vector<uint8_t> even(layout.regions[0].blockBytes);
    a.read(layout.regions[0].offset, even.data(), even.size());  // block 0 is the owner's alone: still intact
    ok = even == blockContent(ownerSeed(4), 0, 0, even.size()) && ok;
    // An operation of the owner's own, released 300 ms after the importer is told to close.
    ArenaPin op = a.pin(0, 4096);
    std::thread releaser([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      op.release();
    });
    sendText(s, "stop");
    t0 = Clock::now();
    a.free(10000);  // waits for the lease and the pin, then frees
    double waited = since(t0);
    releaser.join();
    std::fprintf(stderr, "[arena] free() waited %.3f s for the importer's close and the owner's operation\n", waited);
    ok = waited >= 0.25 && waited < 5 && a.freed() && a.data() == nullptr && a.leases() == 0 && ok;
    ok = throwsCode([&] { a.pin(0, 1); }, kvcomm::ErrorCode::InvalidArgument, "freed", "pin() after free()") && ok;
    ok = throwsCode([&] { s.offer(a); }, kvcomm::ErrorCode::InvalidArgument, "freed", "offer() after free()") && ok;
    a.free();  // idempotent
    return recvText(s) == "closed" && ok;
  };
  auto client = [&] {
    if (!useDevice(k, clientDevice())) return false;
    ArenaSession s = ArenaSession::connect(addr);
    ArenaImport imp = s.import(recvCapability(s));
    std::atomic<bool> stop{false};
    std::atomic<long> writes{0};
    size_t off = layout.regions[1].offset, n = layout.regions[1].blockBytes;
    std::thread writer([&] {
      std::vector<uint8_t> v(n);
      while (!stop) {
        std::memset(v.data(), static_cast<int>(writes % 251), n);
        imp.write(off, v.data(), n);  // pinned while it runs
        ++writes;
      }
    });
    sendText(s, "writing");
    bool ok = recvText(s) == "stop";
    stop = true;
    writer.join();
    // close() drains: with a pin of its own left it times out, and the pin's memory stays valid.
    ArenaPin p = imp.pin(0, 64);
    ok = throwsCode([&] { imp.close(100); }, kvcomm::ErrorCode::Timeout, "1 operation", "close() with a pin") && ok;
    ok = throwsCode([&] { imp.pin(0, 1); }, kvcomm::ErrorCode::Aborted, "closing", "pin() while closing") && ok;
    ok = readRaw(k, p.data(), 64).size() == 64 && imp.operations() == 1 && ok;
    p.release();
    imp.close();
    ok = imp.closed() && imp.data() == nullptr && ok;
    ok = throwsCode([&] { imp.pin(0, 1); }, kvcomm::ErrorCode::InvalidArgument, "closed", "pin() after close()") && ok;
    std::fprintf(stderr, "[client] %ld writes while the owner tried to free\n", writes.load());
    sendText(s, "closed");
    return ok && writes > 0;
  };
  EXPECT_TRUE(runAll({server, client}));
}

TEST(ArenaLifetimes, PinsOutliveTheirHandlesInOneProcess) {
  // Owner and importer in one process (two sessions of it): a pin keeps the import's mapping after the import
  // handle is gone, and the owner's memory after the Arena handle is gone (ASan watches the accesses).
  EXPECT_TRUE(runAll({[] {
    ArenaServer srv = ArenaServer::listen();
    ArenaSession c = ArenaSession::connect(srv.address());
    ArenaSession s = srv.accept(5000);
    kvcomm::KvLayout layout = testLayout(8);
    kvcomm::ArenaOptions o;
    o.kind = MemoryKind::Host;
    auto a = std::make_unique<Arena>(Arena::create(layout, o));
    auto img = ownerImage(layout, a->bytes(), 6);
    a->write(0, img.data(), img.size());
    auto imp = std::make_unique<ArenaImport>(c.import(s.offer(*a)));
    ArenaPin ip = imp->pin(0, img.size());
    ArenaPin op = a->pin(0, img.size());
    imp.reset();  // closes once `ip` is released
    bool ok = std::memcmp(ip.data(), img.data(), img.size()) == 0;
    ok = waitUntil([&] { return a->leases() == 1; }, 1000) && ok;  // the lease lives while the pin does
    ip.release();
    ok = waitUntil([&] { return a->leases() == 0; }, 5000) && ok;
    a.reset();  // the handle goes; the memory stays for the pin
    ok = std::memcmp(op.data(), img.data(), img.size()) == 0 && ok;
    std::memset(op.data(), 0x5c, img.size());
    op.release();
    return ok;
  }}));
}

TEST_P(ArenaFaults, ThousandRegisterImportCloseCyclesLeaveCountsFlat) {
  const std::string addr = freshAddress();
  MemoryKind k = kind();
  constexpr int kCycles = 1000, kWarm = 20;
  kvcomm::KvLayout layout = testLayout(2);
  // Even cycles: server-owned (the server registers an arena, the client imports it); odd: client-owned. The client
  // reconnects every 100 cycles.
  auto body = [&](bool isServer) {
    if (!useDevice(k, isServer ? 0 : clientDevice())) return false;
    ArenaServer srv;
    ArenaSession s;
    if (isServer) {
      srv = ArenaServer::listen(addr);
      s = srv.accept(20000);
    } else {
      s = ArenaSession::connect(addr);
    }
    Counts warm{};
    auto t0 = Clock::now();
    for (int i = 0; i < kCycles; ++i) {
      if (i == kWarm) {
        if (isServer) waitUntil([&] { return srv.sessions() == 1; }, 5000);
        warm = Counts::now(k);
        t0 = Clock::now();
      }
      if (i > 0 && i % 100 == 0) {
        if (isServer) {
          if (recvText(s) != "reconnect") return false;
          s = srv.accept(20000);
        } else {
          sendText(s, "reconnect");
          s = ArenaSession();
          s = ArenaSession::connect(addr);
        }
      }
      bool owner = (i % 2 == 0) == isServer;
      uint8_t mark = static_cast<uint8_t>(i * 7 + 1);
      if (owner) {
        kvcomm::ArenaOptions o;
        o.kind = k;
        Arena a = Arena::create(layout, o);
        a.write(100, &mark, 1);
        sendCapability(s, s.offer(a));
        if (recvText(s) != "ok") return false;
        if (a.leases() != 0) return false;  // close() returned after the owner dropped the lease
        a.free();
      } else {
        ArenaImport imp = s.import(recvCapability(s));
        uint8_t got = 0;
        imp.read(100, &got, 1);
        imp.close();
        if (got != mark) return false;
        sendText(s, "ok");
      }
    }
    double sec = since(t0);
    if (isServer) waitUntil([&] { return srv.sessions() == 1; }, 5000);
    Counts end = Counts::now(k);
    // Both measured before either leaves (the session would end under the other's count).
    sendText(s, "measured");
    if (recvText(s) != "measured") return false;
    std::fprintf(stderr,
                 "[arena] %s: %d register/import/close cycles in %.2f s (%.0f us each); descriptors %d -> %d, "
                 "mappings %d -> %d\n",
                 isServer ? "server" : "client", kCycles - kWarm, sec, sec * 1e6 / (kCycles - kWarm), warm.fds, end.fds,
                 warm.maps, end.maps);
    return end.fds == warm.fds && end.maps == warm.maps;
  };
  EXPECT_TRUE(runAll({[&] { return body(true); }, [&] { return body(false); }}, 300));
}

INSTANTIATE_TEST_SUITE_P(Kinds, ArenaFaults, ::testing::Values(MemoryKind::Host, MemoryKind::Cuda), kindParamName);

}  // namespace
