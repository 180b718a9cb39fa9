// TcpBootstrap without MPI: real processes (fork), real sockets.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "comm/tcp_mesh.hpp"
#include "common/socket.hpp"
#include "kvcomm/bootstrap.hpp"
#include "kvcomm/comm.hpp"
#include "kvcomm/error.hpp"
#include "support/processes.hpp"

namespace {

using kvtest::runProcesses;

TEST(TcpBootstrap, FourProcessesBuildACommunicator) {
  kvcomm::UniqueId id = kvcomm::TcpBootstrap::createUniqueId();
  auto codes = runProcesses(4, [&](int rank) {
    auto boot = std::make_shared<kvcomm::TcpBootstrap>(id, rank, 4, 20000);
    auto comm = kvcomm::Communicator::create(boot);
    if (comm.rank() != rank || comm.size() != 4) return false;
    std::vector<int> v(4, -1);
    v[static_cast<size_t>(rank)] = rank * 10 + 1;
    comm.allgather(v.data(), sizeof(int));
    for (int r = 0; r < 4; ++r)
      if (v[static_cast<size_t>(r)] != r * 10 + 1) return false;
    // A large allgather exercises full socket buffers in both directions.
    std::vector<uint8_t> big(4u << 20);
    for (size_t i = 0; i < (1u << 20); ++i) big[static_cast<size_t>(rank) * (1u << 20) + i] = uint8_t(rank * 31 + i);
    comm.allgather(big.data(), 1u << 20);
    for (int r = 0; r < 4; ++r)
      for (size_t i = 0; i < (1u << 20); i += 4093)
        if (big[static_cast<size_t>(r) * (1u << 20) + i] != uint8_t(r * 31 + i)) return false;
    auto sub = comm.split(rank % 2, -rank);
    if (!sub || sub->size() != 2) return false;
    // key = -rank: the higher world rank comes first.
    if (sub->worldRank(0) != (rank % 2) + 2 || sub->worldRank(1) != rank % 2) return false;
    int token = rank, got = -1;
    int peer = 1 - sub->rank();
    sub->send(&token, sizeof(token), peer, 5);
    sub->recv(&got, sizeof(got), peer, 5);
    if (got != sub->worldRank(peer)) return false;
    comm.barrier();
    return comm.topology().numHosts == 1 && comm.topology().members[3].localRank == 3;
  });
  for (int r = 0; r < 4; ++r) EXPECT_EQ(codes[static_cast<size_t>(r)], 0) << "rank " << r;
}

TEST(TcpBootstrap, WrongNonceIsRefusedWithAClearError) {
  kvcomm::UniqueId id = kvcomm::TcpBootstrap::createUniqueId();
  kvcomm::UniqueId forged = id;
  forged.bytes[9] ^= 0x5a;            // inside the nonce
  kvtest::Shared<int> forgerDone(1);  // the real rank 1 joins only after the forger's attempt has ended
  auto codes = runProcesses(3, [&](int who) {
    if (who == 0) {  // the root of a 2-rank group
      kvcomm::TcpBootstrap root(id, 0, 2, 20000);
      int v[2] = {3, 0};
      root.allgather(v, sizeof(int));
      return v[0] == 3 && v[1] == 7;
    }
    if (who == 1) {  // a forger: must be refused, then the real rank joins
      struct Done {
        kvtest::Shared<int>& flag;
        ~Done() { __atomic_store_n(&flag[0], 1, __ATOMIC_RELEASE); }
      } done{forgerDone};
      try {
        kvcomm::TcpBootstrap bad(forged, 1, 2, 20000);
        return false;
      } catch (const kvcomm::NetworkError& e) {
        std::string m = e.what();
        return m.find("nonce mismatch") != std::string::npos && m.find("rank 1") != std::string::npos;
      }
    }
    kvtest::waitFor([&] { return __atomic_load_n(&forgerDone[0], __ATOMIC_ACQUIRE) == 1; }, 20000);
    kvcomm::TcpBootstrap good(id, 1, 2, 20000);
    int v[2] = {0, 7};
    good.allgather(v, sizeof(int));
    return v[0] == 3 && v[1] == 7;
  });
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[1], 0) << "the forged nonce was not refused with a clear error";
  EXPECT_EQ(codes[2], 0);
}

TEST(TcpBootstrap, WrongProtocolVersionIsRefused) {
  kvcomm::UniqueId id = kvcomm::TcpBootstrap::createUniqueId();
  // The id itself carries the version: a client refuses an id from another protocol version before connecting.
  kvcomm::UniqueId other = id;
  other.bytes[4] ^= 0x40;
  try {
    kvcomm::TcpBootstrap b(other, 1, 2, 1000);
    FAIL() << "accepted an id of another protocol version";
  } catch (const kvcomm::InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("protocol version"), std::string::npos) << e.what();
  }
  // A peer speaking another version on the wire is refused by the root with a reason.
  auto codes = runProcesses(2, [&](int who) {
    if (who == 0) {
      kvcomm::TcpBootstrap root(id, 0, 2, 5000);
      return false;  // must time out: the only client was refused
    }
    kvcomm::detail::Hello h{};
    h.magic = kvcomm::detail::kWireMagic;
    h.version = kvcomm::kProtocolVersion + 1;
    h.kind = static_cast<uint32_t>(kvcomm::detail::HelloKind::Root);
    h.rank = 1;
    h.size = 2;
    std::memcpy(h.nonce.data(), id.bytes.data() + 8, 16);
    // The root address lives after magic, version and nonce: family, port, address.
    uint16_t family, port;
    std::memcpy(&family, id.bytes.data() + 24, 2);
    std::memcpy(&port, id.bytes.data() + 26, 2);
    kvcomm::detail::SockAddr a;
    auto* in = reinterpret_cast<sockaddr_in*>(&a.storage);
    in->sin_family = family;
    std::memcpy(&in->sin_addr, id.bytes.data() + 28, 4);
    a.len = sizeof(sockaddr_in);
    a.setPort(port);
    auto deadline = kvcomm::detail::deadlineIn(5000);
    kvcomm::detail::Fd fd = kvcomm::detail::connectTcp(a, deadline, "root");
    kvcomm::detail::sendAll(fd.get(), &h, sizeof(h), deadline, "root");
    kvcomm::detail::HelloReply reply{};
    kvcomm::detail::recvAll(fd.get(), &reply, sizeof(reply), deadline, "root");
    return reply.status != 0 && std::string(reply.message).find("protocol version mismatch") != std::string::npos;
  });
  EXPECT_NE(codes[0], 0) << "the root accepted a peer of another protocol version";
  EXPECT_EQ(codes[1], 0) << "the refusal did not name the protocol version";
}

TEST(TcpBootstrap, UnreachableRootFailsWithinTheTimeout) {
  kvcomm::UniqueId id = kvcomm::TcpBootstrap::createUniqueId();
  { kvcomm::TcpBootstrap solo(id, 0, 1, 1000); }  // adopts and then closes the root's listener: nobody listens now
  auto start = std::chrono::steady_clock::now();
  try {
    kvcomm::TcpBootstrap b(id, 1, 2, 1000);
    FAIL() << "connected to a root that does not exist";
  } catch (const kvcomm::Error& e) {
    EXPECT_EQ(e.code(), kvcomm::ErrorCode::Timeout) << e.what();
    EXPECT_NE(std::string(e.what()).find("bootstrap root"), std::string::npos) << e.what();
  }
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GE(ms, 900);
  EXPECT_LT(ms, 5000);
}

// A stale id (its root is gone) or a missing rank must not be a silent wait until the timeout: every waiting rank logs
// what it waits for within a few seconds (here: half the 2 s timeout), then fails naming what is missing.
TEST(TcpBootstrap, StaleIdSaysWhatItWaitsForBeforeTheTimeout) {
  kvcomm::UniqueId id = kvcomm::TcpBootstrap::createUniqueId();
  { kvcomm::TcpBootstrap solo(id, 0, 1, 1000); }  // the root is gone: the id is stale
  ::testing::internal::CaptureStderr();
  EXPECT_THROW(kvcomm::TcpBootstrap(id, 1, 2, 2000), kvcomm::NetworkError);
  std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("still waiting after 1."), std::string::npos) << log;
  EXPECT_NE(log.find("connecting to bootstrap root at"), std::string::npos) << log;
  EXPECT_NE(log.find("Connection refused"), std::string::npos) << log;
  EXPECT_NE(log.find("An id left from an earlier run names a root that is gone"), std::string::npos) << log;
}

TEST(TcpBootstrap, MissingRanksAreNamedWhileTheRootWaitsAndInItsError) {
  kvcomm::UniqueId id = kvcomm::TcpBootstrap::createUniqueId();
  auto codes = runProcesses(2, [&](int who) {
    ::testing::internal::CaptureStderr();
    std::string error;
    try {
      // Ranks 2 and 3 never come. Rank 1 waits longer than the root (its own 4 s and a grace for the root's
      // verdict), so it hears why the root gave up; it reports while waiting (at half its timeout).
      kvcomm::TcpBootstrap b(id, who, 4, who == 0 ? 3000 : 4000);
    } catch (const kvcomm::Error& e) {
      error = e.what();
    }
    std::string log = ::testing::internal::GetCapturedStderr();
    if (who == 0) {
      // The report names who is missing at that moment (rank 1 too, if it had not joined yet); the error at the
      // deadline names exactly the ranks that never came.
      bool ok = log.find(" of 4 ranks joined; waiting for rank(s) ") != std::string::npos &&
                log.find("2,3 (are they started") != std::string::npos &&
                error.find("only 2 of 4 ranks joined (missing: 2,3)") != std::string::npos;
      if (!ok) std::fprintf(stderr, "root log: %s\nroot error: %s\n", log.c_str(), error.c_str());
      return ok;
    }
    // What the root knows, not "timed out with 256 bytes missing".
    bool ok = log.find("rank 1 joined the bootstrap root") != std::string::npos &&
              error.find("the bootstrap root gave up: only 2 of 4 ranks joined (missing: 2,3)") != std::string::npos;
    if (!ok) std::fprintf(stderr, "rank 1 log: %s\nrank 1 error: %s\n", log.c_str(), error.c_str());
    return ok;
  });
  EXPECT_EQ(codes[0], 0) << "the root did not name the missing ranks";
  EXPECT_EQ(codes[1], 0) << "a joined rank did not say it waits for the others";
}

// A rank that joined and was then interrupted (killed before the others came) is no longer counted: the root says so,
// a restarted rank takes its place, and the group forms without a "Broken pipe" at the end.
TEST(TcpBootstrap, ARankThatJoinedAndLeftIsDroppedAndCanRejoin) {
  kvcomm::UniqueId id = kvcomm::TcpBootstrap::createUniqueId();
  kvtest::Shared<int32_t> gate(1);
  kvtest::Shared<char> rootLog(2048);
  kvtest::Children kids(4, [&](int rank) {
    if (rank != 0) kvtest::waitFor([&] { return __atomic_load_n(&gate[0], __ATOMIC_ACQUIRE) == 1; }, 30000);
    if (rank == 0) ::testing::internal::CaptureStderr();
    auto boot = std::make_shared<kvcomm::TcpBootstrap>(id, rank, 4, 30000);
    if (rank == 0) {
      std::string log = ::testing::internal::GetCapturedStderr();
      std::snprintf(rootLog.data(), 2048, "%s", log.c_str());
    }
    auto comm = kvcomm::Communicator::create(boot);
    comm.barrier();
    return true;
  });
  // An early rank 2 joins (a valid hello, as TcpBootstrap sends it) and is killed while it waits for the table; only
  // then do ranks 1, 2 and 3 start.
  kvtest::Shared<int32_t> joined(1);
  pid_t early = fork();
  if (early == 0) {
    kvcomm::detail::IdWire w = kvcomm::detail::decodeUniqueId(id);
    auto deadline = kvcomm::detail::deadlineIn(30000);
    kvcomm::detail::Fd fd = kvcomm::detail::connectTcp(kvcomm::detail::idAddress(w), deadline, "root");
    kvcomm::detail::Hello h{};
    h.magic = kvcomm::detail::kWireMagic;
    h.version = kvcomm::kProtocolVersion;
    h.kind = static_cast<uint32_t>(kvcomm::detail::HelloKind::Root);
    h.rank = 2;
    h.size = 4;
    h.nonce = w.nonce;
    h.listenAddr = kvcomm::detail::idAddress(w);  // any valid address: it never gets the table
    kvcomm::detail::sendAll(fd.get(), &h, sizeof(h), deadline, "hello to root");
    __atomic_store_n(&joined[0], 1, __ATOMIC_RELEASE);
    pause();
    _exit(0);
  }
  ASSERT_GT(early, 0);
  ASSERT_TRUE(kvtest::waitFor([&] { return __atomic_load_n(&joined[0], __ATOMIC_ACQUIRE) == 1; }, 30000));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // the root reads the hello (its poll wakes at once)
  ::kill(early, SIGKILL);
  int st = 0;
  ::waitpid(early, &st, 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the root drops it at once (its poll wakes)
  __atomic_store_n(&gate[0], 1, __ATOMIC_RELEASE);
  auto codes = kids.wait(60);
  for (int r = 0; r < 4; ++r) EXPECT_EQ(codes[static_cast<size_t>(r)], 0) << "rank " << r;
  EXPECT_NE(std::string(rootLog.data()).find("rank 2 joined and then left (its connection closed)"), std::string::npos)
      << rootLog.data();
}

TEST(TcpBootstrap, DeadPeerIsAnErrorNotAHang) {
  kvcomm::UniqueId id = kvcomm::TcpBootstrap::createUniqueId();
  auto codes = runProcesses(2, [&](int rank) {
    auto boot = std::make_shared<kvcomm::TcpBootstrap>(id, rank, 2, 30000);
    try {
      // Rank 1 may finish create() and die while rank 0 is still in create()'s last exchange: the same error there.
      auto comm = kvcomm::Communicator::create(boot);
      if (rank == 1) _exit(0);  // dies without a word
      comm.barrier();
      return false;
    } catch (const kvcomm::NetworkError& e) {
      return std::string(e.what()).find("rank 1 is gone") != std::string::npos;
    }
  });
  EXPECT_EQ(codes[0], 0);
}

// Deadlines of every wait (bootstrap, mesh, fd fetch, FetchOperation::wait): a huge timeout is no bound, never a
// deadline that wrapped into the past and expires at once.
TEST(Deadline, HugeTimeoutsAreNoBoundNotAWrappedDeadline) {
  using kvcomm::detail::Clock;
  using kvcomm::detail::deadlineIn;
  using kvcomm::detail::msLeft;
  const Clock::time_point never = Clock::time_point::max();
  EXPECT_EQ(deadlineIn(-1), never);
  EXPECT_EQ(deadlineIn(INT64_MIN), never);
  for (int64_t ms : {INT64_MAX, INT64_MAX / 1000, int64_t{9223372036855}, int64_t{1000000000001}}) {
    EXPECT_EQ(deadlineIn(ms), never) << ms << " ms";
    EXPECT_EQ(msLeft(deadlineIn(ms)), -1) << ms << " ms";
  }
  // Up to 10^12 ms (31 years) the deadline is real, and in the future.
  const Clock::time_point before = Clock::now();
  const Clock::time_point far = deadlineIn(1000000000000);
  EXPECT_NE(far, never);
  EXPECT_GT(far, before + std::chrono::hours(24 * 365 * 31));
  EXPECT_EQ(msLeft(far), INT_MAX);
  const int left = msLeft(deadlineIn(5000));
  EXPECT_GT(left, 4000);
  EXPECT_LE(left, 5000);
  EXPECT_EQ(msLeft(deadlineIn(0)), 0);
}

TEST(UniqueId, TextRoundTrip) {
  kvcomm::UniqueId id = kvcomm::TcpBootstrap::createUniqueId();
  EXPECT_EQ(kvcomm::UniqueId::fromString(id.toString()).bytes, id.bytes);
  EXPECT_THROW(kvcomm::UniqueId::fromString("zz"), kvcomm::InvalidArgumentError);
}

}  // namespace
