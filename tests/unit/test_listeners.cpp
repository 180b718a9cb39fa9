// Listener hardening against local processes that connect and say nothing, or garbage (fork + TCP id): group
// formation, collectives and a symmetric-memory rendezvous under 100 idle connections per listener take at most 1 s
// more than undisturbed; descriptors return to their baseline; descriptor exhaustion does not break a group; a stale
// id is refused by a formed group at once; the mesh listens on the advertised interface only.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "comm/tcp_mesh.hpp"
#include "comm/wire.hpp"
#include "common/socket.hpp"
#include "kvcomm/bootstrap.hpp"
#include "kvcomm/comm.hpp"
#include "kvcomm/error.hpp"
#include "kvcomm/symm.hpp"
#include "support/processes.hpp"
#include "symm/fd_exchange.hpp"
#include "verify/memory.hpp"

namespace {

using kvcomm::detail::SockAddr;
using kvtest::Children;
using kvtest::msBetween;
using kvtest::nowNs;
using kvtest::Shared;

constexpr int kHostile = 100;          // idle connections per listener
constexpr int64_t kTimeoutMs = 20000;  // bootstrap/mesh timeout: a stalled listener shows as a timeout
constexpr double kAllowedMs = 1000.0;  // the bound over undisturbed

// `n` TCP connections to `addr` that never send anything (some send a few bytes of garbage).
std::vector<kvcomm::detail::Fd> idleTcp(const SockAddr& addr, int n, bool someGarbage = false) {
  std::vector<kvcomm::detail::Fd> out;
  for (int i = 0; i < n; ++i) {
    kvcomm::detail::Fd fd(socket(addr.storage.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (connect(fd.get(), addr.sa(), addr.len) != 0 && errno != EINPROGRESS) continue;
    if (someGarbage && i % 10 == 0) (void)::send(fd.get(), "GET / HTTP/1.0\r\n", 16, MSG_NOSIGNAL);
    out.push_back(std::move(fd));
  }
  return out;
}

// `n` Unix-socket connections to the fd server `name` that never send their request.
std::vector<kvcomm::detail::Fd> idleFdServer(const std::string& name, int n) {
  std::vector<kvcomm::detail::Fd> out;
  for (int i = 0; i < n; ++i) {
    kvcomm::detail::Fd fd(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::memcpy(a.sun_path + 1, name.data(), name.size());
    auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
    if (connect(fd.get(), reinterpret_cast<sockaddr*>(&a), len) == 0) out.push_back(std::move(fd));
  }
  return out;
}

SockAddr rootOf(const kvcomm::UniqueId& id) {
  return kvcomm::detail::idAddress(kvcomm::detail::decodeUniqueId(id));
}

// Slowest rank's time to join a 4-rank group and build its communicator, with `hostile` idle connections made to
// the root first.
double formationMs(int hostile) {
  kvcomm::UniqueId id = kvcomm::TcpBootstrap::createUniqueId();
  auto conns = idleTcp(rootOf(id), hostile, true);
  EXPECT_EQ(static_cast<int>(conns.size()), hostile);
  Shared<int64_t> took(4);
  auto codes = kvtest::runProcesses(4, [&](int rank) {
    int64_t t0 = nowNs();
    auto comm = kvcomm::Communicator::create(std::make_shared<kvcomm::TcpBootstrap>(id, rank, 4, kTimeoutMs));
    comm.barrier();
    took[rank] = nowNs() - t0;
    return true;
  });
  double worst = 0;
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(codes[static_cast<size_t>(r)], 0) << "rank " << r << " with " << hostile << " idle connections";
    worst = std::max(worst, static_cast<double>(took[r]) / 1e6);
  }
  return worst;
}

TEST(Listeners, RootFormsTheGroupUnderHundredIdleConnections) {
  double calm = formationMs(0);
  double attacked = formationMs(kHostile);
  std::printf("formation: %.1f ms undisturbed, %.1f ms with %d idle connections to the root\n", calm, attacked,
              kHostile);
  EXPECT_LE(attacked, calm + kAllowedMs);
}

struct MeshProbe {
  int32_t formed, measured, attacked, done;
  int32_t fdsBefore, fdsAfter, pendingPeak, pendingAfter;
  double calmMs, attackedMs;
  SockAddr addr;
};

// Idle and garbage connections to every rank's mesh listener: collectives are not delayed, pending connections
// stay capped, and all of them are gone (descriptors back to baseline) once the hello deadline passed.
TEST(Listeners, MeshServesCollectivesUnderHundredIdleConnectionsPerRank) {
  kvcomm::UniqueId id = kvcomm::TcpBootstrap::createUniqueId();
  Shared<MeshProbe> p(4);
  Children kids(4, [&](int rank) {
    auto boot = std::make_shared<kvcomm::TcpBootstrap>(id, rank, 4, kTimeoutMs);
    auto comm = kvcomm::Communicator::create(boot);
    auto mesh = boot->mesh();
    std::vector<char> data(4u << 16);
    auto round = [&] {
      int64_t t0 = nowNs();
      for (int i = 0; i < 30; ++i) comm.allgather(data.data(), 1u << 16);
      return msBetween(t0, nowNs());
    };
    round();  // warm-up: every connection exists
    p[rank].addr = mesh->listenAddress();
    p[rank].fdsBefore = kvtest::countFds();
    __atomic_store_n(&p[rank].formed, 1, __ATOMIC_RELEASE);
    p[rank].calmMs = round();
    __atomic_store_n(&p[rank].measured, 1, __ATOMIC_RELEASE);
    kvtest::waitFor([&] { return __atomic_load_n(&p[0].attacked, __ATOMIC_ACQUIRE) == 1; }, 20000);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    p[rank].pendingPeak = static_cast<int32_t>(mesh->pendingConnections());
    p[rank].attackedMs = round();
    // Gone once the hello deadline passed: waited for (a loaded machine's mesh thread may be late), not slept.
    kvtest::waitFor([&] { return mesh->pendingConnections() == 0 && kvtest::countFds() == p[rank].fdsBefore; },
                    kvcomm::detail::kHandshakeDeadlineMs + 5000);
    p[rank].pendingAfter = static_cast<int32_t>(mesh->pendingConnections());
    p[rank].fdsAfter = kvtest::countFds();
    comm.barrier();
    __atomic_store_n(&p[rank].done, 1, __ATOMIC_RELEASE);
    kvtest::waitFor([&] { return __atomic_load_n(&p[0].attacked, __ATOMIC_ACQUIRE) == 2; }, 20000);
    return true;
  });
  auto all = [&](int32_t MeshProbe::*field) {
    return kvtest::waitFor(
        [&] {
          for (int r = 0; r < 4; ++r)
            if (!__atomic_load_n(&(p[r].*field), __ATOMIC_ACQUIRE)) return false;
          return true;
        },
        30000);
  };
  ASSERT_TRUE(all(&MeshProbe::measured));
  std::vector<kvcomm::detail::Fd> hostile;
  for (int r = 0; r < 4; ++r)
    for (auto& fd : idleTcp(p[r].addr, kHostile, true)) hostile.push_back(std::move(fd));
  __atomic_store_n(&p[0].attacked, 1, __ATOMIC_RELEASE);
  EXPECT_TRUE(all(&MeshProbe::done));
  __atomic_store_n(&p[0].attacked, 2, __ATOMIC_RELEASE);
  auto codes = kids.wait(30);
  for (int r = 0; r < 4; ++r) {
    std::printf(
        "rank %d: 30 allgathers %.1f ms undisturbed, %.1f ms under %d idle connections; pending %d -> %d; "
        "fds %d -> %d\n",
        r, p[r].calmMs, p[r].attackedMs, kHostile, p[r].pendingPeak, p[r].pendingAfter, p[r].fdsBefore, p[r].fdsAfter);
    EXPECT_EQ(codes[static_cast<size_t>(r)], 0) << "rank " << r;
    EXPECT_LE(p[r].attackedMs, p[r].calmMs + kAllowedMs) << "rank " << r;
    EXPECT_LE(p[r].pendingPeak, static_cast<int32_t>(kvcomm::detail::kMaxPendingHandshakes)) << "rank " << r;
    EXPECT_EQ(p[r].pendingAfter, 0) << "rank " << r;
    EXPECT_EQ(p[r].fdsAfter, p[r].fdsBefore) << "rank " << r << ": descriptors of idle connections were kept";
  }
}

// A rank whose descriptor limit is nearly reached keeps working while hundreds of connections arrive (accept fails
// with EMFILE: the listener drops them instead of failing the group's next collective).
TEST(Listeners, DescriptorExhaustionDoesNotBreakTheGroup) {
  kvcomm::UniqueId id = kvcomm::TcpBootstrap::createUniqueId();
  Shared<MeshProbe> p(2);
  Children kids(2, [&](int rank) {
    auto boot = std::make_shared<kvcomm::TcpBootstrap>(id, rank, 2, kTimeoutMs);
    auto comm = kvcomm::Communicator::create(boot);
    int v[2] = {0, 0};
    comm.allgather(v, sizeof(int));
    p[rank].addr = boot->mesh()->listenAddress();
    p[rank].fdsBefore = kvtest::countFds();
    if (rank == 1) {
      rlimit lim{static_cast<rlim_t>(p[rank].fdsBefore + 8), static_cast<rlim_t>(p[rank].fdsBefore + 8)};
      if (setrlimit(RLIMIT_NOFILE, &lim) != 0) return false;
    }
    __atomic_store_n(&p[rank].measured, 1, __ATOMIC_RELEASE);
    kvtest::waitFor([&] { return __atomic_load_n(&p[0].attacked, __ATOMIC_ACQUIRE) == 1; }, 20000);
    for (int i = 0; i < 200; ++i) {
      v[rank] = i + rank;
      comm.allgather(v, sizeof(int));
      if (v[0] != i || v[1] != i + 1) return false;
    }
    kvtest::waitFor([&] { return kvtest::countFds() == p[rank].fdsBefore; },
                    kvcomm::detail::kHandshakeDeadlineMs + 5000);
    p[rank].fdsAfter = kvtest::countFds();
    comm.barrier();
    return p[rank].fdsAfter == p[rank].fdsBefore;
  });
  ASSERT_TRUE(kvtest::waitFor(
      [&] {
        return __atomic_load_n(&p[0].measured, __ATOMIC_ACQUIRE) && __atomic_load_n(&p[1].measured, __ATOMIC_ACQUIRE);
      },
      20000));
  auto hostile = idleTcp(p[1].addr, 300);
  __atomic_store_n(&p[0].attacked, 1, __ATOMIC_RELEASE);
  auto codes = kids.wait(60);
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[1], 0) << "the rank out of descriptors failed (fds " << p[1].fdsBefore << " -> " << p[1].fdsAfter
                         << ")";
}

// A process presenting the id of a group that already formed (and sits idle) is refused at once, with the reason.
TEST(Listeners, StaleIdIsRefusedByAnIdleFormedGroup) {
  kvcomm::UniqueId id = kvcomm::TcpBootstrap::createUniqueId();
  Shared<int32_t> formed(2);
  Shared<int32_t> staleDone(1);
  Shared<int64_t> took(1);
  Children kids(3, [&](int who) {
    if (who < 2) {
      auto comm = kvcomm::Communicator::create(std::make_shared<kvcomm::TcpBootstrap>(id, who, 2, kTimeoutMs));
      comm.barrier();
      __atomic_store_n(&formed[who], 1, __ATOMIC_RELEASE);
      // Idle (no kvcomm call in flight) until the stale attempt has ended, however late it came.
      kvtest::waitFor([&] { return __atomic_load_n(&staleDone[0], __ATOMIC_ACQUIRE) == 1; }, 20000);
      return comm.healthy();
    }
    kvtest::waitFor([&] { return formed[0] && formed[1]; }, 20000);
    struct Done {
      Shared<int32_t>& flag;
      ~Done() { __atomic_store_n(&flag[0], 1, __ATOMIC_RELEASE); }
    } done{staleDone};
    int64_t t0 = nowNs();
    try {
      kvcomm::TcpBootstrap stale(id, 1, 2, 5000);
      return false;
    } catch (const kvcomm::Error& e) {
      took[0] = nowNs() - t0;
      return e.code() == kvcomm::ErrorCode::NetworkError &&
             std::string(e.what()).find("already formed") != std::string::npos;
    }
  });
  auto codes = kids.wait(30);
  std::printf("stale id refused after %.1f ms\n", static_cast<double>(took[0]) / 1e6);
  EXPECT_EQ(codes[2], 0) << "the stale id was not refused with a clear error";
  EXPECT_LT(static_cast<double>(took[0]) / 1e6, kAllowedMs);
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[1], 0);
}

// The mesh listens on the interface it advertises (the one that reaches the root), never on the wildcard address.
TEST(Listeners, MeshListensOnTheAdvertisedInterfaceOnly) {
  kvcomm::UniqueId id = kvcomm::TcpBootstrap::createUniqueId();
  std::string root = rootOf(id).toString();
  std::string rootHost = root.substr(0, root.rfind(':'));
  auto codes = kvtest::runProcesses(2, [&](int rank) {
    auto boot = std::make_shared<kvcomm::TcpBootstrap>(id, rank, 2, kTimeoutMs);
    std::string mine = boot->mesh()->listenAddress().toString();
    std::string host = mine.substr(0, mine.rfind(':'));
    boot->barrier();
    if (host == "0.0.0.0" || host == "[::]") return false;
    return host == rootHost;  // one host: the same interface reaches the root
  });
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[1], 0) << "a non-root mesh listener is bound to the wildcard address or another interface";
}

struct FdProbe {
  int32_t ready, attacked, done, otherUidRefused;
  int32_t fdsBefore, fdsAfter;
  double calmMs, attackedMs;
  char server[48];
};

// The fd server under 100 idle connections per process (and, as root, 100 from another user): a rendezvous (grow)
// is not delayed, another user is refused without a byte read, and the idle connections are closed after the
// request deadline.
TEST(Listeners, FdServerServesRendezvousUnderHundredIdleConnections) {
  kvcomm::UniqueId id = kvcomm::TcpBootstrap::createUniqueId();
  Shared<FdProbe> p(2);
  Children kids(2, [&](int rank) {
    auto comm = kvcomm::Communicator::create(std::make_shared<kvcomm::TcpBootstrap>(id, rank, 2, kTimeoutMs));
    auto buf = kvcomm::SymmetricBuffer::create(comm, 256u << 20, 1, kvcomm::MemoryKind::Host);
    size_t g = buf.granularity(), at = buf.mappedBytes();
    auto grows = [&] {
      int64_t t0 = nowNs();
      for (int i = 0; i < 10; ++i) buf.grow(at += g);
      return msBetween(t0, nowNs());
    };
    std::snprintf(p[rank].server, sizeof(p[rank].server), "%s", kvcomm::detail::FdServer::instance().name().c_str());
    int fds0 = kvtest::countFds();
    p[rank].calmMs = grows();
    // Every grow keeps its own chunk and each peer's: the attacked round adds as many descriptors as this one.
    p[rank].fdsBefore = 2 * kvtest::countFds() - fds0;
    __atomic_store_n(&p[rank].ready, 1, __ATOMIC_RELEASE);
    kvtest::waitFor([&] { return __atomic_load_n(&p[0].attacked, __ATOMIC_ACQUIRE) == 1; }, 20000);
    p[rank].attackedMs = grows();
    kvtest::waitFor([&] { return kvtest::countFds() == p[rank].fdsBefore; },
                    kvcomm::detail::kHandshakeDeadlineMs + 5000);
    p[rank].fdsAfter = kvtest::countFds();
    comm.barrier();
    return true;
  });
  ASSERT_TRUE(kvtest::waitFor(
      [&] { return __atomic_load_n(&p[0].ready, __ATOMIC_ACQUIRE) && __atomic_load_n(&p[1].ready, __ATOMIC_ACQUIRE); },
      30000));
  std::vector<kvcomm::detail::Fd> hostile;
  for (int r = 0; r < 2; ++r)
    for (auto& fd : idleFdServer(p[r].server, kHostile)) hostile.push_back(std::move(fd));
  bool otherUser = getuid() == 0;
  if (otherUser) {
    // Another user (nobody) connects too: refused before the server reads anything, with a reply saying why.
    auto codes = kvtest::runProcesses(1, [&](int) {
      if (setgid(65534) != 0 || setuid(65534) != 0) return false;
      int refused = 0;
      for (int r = 0; r < 2; ++r)
        for (auto& fd : idleFdServer(p[r].server, kHostile)) {
          kvcomm::detail::FdReply reply{};
          pollfd pf{fd.get(), POLLIN, 0};
          if (poll(&pf, 1, 2000) == 1 && ::recv(fd.get(), &reply, sizeof(reply), 0) == sizeof(reply) &&
              reply.status == 1 && std::string(reply.message).find("uid") != std::string::npos)
            ++refused;
        }
      return refused == 2 * kHostile;
    });
    EXPECT_EQ(codes[0], 0) << "connections of another user were not refused at once";
  }
  __atomic_store_n(&p[0].attacked, 1, __ATOMIC_RELEASE);
  auto codes = kids.wait(60);
  for (int r = 0; r < 2; ++r) {
    std::printf("rank %d: 10 grows %.1f ms undisturbed, %.1f ms under %d idle connections%s; fds %d -> %d\n", r,
                p[r].calmMs, p[r].attackedMs, kHostile, otherUser ? " (+100 of another user)" : "", p[r].fdsBefore,
                p[r].fdsAfter);
    EXPECT_EQ(codes[static_cast<size_t>(r)], 0) << "rank " << r;
    EXPECT_LE(p[r].attackedMs, p[r].calmMs + kAllowedMs) << "rank " << r;
    EXPECT_EQ(p[r].fdsAfter, p[r].fdsBefore) << "rank " << r;
  }
}

}  // namespace
