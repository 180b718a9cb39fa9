// publish + barrier under mpirun, on the host backend and (where a GPU is present) the CUDA backend, compared byte
// for byte with an independent gather-then-insert oracle over a poisoned cache region.
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kvcomm/error.hpp"
#include "kvcomm/publish.hpp"
#include "mpi/mpi_util.hpp"
#include "support/expect_error.hpp"
#include "support/scoped_env.hpp"
#include "verify/memory.hpp"
#include "verify/publish_oracle.hpp"

namespace {

using kvtest::ScopedEnv;

using kvcomm::MemoryKind;
using kvcomm::Publisher;
using kvcomm::SlotType;
using kvcomm::SymmetricBuffer;
using kvtest::CacheLayout;
using kvtest::Geometry;
using kvtest::Inputs;

// A call's inputs in the buffer's memory kind.
struct Staged {
  std::vector<std::unique_ptr<kvtest::Memory>> rows;
  std::unique_ptr<kvtest::Memory> slots;
  std::vector<kvcomm::CacheTensor> tensors;
  SlotType type = SlotType::Int64;
  size_t tokens = 0;
};

class Publish : public kvtest::BackendTest {
 protected:
  Staged stage(const Geometry& g, const Inputs& in, SlotType type) {
    Staged s;
    s.type = type;
    s.tokens = in.slots.size();
    for (size_t k = 0; k < g.tensors.size(); ++k) {
      s.rows.push_back(std::make_unique<kvtest::Memory>(kind_, in.rows[k].size()));
      kvtest::toMemory(kind_, s.rows.back()->data(), in.rows[k].data(), in.rows[k].size());
      kvcomm::CacheTensor t = g.tensors[k];
      t.src = s.rows.back()->data();
      t.srcStride = in.srcStride[k];
      s.tensors.push_back(t);
    }
    size_t bytes = s.tokens * (type == SlotType::Int64 ? 8 : 4);
    s.slots = std::make_unique<kvtest::Memory>(kind_, bytes);
    if (type == SlotType::Int64) {
      kvtest::toMemory(kind_, s.slots->data(), in.slots.data(), bytes);
    } else {
      auto narrow = kvtest::slots32(in);
      kvtest::toMemory(kind_, s.slots->data(), narrow.data(), bytes);
    }
    return s;
  }

  std::vector<uint8_t> oracle(const Geometry& g, int size, size_t tokens, uint64_t seed, uint64_t salt = 0) {
    std::vector<uint8_t> image(g.regionBytes, kvtest::kPoison);
    for (int r = 0; r < size; ++r) kvtest::applyOracle(image, g, kvtest::makeInputs(seed, r, size, tokens, g, salt));
    return image;
  }

  std::vector<uint8_t> replica(const SymmetricBuffer& buf, size_t bytes) {
    kvtest::synchronize(kind_);
    std::vector<uint8_t> v(bytes);
    kvtest::fromMemory(kind_, v.data(), buf.local(), bytes);
    return v;
  }

  // How a scenario synchronises after its rows: publish() then barrier(), or one of the fused calls.
  enum class Then { Barrier, FusedBarrier, FusedSignalThenWait };

  // One scenario end to end on `buf`: poison, publish every rank's rows, barrier, compare with the oracle.
  void runScenario(SymmetricBuffer& buf, Publisher& pub, CacheLayout layout, size_t rowBytes, size_t tokens,
                   SlotType type, uint64_t seed, Then then = Then::Barrier) {
    Communicator& comm = buf.communicator();
    Geometry g = kvtest::makeGeometry(layout, rowBytes, comm.size() * tokens + tokens / 4 + 16);
    ASSERT_LE(g.regionBytes, buf.mappedBytes());
    kvtest::fillMemory(kind_, buf.local(), kvtest::kPoison, g.regionBytes);
    Inputs in = kvtest::makeInputs(seed, comm.rank(), comm.size(), tokens, g);
    Staged s = stage(g, in, type);
    comm.barrier();  // every replica is poisoned before anyone publishes
    switch (then) {
      case Then::FusedBarrier:
        pub.publish(s.tensors, {s.slots->data(), type, tokens}, tokens, nullptr, kvcomm::PublishThen::Barrier);
        break;
      case Then::FusedSignalThenWait:
        pub.publish(s.tensors, {s.slots->data(), type, tokens}, tokens, nullptr, kvcomm::PublishThen::Signal);
        pub.barrier().wait();
        break;
      case Then::Barrier:
        pub.publish(s.tensors, {s.slots->data(), type, tokens}, tokens);
        pub.barrier().sync();
        break;
    }
    auto got = replica(buf, g.regionBytes);
    pub.checkErrors();
    auto want = oracle(g, comm.size(), tokens, seed);
    size_t bad = 0;
    for (size_t i = 0; i < got.size() && bad == 0; ++i)
      if (got[i] != want[i]) bad = i + 1;
    EXPECT_EQ(bad, 0u) << "first differing byte " << bad - 1 << " (layout "
                       << (layout == CacheLayout::Flat ? "flat" : "block") << ", rowBytes " << rowBytes << ", tokens "
                       << tokens << ", rank " << comm.rank() << ")";
    comm.barrier();  // nobody re-poisons before everyone compared
  }

  using Communicator = kvcomm::Communicator;
};

TEST_P(Publish, MatchesGatherInsertOracleAcrossSizesAndLayouts) {
  auto world = kvtest::tcpWorld();
  // Every rank's replica holds every member's rows: host runs (4 ranks on a CI machine) stop at 190 MB of rows per
  // replica (65536 x 4096 B is left out there); GPU runs cover the whole matrix.
  const size_t rowsCap = kind_ == MemoryKind::Cuda ? (600u << 20) : (190u << 20);
  const size_t kMaxRegion = rowsCap + rowsCap / 8 + (4u << 20);
  auto buf = SymmetricBuffer::create(world, kMaxRegion, kMaxRegion, kind_);
  auto pub = Publisher::create(buf);
  EXPECT_EQ(pub.mode(), kvcomm::PublishMode::Direct) << pub.modeReason();
  int scenario = 0;
  for (size_t tokens : {0, 1, 7, 256, 4096, 65536})
    for (size_t rowBytes : {1, 7, 16, 132, 576, 656, 4096}) {
      if (tokens * rowBytes * static_cast<size_t>(world.size()) > rowsCap) continue;
      for (CacheLayout layout : {CacheLayout::Flat, CacheLayout::BlockSplit}) {
        SlotType type = (scenario++ % 2) ? SlotType::Int32 : SlotType::Int64;
        runScenario(buf, pub, layout, rowBytes, tokens, type, seed_ + scenario, static_cast<Then>(scenario % 3));
        if (HasFailure()) return;
      }
    }
}

TEST_P(Publish, MatchesOracleOnAdoptedMemory) {
  auto world = kvtest::tcpWorld();
  const size_t reserved = 64u << 20;
  kvtest::EngineCache cache(kind_, reserved);
  size_t g = cache.granularity();
  size_t committed = (24u << 20) / g * g;
  cache.commit(0, committed / 2);
  cache.commit(committed / 2, committed / 2);
  auto buf = SymmetricBuffer::adopt(world, cache.base(), reserved, kind_);
  buf.commit({{0, committed}});
  auto pub = Publisher::create(buf);
  int scenario = 0;
  for (size_t tokens : {7, 256, 4096})
    for (size_t rowBytes : {7, 132, 656})
      for (CacheLayout layout : {CacheLayout::Flat, CacheLayout::BlockSplit}) {
        SlotType type = (scenario++ % 2) ? SlotType::Int32 : SlotType::Int64;
        runScenario(buf, pub, layout, rowBytes, tokens, type, seed_ + scenario);
        if (HasFailure()) return;
      }
}

TEST_P(Publish, DirectAndFallbackGiveIdenticalCaches) {
  auto world = kvtest::tcpWorld();
  if (kind_ == MemoryKind::Cuda && !kvtest::distinctGpus(world)) {
    // Members share a GPU: the NCCL fallback must refuse with a clear error, then the comparison cannot run.
    auto b = SymmetricBuffer::create(world, 1u << 21, 1u << 21, kind_);
    ScopedEnv off("KVCOMM_DIRECT", "0");
    try {
      auto p = Publisher::create(b);
      ADD_FAILURE() << "the NCCL fallback accepted two ranks on one GPU";
    } catch (const kvcomm::Error& e) {
      EXPECT_EQ(e.code(), kvcomm::ErrorCode::Unsupported) << e.what();
      EXPECT_NE(std::string(e.what()).find("one GPU per member"), std::string::npos) << e.what();
    }
    GTEST_SKIP() << "ranks share a GPU here; NCCL needs one GPU per rank";
  }
  auto direct = SymmetricBuffer::create(world, 16u << 20, 16u << 20, kind_);
  auto fallback = SymmetricBuffer::create(world, 16u << 20, 16u << 20, kind_);
  auto inPlace = SymmetricBuffer::create(world, 16u << 20, 16u << 20, kind_);
  auto pd = Publisher::create(direct);
  Publisher pf, pg;
  {
    ScopedEnv off("KVCOMM_DIRECT", "0");
    pf = Publisher::create(fallback);  // small records packed, contiguous or not
    ScopedEnv never("KVCOMM_FALLBACK_PACK_MAX_BYTES", "0");
    pg = Publisher::create(inPlace);  // contiguous rows gathered in place (NCCL), however small
  }
  ASSERT_EQ(pd.mode(), kvcomm::PublishMode::Direct) << pd.modeReason();
  ASSERT_EQ(pf.mode(), kvcomm::PublishMode::Fallback) << pf.modeReason();
  ASSERT_EQ(pg.mode(), kvcomm::PublishMode::Fallback) << pg.modeReason();
  int round = 0;
  for (auto [tokens, rowBytes] : {std::pair<size_t, size_t>{256, 656}, {7, 7}, {1000, 132}, {2000, 656}})
    for (CacheLayout layout : {CacheLayout::Flat, CacheLayout::BlockSplit}) {
      uint64_t seed = seed_ + tokens + rowBytes;
      auto then = static_cast<Then>(round++ % 3);  // every way to synchronise, in both modes
      runScenario(direct, pd, layout, rowBytes, tokens, SlotType::Int64, seed, then);
      runScenario(fallback, pf, layout, rowBytes, tokens, SlotType::Int32, seed, then);
      runScenario(inPlace, pg, layout, rowBytes, tokens, SlotType::Int64, seed, then);
      Geometry g = kvtest::makeGeometry(layout, rowBytes, world.size() * tokens + tokens / 4 + 16);
      const auto want = replica(direct, g.regionBytes);
      EXPECT_EQ(want, replica(fallback, g.regionBytes)) << "direct and fallback differ";
      EXPECT_EQ(want, replica(inPlace, g.regionBytes)) << "direct and fallback (gathered in place) differ";
      world.barrier();
    }
}

TEST_P(Publish, PcpGroupsOfTp2Pcp2NeverCrossTpCoordinates) {
  auto world = kvtest::tcpWorld();
  if (world.size() != 4) GTEST_SKIP() << "needs TP2/PCP2 = 4 ranks";
  auto layout = kvcomm::ParallelGroups::create(world, {2, 2, 1, 1});
  auto buf = SymmetricBuffer::create(layout.pcp, 8u << 20, 8u << 20, kind_);
  auto pub = Publisher::create(buf);
  // Each PCP group publishes its own data (seeded by its TP coordinate); a row crossing groups would show.
  runScenario(buf, pub, CacheLayout::Flat, 656, 512, SlotType::Int64, seed_ + 1000 * layout.coord.tp);
  runScenario(buf, pub, CacheLayout::BlockSplit, 132, 300, SlotType::Int32, seed_ + 1000 * layout.coord.tp + 1);
}

TEST_P(Publish, ThousandStepsWithNewInputsEveryStep) {
  auto world = kvtest::tcpWorld();
  auto buf = SymmetricBuffer::create(world, 4u << 20, 4u << 20, kind_);
  auto pub = Publisher::create(buf);
  const size_t tokens = 24;
  Geometry g = kvtest::makeGeometry(CacheLayout::Flat, 656, world.size() * tokens * 40);
  kvtest::fillMemory(kind_, buf.local(), kvtest::kPoison, g.regionBytes);
  std::vector<uint8_t> want(g.regionBytes, kvtest::kPoison);
  world.barrier();
  int steps = kind_ == MemoryKind::Cuda ? 1000 : 300;
  for (int step = 0; step < steps; ++step) {
    Inputs in = kvtest::makeInputs(seed_, world.rank(), world.size(), tokens, g, step + 1);
    Staged s = stage(g, in, SlotType::Int64);
    pub.publish(s.tensors, {s.slots->data(), SlotType::Int64, tokens}, tokens);
    pub.barrier().sync();
    for (int r = 0; r < world.size(); ++r)
      kvtest::applyOracle(want, g, kvtest::makeInputs(seed_, r, world.size(), tokens, g, step + 1));
    ASSERT_EQ(replica(buf, g.regionBytes), want) << "step " << step;
    pub.barrier().sync(nullptr, 1);  // nobody overwrites before everyone checked
  }
}

TEST_P(Publish, TwoLanesInterleavedInOneStep) {
  auto world = kvtest::tcpWorld();
  auto buf = SymmetricBuffer::create(world, 8u << 20, 8u << 20, kind_);
  auto pub = Publisher::create(buf);
  Geometry a = kvtest::makeGeometry(CacheLayout::Flat, 656, world.size() * 64 + 32, 0);
  Geometry b =
      kvtest::makeGeometry(CacheLayout::BlockSplit, 132, world.size() * 64 + 32, (a.regionBytes + 4095) / 4096 * 4096);
  kvtest::fillMemory(kind_, buf.local(), kvtest::kPoison, b.regionBytes);
  std::vector<uint8_t> want(b.regionBytes, kvtest::kPoison);
  world.barrier();
  for (int step = 0; step < 20; ++step) {
    Inputs ia = kvtest::makeInputs(seed_, world.rank(), world.size(), 64, a, 2 * step + 1);
    Inputs ib = kvtest::makeInputs(seed_, world.rank(), world.size(), 64, b, 2 * step + 2);
    Staged sa = stage(a, ia, SlotType::Int64), sb = stage(b, ib, SlotType::Int32);
    // Micro-batch A on lane 0, micro-batch B on lane 1, interleaved.
    pub.publish(sa.tensors, {sa.slots->data(), SlotType::Int64, 64}, 64);
    pub.publish(sb.tensors, {sb.slots->data(), SlotType::Int32, 64}, 64);
    pub.barrier().sync(nullptr, 1);
    pub.barrier().sync(nullptr, 0);
    for (int r = 0; r < world.size(); ++r) {
      kvtest::applyOracle(want, a, kvtest::makeInputs(seed_, r, world.size(), 64, a, 2 * step + 1));
      kvtest::applyOracle(want, b, kvtest::makeInputs(seed_, r, world.size(), 64, b, 2 * step + 2));
    }
    ASSERT_EQ(replica(buf, b.regionBytes), want) << "step " << step;
    pub.barrier().sync(nullptr, 0);
  }
}

TEST_P(Publish, SlotBeyondTheBufferIsReportedAndNotWritten) {
  auto world = kvtest::tcpWorld();
  auto buf = SymmetricBuffer::create(world, 4u << 20, 4u << 20, kind_);
  auto pub = Publisher::create(buf);
  const size_t tokens = 32;
  Geometry g = kvtest::makeGeometry(CacheLayout::Flat, 132, world.size() * tokens + 8);
  kvtest::fillMemory(kind_, buf.local(), kvtest::kPoison, buf.mappedBytes());
  Inputs in = kvtest::makeInputs(seed_, world.rank(), world.size(), tokens, g);
  const size_t badToken = 5;
  if (world.rank() == 0) in.slots[badToken] = static_cast<int64_t>(buf.mappedBytes());  // far past the end
  Staged s = stage(g, in, SlotType::Int64);
  world.barrier();
  bool hostThrew = false;
  try {
    pub.publish(s.tensors, {s.slots->data(), SlotType::Int64, tokens}, tokens);
  } catch (const kvcomm::InvalidArgumentError& e) {
    hostThrew = true;  // host backend: validated before writing anything
    EXPECT_EQ(kind_, MemoryKind::Host);
    EXPECT_NE(std::string(e.what()).find("token 5"), std::string::npos) << e.what();
  }
  pub.barrier().sync();
  kvtest::synchronize(kind_);
  if (kind_ == MemoryKind::Cuda && world.rank() == 0) {
    try {
      pub.checkErrors();
      ADD_FAILURE() << "the out-of-range slot was not reported";
    } catch (const kvcomm::InvalidArgumentError& e) {
      EXPECT_NE(std::string(e.what()).find("token 5"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(hostThrew, kind_ == MemoryKind::Host && world.rank() == 0);
  // The oracle: rank 0's bad row is missing (device), or all of rank 0's rows (host validated before writing).
  std::vector<uint8_t> want(g.regionBytes, kvtest::kPoison);
  for (int r = 0; r < world.size(); ++r) {
    Inputs x = kvtest::makeInputs(seed_, r, world.size(), tokens, g);
    if (r == 0 && kind_ == MemoryKind::Host) continue;
    if (r == 0) x.slots[badToken] = -1;
    kvtest::applyOracle(want, g, x);
  }
  EXPECT_EQ(replica(buf, g.regionBytes), want);
  // Nothing landed past the region either (the bad slot would have pointed there).
  auto tail = replica(buf, buf.mappedBytes());
  for (size_t i = g.regionBytes; i < tail.size(); i += 997) ASSERT_EQ(tail[i], kvtest::kPoison) << "byte " << i;
  world.barrier();
}

// Rows are checked against what is backed when they are written: the fast check against the backed prefix
// ([0, g) here, below a released hole) and the bitmap beyond it. A row below the prefix and one past the hole land; a
// row straddling the prefix's end into the hole and one inside the hole are refused and write nothing; once the hole
// is committed again the same rows land.
TEST_P(Publish, RowsAroundAReleasedHoleLandOnlyWhereBacked) {
  auto world = kvtest::tcpWorld();
  const size_t g = kvtest::EngineCache::granularityOf(kind_);
  kvtest::EngineCache cache(kind_, 4 * g);
  for (size_t i = 0; i < 4; ++i) cache.commit(i * g, g);
  auto buf = SymmetricBuffer::adopt(world, cache.base(), 4 * g, kind_);
  buf.commit({{0, 4 * g}});
  auto pub = Publisher::create(buf);
  const size_t row = 384;  // does not divide g: one slot straddles each granule boundary
  const int me = world.rank(), n = world.size();
  kvtest::fillMemory(kind_, buf.local(), kvtest::kPoison, 4 * g);
  world.barrier();
  buf.release({{g, g}});
  cache.release(g);
  const int64_t straddle = static_cast<int64_t>(g / row);           // [g - 128, g + 256)
  const int64_t inHole = straddle + 1 + me;                         // inside [g, 2g)
  const int64_t below = static_cast<int64_t>(me);                   // in [0, g): below the prefix
  const int64_t past = static_cast<int64_t>(2 * g / row) + 1 + me;  // in [2g, 3g): checked on the bitmap
  auto src = kvtest::pattern(seed_, static_cast<uint64_t>(me), 2 * row);
  kvtest::Memory rows(kind_, 2 * row), slots(kind_, 2 * sizeof(int64_t));
  kvtest::toMemory(kind_, rows.data(), src.data(), src.size());
  kvcomm::CacheTensor t;
  t.src = rows.data();
  t.rowBytes = row;
  // Publishes rows 0 and 1 of `src` at slots a and b (b < 0: one row), then a barrier; returns whether it was refused.
  auto publishAt = [&](int64_t a, int64_t b) {
    int64_t sl[2] = {a, b};
    kvtest::toMemory(kind_, slots.data(), sl, sizeof(sl));
    bool refused = false;
    try {
      pub.publish({t}, {slots.data(), SlotType::Int64, 2}, 2);
    } catch (const kvcomm::InvalidArgumentError& e) {
      refused = true;  // host backend: refused before anything is written
      EXPECT_NE(std::string(e.what()).find("backed"), std::string::npos) << e.what();
    }
    pub.barrier().sync();
    kvtest::synchronize(kind_);
    if (kind_ == MemoryKind::Cuda) {
      try {
        pub.checkErrors();
      } catch (const kvcomm::InvalidArgumentError& e) {
        refused = true;  // device: the row was not written and was recorded
        EXPECT_NE(std::string(e.what()).find("slot"), std::string::npos) << e.what();
      }
    }
    return refused;
  };
  auto rowAt = [&](int64_t slot) {  // this rank's replica
    std::vector<uint8_t> v(row);
    kvtest::fromMemory(kind_, v.data(), static_cast<char*>(buf.local()) + slot * static_cast<int64_t>(row), row);
    return v;
  };
  auto rowOf = [&](int r, int i) {  // row i of rank r's source
    auto all = kvtest::pattern(seed_, static_cast<uint64_t>(r), 2 * row);
    return std::vector<uint8_t>(all.begin() + i * static_cast<int64_t>(row), all.begin() + (i + 1) * row);
  };
  EXPECT_FALSE(publishAt(below, past)) << "rows below the prefix and past the hole are backed";
  EXPECT_TRUE(publishAt(straddle, -1)) << "a row crossing into the released hole was accepted";
  EXPECT_TRUE(publishAt(inHole, -1)) << "a row inside the released hole was accepted";
  world.barrier();
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(rowAt(r), rowOf(r, 0)) << "rank " << r << "'s row below the prefix";
    EXPECT_EQ(rowAt(static_cast<int64_t>(2 * g / row) + 1 + r), rowOf(r, 1)) << "rank " << r << "'s row past the hole";
  }
  std::vector<uint8_t> head(128);  // the straddling row's bytes below g: still poison
  kvtest::fromMemory(kind_, head.data(), static_cast<char*>(buf.local()) + g - 128, 128);
  EXPECT_EQ(head, std::vector<uint8_t>(128, kvtest::kPoison)) << "a refused row wrote its backed part";
  world.barrier();
  // Recommit the hole: the prefix covers it again and the same rows land (rank 0 also the straddling one).
  cache.commit(g, g);
  buf.commit({{g, g}});
  EXPECT_FALSE(publishAt(me == 0 ? straddle : -1, inHole)) << "the recommitted hole still refuses rows";
  world.barrier();
  EXPECT_EQ(rowAt(straddle), rowOf(0, 0)) << "the straddling row";
  for (int r = 0; r < n; ++r) EXPECT_EQ(rowAt(straddle + 1 + r), rowOf(r, 1)) << "rank " << r << "'s row in the hole";
  world.barrier();
}

TEST_P(Publish, InvalidCallsAreRefusedBeforeLaunch) {
  auto world = kvtest::tcpWorld();
  auto buf = SymmetricBuffer::create(world, 1u << 20, 1u << 20, kind_);
  auto pub = Publisher::create(buf);
  kvtest::Memory src(kind_, 4096), slots(kind_, 64);
  auto expectRefused = [&](std::vector<kvcomm::CacheTensor> t, const char* needle) {
    try {
      pub.publish(t, {slots.data(), SlotType::Int64, 8}, 8);
      ADD_FAILURE() << "accepted: " << needle;
    } catch (const kvcomm::InvalidArgumentError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  kvcomm::CacheTensor ok{src.data(), 0, 64, 0, 1, 0, 0};
  kvcomm::CacheTensor outside = ok;
  outside.offset = buf.mappedBytes();
  expectRefused({outside}, "not inside the backed part");
  kvcomm::CacheTensor overlapping{src.data(), 0, 64, 0, 16, 512, 64};  // 16 rows of 64 bytes in 512
  expectRefused({overlapping}, "overflow the block stride");
  expectRefused({ok, ok, ok, ok, ok}, "1 to 4");
  kvcomm::CacheTensor empty = ok;
  empty.rowBytes = 0;
  expectRefused({empty}, "rowBytes is 0");
  // A bad lane names the barrier's call in both modes (the publisher's barrier is a Barrier in Fallback mode too).
  kvtest::expectError([&] { pub.barrier().sync(nullptr, 7); }, kvcomm::ErrorCode::InvalidArgument,
                      {"Barrier::sync", "lane 7 outside [0, 2)"});
  kvtest::expectError([&] { pub.barrier().signal(nullptr, -1); }, kvcomm::ErrorCode::InvalidArgument,
                      {"Barrier::signal", "lane -1"});
  kvtest::expectError([&] { pub.barrier().wait(nullptr, 2); }, kvcomm::ErrorCode::InvalidArgument,
                      {"Barrier::wait", "lane 2"});
  kvtest::expectError(
      [&] {
        pub.publish({ok}, {slots.data(), SlotType::Int64, 1}, 1, nullptr, kvcomm::PublishThen::Barrier, 2);
      },
      kvcomm::ErrorCode::InvalidArgument, {"Publisher::publish", "lane 2"});
  world.barrier();
}

// A slot type outside the enum (SlotType(7): an integer cast by the caller) is refused whatever runs after the
// publish, naming the call and the value, before anything is read or written (it used to be read as int32 slots);
// so is a PublishThen outside its enum.
TEST_P(Publish, SlotTypeOutsideTheEnumIsRefusedAndWritesNothing) {
  auto world = kvtest::tcpWorld();
  auto buf = SymmetricBuffer::create(world, 1u << 20, 1u << 20, kind_);
  auto pub = Publisher::create(buf);
  std::vector<uint8_t> poison(1u << 16, kvtest::kPoison);
  kvtest::toMemory(kind_, buf.local(), poison.data(), poison.size());
  world.barrier();
  kvtest::Memory src(kind_, 4096), slots(kind_, 64);
  std::vector<int64_t> ids{world.rank(), 8 + world.rank()};
  kvtest::toMemory(kind_, slots.data(), ids.data(), 16);
  kvcomm::CacheTensor t{src.data(), 0, 64, 0, 1, 0, 0};
  const auto bad = static_cast<SlotType>(7);
  const kvcomm::SlotMapping sized{slots.data(), bad, 2};
  auto refused = [&](const std::function<void()>& f, const char* call, const char* argument) {
    try {
      f();
      ADD_FAILURE() << call << " accepted SlotType 7";
    } catch (const kvcomm::InvalidArgumentError& e) {
      for (const char* part : {call, argument, " 7 "})
        EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  for (auto then : {kvcomm::PublishThen::Nothing, kvcomm::PublishThen::Barrier, kvcomm::PublishThen::Signal})
    refused([&] { pub.publish({t}, sized, 2, nullptr, then); }, "Publisher::publish", "slots.type");
  const kvcomm::SlotMapping good{slots.data(), SlotType::Int64, 2};
  refused([&] { pub.publish({t}, good, 2, nullptr, static_cast<kvcomm::PublishThen>(7)); }, "Publisher::publish",
          "then");
  kvtest::synchronize(kind_);
  world.barrier();
  std::vector<uint8_t> got(poison.size());
  kvtest::fromMemory(kind_, got.data(), buf.local(), got.size());
  EXPECT_EQ(got, poison) << "a refused publish wrote the buffer";
  world.barrier();
}

// Every method of an empty (default-constructed or moved-from) Publisher throws InvalidArgumentError naming it.
TEST_P(Publish, EveryMethodOfAnEmptyPublisherThrows) {
  auto world = kvtest::tcpWorld();
  auto buf = SymmetricBuffer::create(world, 1u << 20, 1u << 20, kind_);
  Publisher made = Publisher::create(buf);
  Publisher taken = std::move(made);
  EXPECT_TRUE(taken.valid());
  kvtest::Memory src(kind_, 4096), slots(kind_, 64);
  kvcomm::CacheTensor t{src.data(), 0, 64, 0, 1, 0, 0};
  for (Publisher* p : {&made, static_cast<Publisher*>(nullptr)}) {
    Publisher fresh;
    Publisher& e = p ? *p : fresh;
    EXPECT_FALSE(e.valid());
    auto empty = [&](const std::function<void()>& f, const char* call) {
      kvtest::expectError(f, kvcomm::ErrorCode::InvalidArgument, {call, "empty publisher"});
    };
    empty([&] { (void)e.mode(); }, "Publisher::mode");
    empty([&] { (void)e.modeReason(); }, "Publisher::modeReason");
    empty([&] { (void)e.pollError(); }, "Publisher::pollError");
    empty([&] { e.checkErrors(); }, "Publisher::checkErrors");
    empty([&] { e.publish({t}, {slots.data(), SlotType::Int64, 1}, 1); }, "Publisher::publish");
    empty(
        [&] {
          e.publish({t}, {slots.data(), SlotType::Int64, 1}, 1, nullptr, kvcomm::PublishThen::Barrier);
        },
        "Publisher::publish");
    empty([&] { (void)e.barrier(); }, "Publisher::barrier");
  }
  world.barrier();
}

TEST_P(Publish, RankThatNeverArrivesTimesOutWithAClearError) {
  auto world = kvtest::tcpWorld();
  if (world.size() < 2) GTEST_SKIP() << "needs 2 ranks";
  auto buf = SymmetricBuffer::create(world, 1u << 20, 1u << 20, kind_);
  kvcomm::PublisherOptions opts;
  opts.barrierTimeoutMs = 400;
  auto pub = Publisher::create(buf, opts);
  if (world.rank() == 0) {
    auto t0 = std::chrono::steady_clock::now();
    std::string message;
    try {
      pub.barrier().sync(nullptr, 1);
      kvtest::synchronize(kind_);
      pub.checkErrors();
    } catch (const kvcomm::Error& e) {
      EXPECT_EQ(e.code(), kvcomm::ErrorCode::Timeout) << e.what();
      message = e.what();
    }
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_NE(message.find("rank 0 waited for peer"), std::string::npos) << message;
    EXPECT_NE(message.find("on lane 1"), std::string::npos) << message;
    EXPECT_GE(ms, 350);
    EXPECT_LT(ms, 5000);
  }
  world.barrier();  // the others never called barrier()
}

INSTANTIATE_TEST_SUITE_P(Backends, Publish, ::testing::Values(MemoryKind::Host, MemoryKind::Cuda), kvtest::kindName);

TEST(PublishMode, ForcingDirectNamesWhatIsMissing) {
  // Every member of an MPI job on one host is mapped, so KVCOMM_DIRECT=1 must succeed here; the refusal across
  // hosts is covered by the network-namespace test (tests/scripts/netns_topology.sh).
  auto world = kvtest::tcpWorld();
  auto buf = SymmetricBuffer::create(world, 1u << 20, 1u << 20, MemoryKind::Host);
  ScopedEnv force("KVCOMM_DIRECT", "1");
  auto pub = Publisher::create(buf);
  EXPECT_EQ(pub.mode(), kvcomm::PublishMode::Direct);
  EXPECT_NE(pub.modeReason().find("KVCOMM_DIRECT=1"), std::string::npos) << pub.modeReason();
}

// barrier().deviceHandle() checks the mode (docs/device-api.md): a Fallback publisher's barrier is a collective, with
// no device barrier to hand out.
TEST(PublishMode, BarrierHandleOnlyInDirectMode) {
  auto world = kvtest::tcpWorld();
  auto buf = SymmetricBuffer::create(world, 1u << 20, 1u << 20, MemoryKind::Host);
  auto direct = Publisher::create(buf);
  ASSERT_EQ(direct.mode(), kvcomm::PublishMode::Direct) << direct.modeReason();
  kvcomm::BarrierDeviceHandle h = direct.barrier().deviceHandle();
  EXPECT_EQ(h.rank, world.rank());
  Publisher fallback;
  {
    ScopedEnv off("KVCOMM_DIRECT", "0");
    fallback = Publisher::create(buf);
  }
  ASSERT_EQ(fallback.mode(), kvcomm::PublishMode::Fallback) << fallback.modeReason();
  try {
    fallback.barrier().deviceHandle();
    ADD_FAILURE() << "a Fallback publisher handed out a device barrier";
  } catch (const kvcomm::InvalidArgumentError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("Barrier::deviceHandle: a Fallback-mode publisher's barrier is a collective and has no device "
                     "handle"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("KVCOMM_DIRECT=0"), std::string::npos) << "the mode reason: " << m;
  }
  EXPECT_THROW(Publisher().barrier(), kvcomm::InvalidArgumentError);
  world.barrier();
}

TEST(PublishMode, DifferentKvcommDirectNamesWorldRanksAndBothValues) {
  // A group whose member numbers differ from the world ranks: the odd world ranks {1, 3, ...}.
  auto world = kvtest::tcpWorld();
  if (world.size() < 4) GTEST_SKIP() << "needs 4 ranks";
  auto odd = world.split(world.rank() % 2, world.rank());
  auto buf = SymmetricBuffer::create(*odd, 1u << 20, 1u << 20, MemoryKind::Host);
  int last = odd->worldRank(odd->size() - 1);
  ScopedEnv mode("KVCOMM_DIRECT", world.rank() == last ? "0" : "auto");
  std::string want =
      "world rank " + std::to_string(last) + " has 0, world rank " + std::to_string(odd->worldRank(0)) + " has auto";
  try {
    auto pub = Publisher::create(buf);
    ADD_FAILURE() << "members with different KVCOMM_DIRECT created a publisher";
  } catch (const kvcomm::InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
  }
  world.barrier();
}

TEST(PublishMode, DifferentFallbackPackMaxBytesIsRefusedOnEveryMember) {
  // The knob decides which collectives a fallback call issues (one AllGather or a group): members that disagreed
  // would pair collectives of different sizes, so create refuses it everywhere, naming both values.
  auto world = kvtest::tcpWorld();
  if (world.size() < 2) GTEST_SKIP() << "needs 2 ranks";
  auto buf = SymmetricBuffer::create(world, 1u << 20, 1u << 20, MemoryKind::Host);
  const int last = world.size() - 1;
  ScopedEnv knob("KVCOMM_FALLBACK_PACK_MAX_BYTES", world.rank() == last ? "0" : "");
  const std::string want = "world rank " + std::to_string(last) + " has 0, world rank 0 has 262144";
  try {
    auto pub = Publisher::create(buf);
    ADD_FAILURE() << "members with different KVCOMM_FALLBACK_PACK_MAX_BYTES created a publisher";
  } catch (const kvcomm::InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
  }
  world.barrier();
}

TEST(PublishMode, BadLanesOnOneMemberFailCreateOnEveryMemberAtOnce) {
  // A vote before the mode exchange: the other members fail at once, naming the member's lanes, instead of waiting in
  // the exchange until the bootstrap timeout. In Direct mode, valid but different lane counts are refused by the
  // publisher's barrier.
  auto world = kvtest::tcpWorld();
  if (world.size() < 2) GTEST_SKIP() << "needs 2 ranks";
  auto buf = SymmetricBuffer::create(world, 1u << 20, 1u << 20, MemoryKind::Host);
  const int last = world.size() - 1;
  kvcomm::PublisherOptions o;
  o.lanes = world.rank() == last ? 9 : 2;
  auto t0 = std::chrono::steady_clock::now();
  kvtest::expectError([&] { (void)Publisher::create(buf, o); }, kvcomm::ErrorCode::InvalidArgument,
                      {"Publisher::create", "lanes 9 outside [1, 8]"});
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
  o.lanes = world.rank() == last ? 3 : 2;
  kvtest::expectError([&] { (void)Publisher::create(buf, o); }, kvcomm::ErrorCode::InvalidArgument,
                      {"lanes must be the same on every member"});
  world.barrier();
}

TEST(PublishMode, HostFallbackRefusesCallsOfDifferentShapesOnEveryMember) {
  // Equal record sizes are not enough (1 token of 32 B is 2 tokens of 16 B, or 1 token of two 16 B tensors): the
  // host fallback compares numTokens and row sizes, so no replica is filled from records read with another layout.
  auto world = kvtest::tcpWorld();
  if (world.size() < 2) GTEST_SKIP() << "needs 2 ranks";
  ScopedEnv off("KVCOMM_DIRECT", "0");
  auto buf = SymmetricBuffer::create(world, 1u << 20, 1u << 20, MemoryKind::Host);
  auto pub = Publisher::create(buf);
  ASSERT_EQ(pub.mode(), kvcomm::PublishMode::Fallback);
  const int last = world.size() - 1;
  const bool odd = world.rank() == last;
  std::vector<uint8_t> rows(64, 0x5a), before(buf.mappedBytes());
  std::vector<int64_t> slots{3, 4};
  std::memcpy(before.data(), buf.local(), before.size());
  kvcomm::CacheTensor wide{rows.data(), 0, 32, 0, 1, 0, 0}, narrow{rows.data(), 0, 16, 4096, 1, 0, 0};
  kvtest::expectError(
      [&] {
        pub.publish({odd ? narrow : wide}, {slots.data(), SlotType::Int64, odd ? 2u : 1u}, odd ? 2u : 1u);
      },
      kvcomm::ErrorCode::InvalidArgument,
      {"publish (fallback)", "every member must pass the same numTokens and row sizes"});
  kvtest::expectError(
      [&] {
        if (odd)
          pub.publish({narrow, narrow}, {slots.data(), SlotType::Int64, 1}, 1);
        else
          pub.publish({wide}, {slots.data(), SlotType::Int64, 1}, 1);
      },
      kvcomm::ErrorCode::InvalidArgument, {"publish (fallback)", "tensors with rows of"});
  EXPECT_EQ(std::memcmp(before.data(), buf.local(), before.size()), 0) << "a refused call wrote into the replica";
  world.barrier();
  // Calls of one shape still work afterwards.
  pub.publish({wide}, {slots.data(), SlotType::Int64, 1}, 1);
  pub.barrier().sync();
  world.barrier();
}

}  // namespace
