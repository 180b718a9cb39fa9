// SymmetricBuffer under mpirun: every test runs on the host backend, and on the CUDA backend where a GPU is present.
#include <gtest/gtest.h>
#include <mpi.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "kvcomm/error.hpp"
#include "kvcomm/symm.hpp"
#include "mpi/mpi_util.hpp"
#include "support/expect_error.hpp"
#include "symm/fd_exchange.hpp"
#include "verify/memory.hpp"

namespace {

using kvcomm::MemoryKind;
using kvcomm::Range;
using kvcomm::SymmetricBuffer;

class Symm : public kvtest::BackendTest {
 protected:
  void put(void* dst, const std::vector<uint8_t>& v) { kvtest::toMemory(kind_, dst, v.data(), v.size()); }
  std::vector<uint8_t> get(const void* src, size_t n) {
    std::vector<uint8_t> v(n);
    kvtest::fromMemory(kind_, v.data(), src, n);
    return v;
  }
};

TEST_P(Symm, EveryRankReadsEveryMembersPatternThroughPeerPointers) {
  auto world = kvtest::tcpWorld();
  const size_t bytes = 3u << 20;
  auto buf = SymmetricBuffer::create(world, 64u << 20, bytes, kind_);
  ASSERT_GE(buf.mappedBytes(), bytes);
  put(buf.local(), kvtest::pattern(seed_, world.rank(), bytes));
  world.barrier();
  for (int r = 0; r < world.size(); ++r) {
    ASSERT_TRUE(buf.isMapped(r));
    EXPECT_EQ(get(buf.peer(r), bytes), kvtest::pattern(seed_, r, bytes)) << "rank " << r << "'s memory";
  }
  world.barrier();
}

TEST_P(Symm, SixteenGrowthsKeepAddressesAndBytes) {
  auto world = kvtest::tcpWorld();
  int n = world.size(), me = world.rank();
  auto buf = SymmetricBuffer::create(world, 1, 1, kind_);  // probe the granularity
  size_t g = buf.granularity();
  buf = SymmetricBuffer::create(world, 17 * g, g, kind_);
  void* local = buf.local();
  std::vector<void*> peers;
  for (int r = 0; r < n; ++r) peers.push_back(buf.peer(r));
  const uint64_t* table = buf.peerTable();
  put(local, kvtest::pattern(seed_, 1000 + me, g));
  for (int step = 1; step <= 16; ++step) {
    buf.grow((step + 1) * g);
    ASSERT_EQ(buf.mappedBytes(), (step + 1) * g);
    ASSERT_EQ(buf.local(), local);
    ASSERT_EQ(buf.peerTable(), table);
    for (int r = 0; r < n; ++r) ASSERT_EQ(buf.peer(r), peers[static_cast<size_t>(r)]);
    // Write the new region of the next rank through its peer mapping; read ours back after the barrier.
    int next = (me + 1) % n, prev = (me + n - 1) % n;
    put(static_cast<char*>(buf.peer(next)) + step * g, kvtest::pattern(seed_, step * 100 + me, g));
    world.barrier();
    EXPECT_EQ(get(static_cast<char*>(local) + step * g, g), kvtest::pattern(seed_, step * 100 + prev, g))
        << "growth " << step;
    world.barrier();
  }
  for (int r = 0; r < n; ++r)
    EXPECT_EQ(get(buf.peer(r), g), kvtest::pattern(seed_, 1000 + r, g)) << "old bytes of rank " << r;
  world.barrier();
}

TEST_P(Symm, ThousandCreateGrowDestroyCyclesLeakNothing) {
  auto world = kvtest::tcpWorld();
  int cycles = kind_ == MemoryKind::Cuda ? 200 : 1000;
  auto cycle = [&] {
    auto buf = SymmetricBuffer::create(world, 8u << 20, 1, kind_);
    buf.grow(2 * buf.granularity());
  };
  cycle();  // warm-up: the fd server, mesh connections and driver state exist from here on
  world.barrier();
  int fds = kvtest::countFds(), maps = kvtest::countMappings();
  for (int i = 0; i < cycles; ++i) cycle();
  world.barrier();
  // A leak per cycle would show as >= `cycles` extra entries; a few may come and go with the MPI runtime's own
  // connections and the allocator's arenas, which no cycle owns.
  EXPECT_LE(kvtest::countFds(), fds + 4) << "file descriptors leaked over " << cycles << " cycles";
  EXPECT_LE(kvtest::countMappings(), maps + 4) << "mappings leaked over " << cycles << " cycles";
  EXPECT_EQ(kvcomm::detail::FdServer::instance().liveTokens(), 0u);
}

TEST_P(Symm, SizeMismatchFailsOnEveryRankNamingTheRank) {
  auto world = kvtest::tcpWorld();
  if (world.size() < 2) GTEST_SKIP() << "needs 2 ranks";
  int odd = world.size() - 1;
  size_t cap = (world.rank() == odd ? 32u : 16u) << 20;
  try {
    auto buf = SymmetricBuffer::create(world, cap, 1u << 20, kind_);
    ADD_FAILURE() << "mismatched capacities were accepted";
  } catch (const kvcomm::InvalidArgumentError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("capacity must be the same on every member: world rank " + std::to_string(odd) + " has"),
              std::string::npos)
        << m;
  }
  // The group is still usable afterwards: nothing was left half done.
  auto buf = SymmetricBuffer::create(world, 16u << 20, 1u << 20, kind_);
  try {
    buf.grow(world.rank() == 0 ? (4u << 20) : (2u << 20));
    ADD_FAILURE() << "mismatched growth was accepted";
  } catch (const kvcomm::InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("newBytes must be the same on every member"), std::string::npos) << e.what();
  }
  EXPECT_EQ(buf.mappedBytes(), 1u << 20 < buf.granularity() ? buf.granularity() : (1u << 20));
  world.barrier();
}

// isBacked never forms offset + bytes: sizes near SIZE_MAX are refused instead of wrapping round to a small end.
TEST_P(Symm, IsBackedNeverWrapsAround) {
  auto world = kvtest::tcpWorld();
  const size_t g = kvtest::EngineCache::granularityOf(kind_);
  auto buf = SymmetricBuffer::create(world, 16 * g, 4 * g, kind_);
  const size_t mapped = buf.mappedBytes();
  ASSERT_EQ(mapped, 4 * g);
  EXPECT_TRUE(buf.isBacked(0, mapped));
  EXPECT_TRUE(buf.isBacked(4096, mapped - 4096));
  EXPECT_TRUE(buf.isBacked(mapped, 0));
  EXPECT_FALSE(buf.isBacked(4096, mapped - 4095));
  EXPECT_FALSE(buf.isBacked(4096, SIZE_MAX - 100)) << "4096 + (SIZE_MAX - 100) wraps to 3995";
  EXPECT_FALSE(buf.isBacked(g, SIZE_MAX - g + 1)) << "g + (SIZE_MAX - g + 1) wraps to 0";
  EXPECT_FALSE(buf.isBacked(SIZE_MAX, 1));
  EXPECT_FALSE(buf.isBacked(SIZE_MAX - 10, 20));
  EXPECT_FALSE(buf.isBacked(mapped + g, SIZE_MAX - mapped - g + 1));
  // An adopted buffer with a hole: a start inside the hole, and a length that wraps from inside a range.
  kvtest::EngineCache cache(kind_, 8 * g);
  cache.commit(0, g);
  cache.commit(2 * g, g);
  auto adopted = SymmetricBuffer::adopt(world, cache.base(), 8 * g, kind_);
  adopted.commit({{0, g}, {2 * g, g}});
  EXPECT_TRUE(adopted.isBacked(2 * g + 8, g - 8));
  EXPECT_FALSE(adopted.isBacked(g + 8, 8)) << "inside the hole";
  EXPECT_FALSE(adopted.isBacked(2 * g + 8, SIZE_MAX - 2 * g)) << "wraps from inside the second range";
  EXPECT_FALSE(adopted.isBacked(8, SIZE_MAX - 7)) << "wraps to 0 from inside the first range";
  world.barrier();
}

// Sizes within a granule of SIZE_MAX would round up to 0: refused as InvalidArgumentError on every rank, before
// anything is reserved (grow used to do nothing, create to fail in mmap with a SystemError).
TEST_P(Symm, SizesThatWouldWrapWhenRoundedAreInvalidArguments) {
  auto world = kvtest::tcpWorld();
  const size_t g = kvtest::EngineCache::granularityOf(kind_);
  auto refused = [&](const char* what, auto&& call, const char* needle) {
    try {
      call();
      ADD_FAILURE() << what << " was accepted";
    } catch (const kvcomm::InvalidArgumentError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << what << ": " << e.what();
    } catch (const kvcomm::Error& e) {
      ADD_FAILURE() << what << ": " << kvcomm::errorCodeName(e.code()) << " instead of InvalidArgument: " << e.what();
    }
  };
  refused(
      "create(SIZE_MAX, 0)", [&] { SymmetricBuffer::create(world, SIZE_MAX, 0, kind_); }, "capacity");
  refused(
      "create(SIZE_MAX - 1, g)", [&] { SymmetricBuffer::create(world, SIZE_MAX - 1, g, kind_); }, "capacity");
  refused(
      "create(4g, SIZE_MAX)", [&] { SymmetricBuffer::create(world, 4 * g, SIZE_MAX, kind_); }, "initialBytes");
  auto buf = SymmetricBuffer::create(world, 4 * g, g, kind_);
  const uint64_t gen = buf.generation();
  refused(
      "grow(SIZE_MAX)", [&] { buf.grow(SIZE_MAX); }, "newBytes 18446744073709551615 exceeds the capacity");
  refused(
      "grow(SIZE_MAX - g + 2)", [&] { buf.grow(SIZE_MAX - g + 2); }, "exceeds the capacity");
  refused(
      "grow(4g + 1)", [&] { buf.grow(4 * g + 1); }, "exceeds the capacity");
  EXPECT_EQ(buf.mappedBytes(), g);
  EXPECT_EQ(buf.generation(), gen);
  buf.grow(4 * g);  // the group is still in step
  EXPECT_EQ(buf.mappedBytes(), 4 * g);
  world.barrier();
}

TEST_P(Symm, PcpSubgroupMapsExactlyItsMembers) {
  auto world = kvtest::tcpWorld();
  if (world.size() != 4) GTEST_SKIP() << "needs TP2/PCP2 = 4 ranks";
  auto layout = kvcomm::ParallelGroups::create(world, {2, 2, 1, 1});
  auto buf = SymmetricBuffer::create(layout.pcp, 4u << 20, 1u << 20, kind_);
  ASSERT_EQ(buf.size(), 2);
  int partner = 1 - buf.rank();
  ASSERT_TRUE(buf.isMapped(partner));
  kvtest::fillMemory(kind_, buf.local(), 0xEE, 1u << 20);
  world.barrier();
  // Each rank stamps its world rank into its PCP partner's memory.
  int stamp = world.rank();
  std::vector<uint8_t> v(sizeof(int));
  std::memcpy(v.data(), &stamp, sizeof(int));
  put(buf.peer(partner), v);
  world.barrier();
  int got = -1;
  auto back = get(buf.local(), sizeof(int));
  std::memcpy(&got, back.data(), sizeof(int));
  EXPECT_EQ(got, layout.pcp.worldRank(partner)) << "a non-member wrote into this rank's PCP replica";
  EXPECT_EQ(kvcomm::ParallelGroups::coordOf({2, 2, 1, 1}, got).tp, layout.coord.tp)
      << "publication crossed TP coordinates";
  world.barrier();
}

TEST_P(Symm, SameAdoptedMemoryInPcpAndTpGroupsHasTwoPeerTables) {
  auto world = kvtest::tcpWorld();
  if (world.size() != 4) GTEST_SKIP() << "needs TP2/PCP2 = 4 ranks";
  auto layout = kvcomm::ParallelGroups::create(world, {2, 2, 1, 1});
  kvtest::EngineCache cache(kind_, 8u << 20);
  size_t g = cache.granularity();
  cache.commit(0, 2 * g);
  auto pcp = SymmetricBuffer::adopt(layout.pcp, cache.base(), 8u << 20, kind_);
  auto tp = SymmetricBuffer::adopt(layout.tp, cache.base(), 8u << 20, kind_);
  pcp.commit({{0, 2 * g}});
  tp.commit({{0, 2 * g}});
  put(cache.base(), kvtest::pattern(seed_, world.rank(), 2 * g));
  world.barrier();
  for (auto* b : {&pcp, &tp}) {
    ASSERT_EQ(b->local(), cache.base());
    std::vector<uint64_t> table(2);
    kvtest::fromMemory(kind_, table.data(), b->peerTable(), 2 * sizeof(uint64_t));
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(table[static_cast<size_t>(r)], reinterpret_cast<uint64_t>(b->peer(r)));
      EXPECT_EQ(get(b->peer(r), 2 * g), kvtest::pattern(seed_, b->communicator().worldRank(r), 2 * g));
    }
  }
  EXPECT_NE(pcp.peerTable(), tp.peerTable());
  world.barrier();
}

TEST_P(Symm, AdoptCommitReleaseRecommitKeepsAddresses) {
  auto world = kvtest::tcpWorld();
  int n = world.size();
  const size_t g = kvtest::EngineCache::granularityOf(kind_);
  const size_t seg = 16 * g;  // one segment per "layer"
  kvtest::EngineCache cache(kind_, 4 * seg);
  // A prefix of every segment, chunks of varying size, gaps between them; segment 1 has two allocations.
  cache.commit(0, g);
  cache.commit(seg, g);
  cache.commit(seg + g, 3 * g);
  cache.commit(2 * seg, 2 * g);
  std::vector<Range> ranges = {{0, g}, {seg, 4 * g}, {2 * seg, 2 * g}};
  auto buf = SymmetricBuffer::adopt(world, cache.base(), 4 * seg, kind_);
  const uint64_t* table = buf.peerTable();
  std::vector<void*> peers;
  for (int r = 0; r < n; ++r) peers.push_back(buf.peer(r));
  buf.commit(ranges);
  EXPECT_EQ(buf.mappedBytes(), 7 * g);
  EXPECT_TRUE(buf.isBacked(seg, 4 * g));
  EXPECT_FALSE(buf.isBacked(seg, 5 * g));
  for (const Range& rg : ranges)
    put(cache.base() + rg.offset, kvtest::pattern(seed_, world.rank() * 16 + rg.offset / g, rg.bytes));
  world.barrier();
  for (int r = 0; r < n; ++r)
    for (const Range& rg : ranges)
      EXPECT_EQ(get(static_cast<char*>(buf.peer(r)) + rg.offset, rg.bytes),
                kvtest::pattern(seed_, r * 16 + rg.offset / g, rg.bytes))
          << "rank " << r << " range at " << rg.offset;
  world.barrier();
  // Sleep mode: release segment 1, the engine recommits the same VAs with new physical memory.
  buf.release({{seg, 4 * g}});
  EXPECT_FALSE(buf.isBacked(seg, g));
  {  // the bitmap kernels read says the same
    std::vector<uint64_t> bits((4 * seg / g + 63) / 64 + 1);
    kvtest::fromMemory(kind_, bits.data(), buf.backedBitmap(), bits.size() * sizeof(uint64_t));
    auto bit = [&](size_t off) { return (bits[off / g / 64] >> (off / g % 64)) & 1u; };
    EXPECT_EQ(bit(0), 1u);
    EXPECT_EQ(bit(seg), 0u);
    EXPECT_EQ(bit(2 * seg + g), 1u);
    EXPECT_EQ(bit(2 * seg + 2 * g), 0u);
  }
  cache.release(seg);
  cache.release(seg + g);
  cache.commit(seg, 4 * g);
  buf.commit({{seg, 4 * g}});
  put(cache.base() + seg, kvtest::pattern(seed_, 5000 + world.rank(), 4 * g));
  world.barrier();
  EXPECT_EQ(buf.peerTable(), table);
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(buf.peer(r), peers[static_cast<size_t>(r)]);
    EXPECT_EQ(get(static_cast<char*>(buf.peer(r)) + seg, 4 * g), kvtest::pattern(seed_, 5000 + r, 4 * g));
    EXPECT_EQ(get(buf.peer(r), g), kvtest::pattern(seed_, r * 16, g)) << "untouched segment 0 changed";
  }
  world.barrier();
}

TEST_P(Symm, CommitRefusesUnbackedAndNonExportableRanges) {
  auto world = kvtest::tcpWorld();
  kvtest::EngineCache cache(kind_, 8u << 21);
  size_t g = cache.granularity();
  cache.commit(0, g);
  cache.commit(2 * g, g, /*exportable=*/false);
  auto buf = SymmetricBuffer::adopt(world, cache.base(), 8u << 21, kind_);
  try {
    buf.commit({{0, 2 * g}});  // [g, 2g) is a hole
    ADD_FAILURE() << "an unmapped range was accepted";
  } catch (const kvcomm::InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("not mapped"), std::string::npos) << e.what();
  }
  try {
    buf.commit({{2 * g, g}});
    ADD_FAILURE() << "a non-exportable allocation was accepted";
  } catch (const kvcomm::InvalidArgumentError& e) {
    std::string need = kind_ == MemoryKind::Cuda ? "CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR" : "MAP_SHARED";
    EXPECT_NE(std::string(e.what()).find(need), std::string::npos) << e.what();
  }
  EXPECT_EQ(buf.mappedBytes(), 0u);
  buf.commit({{0, g}});  // still usable
  EXPECT_EQ(buf.mappedBytes(), g);
  world.barrier();
}

// `base` may differ per rank, so adopt checks it inside the vote: one rank's bad base fails every rank at once (no
// rank waits for a timeout), each naming the rank at fault; the group stays usable.
TEST_P(Symm, AdoptBadBaseOnOneRankFailsEveryRankNamingIt) {
  auto world = kvtest::tcpWorld();
  if (world.size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const int odd = world.size() - 1;
  const int null = world.size() >= 3 ? 1 : -1;  // a second culprit, with a null base
  kvtest::EngineCache cache(kind_, 8u << 21);
  char* base = cache.base();
  if (world.rank() == odd) base += 1;
  if (world.rank() == null) base = nullptr;
  auto start = std::chrono::steady_clock::now();
  try {
    auto buf = SymmetricBuffer::adopt(world, base, 8u << 21, kind_);
    ADD_FAILURE() << "a misaligned base on rank " << odd << " was accepted";
  } catch (const kvcomm::InvalidArgumentError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("SymmetricBuffer::adopt (reservation): failed on rank "), std::string::npos) << m;
    EXPECT_NE(m.find("rank " + std::to_string(odd) + ": "), std::string::npos) << m;
    if (null >= 0) {
      EXPECT_NE(m.find("rank " + std::to_string(null) + ": "), std::string::npos) << m;
    }
    EXPECT_NE(m.find("must be non-zero multiples of the"), std::string::npos) << m;
    EXPECT_EQ(m.find("rank 0: "), std::string::npos) << "rank 0's base was good: " << m;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5)) << "a rank waited for a timeout";
  auto buf = SymmetricBuffer::adopt(world, cache.base(), 8u << 21, kind_);
  EXPECT_EQ(buf.local(), cache.base());
  world.barrier();
}

TEST_P(Symm, PeerStillReadsAClosedRanksLastBytes) {
  auto world = kvtest::tcpWorld();
  if (world.size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const size_t bytes = 1u << 20;
  auto buf = SymmetricBuffer::create(world, 4u << 20, bytes, kind_);
  put(buf.local(), kvtest::pattern(seed_, 77 + world.rank(), bytes));
  world.barrier();
  if (world.rank() == 0) buf.close();  // local: returns without waiting for anyone
  world.barrier();
  if (world.rank() != 0) {
    EXPECT_EQ(get(buf.peer(0), bytes), kvtest::pattern(seed_, 77, bytes));
  }
  world.barrier();
  buf.close();
  buf.close();  // idempotent
  EXPECT_THROW(buf.grow(2 * bytes), kvcomm::InvalidArgumentError);
}

TEST_P(Symm, LegacyCudaIpcFallback) {
  if (kind_ != MemoryKind::Cuda) GTEST_SKIP() << "legacy CUDA IPC is a CUDA handle type";
  auto world = kvtest::tcpWorld();
  setenv("KVCOMM_HANDLE_TYPE", "ipc", 1);
  auto buf = SymmetricBuffer::create(world, 8u << 20, 4u << 20, kind_);
  EXPECT_EQ(buf.handleType(), "cuda_ipc");
  put(buf.local(), kvtest::pattern(seed_, 300 + world.rank(), 4u << 20));
  world.barrier();
  for (int r = 0; r < world.size(); ++r)
    EXPECT_EQ(get(buf.peer(r), 4u << 20), kvtest::pattern(seed_, 300 + r, 4u << 20)) << "rank " << r;
  buf.grow(8u << 20);  // the whole capacity was allocated up front
  EXPECT_EQ(buf.mappedBytes(), 8u << 20);
  EXPECT_THROW(buf.grow(16u << 20), kvcomm::InvalidArgumentError);
  kvtest::EngineCache cache(kind_, 8u << 20);
  try {
    auto adopted = SymmetricBuffer::adopt(world, cache.base(), 8u << 20, kind_);
    ADD_FAILURE() << "legacy IPC adopted VMM memory";
  } catch (const kvcomm::InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("POSIX_FILE_DESCRIPTOR"), std::string::npos) << e.what();
  }
  unsetenv("KVCOMM_HANDLE_TYPE");
  world.barrier();
}

INSTANTIATE_TEST_SUITE_P(Backends, Symm, ::testing::Values(MemoryKind::Host, MemoryKind::Cuda), kvtest::kindName);

// One-use tokens, with the real fd server of another process.
// A MemoryKind outside the enum (an integer cast by the caller) is refused by create and adopt, naming the call and
// the value, before any collective step (every rank throws alike; nothing is allocated).
TEST(SymmArguments, KindOutsideTheEnumIsRefused) {
  auto world = kvtest::tcpWorld();
  const auto bad = static_cast<MemoryKind>(5);
  auto refused = [&](const std::function<void()>& f, const char* call) {
    try {
      f();
      ADD_FAILURE() << call << " accepted MemoryKind 5";
    } catch (const kvcomm::InvalidArgumentError& e) {
      for (const char* part : {call, "kind 5"})
        EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  refused([&] { SymmetricBuffer::create(world, 1u << 20, 1u << 20, bad); }, "SymmetricBuffer::create");
  std::vector<char> reserved(1u << 20);
  refused([&] { SymmetricBuffer::adopt(world, reserved.data(), reserved.size(), bad); }, "SymmetricBuffer::adopt");
  auto ok = SymmetricBuffer::create(world, 1u << 20, 1u << 20, MemoryKind::Host);  // the group is still in step
  EXPECT_EQ(ok.kind(), MemoryKind::Host);
  world.barrier();
}

// Every method of an empty (default-constructed or moved-from) buffer throws InvalidArgumentError naming it, except
// valid(), close() (idempotent: nothing to close) and isBacked() (false).
TEST(SymmArguments, EveryAccessorOfAnEmptyBufferThrows) {
  auto world = kvtest::tcpWorld();
  auto made = SymmetricBuffer::create(world, 1u << 20, 1u << 20, MemoryKind::Host);
  SymmetricBuffer taken = std::move(made);
  EXPECT_TRUE(taken.valid());
  SymmetricBuffer fresh;
  for (SymmetricBuffer* b : {&fresh, &made}) {
    EXPECT_FALSE(b->valid());
    auto empty = [&](const std::function<void()>& f, const char* call) {
      kvtest::expectError(f, kvcomm::ErrorCode::InvalidArgument, {call, "empty"});
    };
    empty([&] { (void)b->local(); }, "SymmetricBuffer::local");
    empty([&] { (void)b->peer(0); }, "SymmetricBuffer::peer");
    empty([&] { (void)b->isMapped(0); }, "SymmetricBuffer::isMapped");
    empty([&] { (void)b->rank(); }, "SymmetricBuffer::rank");
    empty([&] { (void)b->size(); }, "SymmetricBuffer::size");
    empty([&] { (void)b->capacity(); }, "SymmetricBuffer::capacity");
    empty([&] { (void)b->mappedBytes(); }, "SymmetricBuffer::mappedBytes");
    empty([&] { (void)b->backedRanges(); }, "SymmetricBuffer::backedRanges");
    empty([&] { (void)b->generation(); }, "SymmetricBuffer::generation");
    empty([&] { (void)b->granularity(); }, "SymmetricBuffer::granularity");
    empty([&] { (void)b->kind(); }, "SymmetricBuffer::kind");
    empty([&] { (void)b->adopted(); }, "SymmetricBuffer::adopted");
    empty([&] { (void)b->handleType(); }, "SymmetricBuffer::handleType");
    empty([&] { (void)b->communicator(); }, "SymmetricBuffer::communicator");
    empty([&] { (void)b->deviceHandle(); }, "SymmetricBuffer::deviceHandle");
    empty([&] { (void)b->peerTable(); }, "SymmetricBuffer::peerTable");
    empty([&] { (void)b->backedBitmap(); }, "SymmetricBuffer::backedBitmap");
    empty([&] { b->grow(2u << 20); }, "SymmetricBuffer::grow");
    empty([&] { b->commit({{0, 4096}}); }, "SymmetricBuffer::commit");
    empty([&] { b->release({{0, 4096}}); }, "SymmetricBuffer::release");
    EXPECT_FALSE(b->isBacked(0, 1));
    b->close();
  }
  world.barrier();
}

TEST(FdTokens, ForgedReplayedExpiredAndStolenTokensGetNoFd) {
  auto world = kvtest::tcpWorld();
  if (world.size() < 2) GTEST_SKIP() << "needs 2 ranks";
  struct Info {
    int pid;
    char name[48];
  };
  std::vector<Info> info(static_cast<size_t>(world.size()));
  auto& server = kvcomm::detail::FdServer::instance();
  info[static_cast<size_t>(world.rank())].pid = getpid();
  std::snprintf(info[static_cast<size_t>(world.rank())].name, 48, "%s", server.name().c_str());
  world.allgather(info.data(), sizeof(Info));
  const uint64_t bufferId = 0xabcdef, gen = 3;
  kvcomm::detail::Token tokens[2];
  if (world.rank() == 0) {
    auto set = std::make_shared<kvcomm::detail::ExportSet>();
    int fd = memfd_create("token-test", MFD_CLOEXEC);
    ASSERT_EQ(ftruncate(fd, 4096), 0);
    set->fds.emplace_back(fd);
    set->metas.push_back({0, 4096, 0, 4096});
    tokens[0] = server.offer(bufferId, gen, 1, info[1].pid, getuid(), set);
    tokens[1] = server.offer(bufferId, gen + 1, 1, info[1].pid, getuid(), set);
    world.send(tokens, sizeof(tokens), 1, 9);
    for (int r = 2; r < world.size(); ++r) world.send(tokens, sizeof(tokens), r, 9);
  } else {
    world.recv(tokens, sizeof(tokens), 0, 9);
  }
  world.barrier();  // every rank holds the tokens
  auto refused = [&](const kvcomm::detail::Token& t, uint64_t g, const char* expect) {
    int before = kvtest::countFds();
    try {
      kvcomm::detail::fetchFds(info[0].name, t, bufferId, g, 1, 5000);
      return false;
    } catch (const kvcomm::NetworkError& e) {
      return std::string(e.what()).find(expect) != std::string::npos && kvtest::countFds() == before;
    }
  };
  if (world.rank() >= 2) {  // a stolen token: right token, wrong process
    EXPECT_TRUE(refused(tokens[0], gen, "issued to pid"));
  }
  world.barrier();
  if (world.rank() == 1) {
    kvcomm::detail::Token forged = tokens[0];
    forged[5] ^= 1;
    EXPECT_TRUE(refused(forged, gen, "token refused"));
    auto got = kvcomm::detail::fetchFds(info[0].name, tokens[0], bufferId, gen, 1, 5000);
    ASSERT_EQ(got.fds.size(), 1u);
    EXPECT_EQ(lseek(got.fds[0].get(), 0, SEEK_END), 4096);
    EXPECT_TRUE(refused(tokens[0], gen, "token refused")) << "a replayed token was honoured";
  }
  world.barrier();
  if (world.rank() == 0) server.retire(bufferId, gen + 1);
  world.barrier();
  if (world.rank() == 1) {
    EXPECT_TRUE(refused(tokens[1], gen + 1, "token refused")) << "an expired token was honoured";
  }
  world.barrier();
  if (world.rank() == 0) server.retire(bufferId, gen);
}

}  // namespace
