// Hostile and careless calls under mpirun, on the host backend and (where a GPU is present) the CUDA backend:
// destinations that would wrap or leave their tensor's region are refused and write nothing outside, sized publishes
// refuse a numTokens beyond their inputs, every call after close() is an error (also from another thread, during
// publishing), grow on one thread while another publishes stays exact, fallback publishers of two communicators run
// on two threads, and abort() stops a barrier that waits for a peer that never comes.
#include <gtest/gtest.h>
#include <mpi.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "kvcomm/barrier.hpp"
#include "kvcomm/error.hpp"
#include "kvcomm/fetch.hpp"
#include "kvcomm/publish.hpp"
#include "mpi/mpi_util.hpp"
#include "support/scoped_env.hpp"
#include "verify/memory.hpp"

namespace {

using kvcomm::CacheTensor;
using kvcomm::MemoryKind;
using kvcomm::Publisher;
using kvcomm::SlotType;
using kvcomm::SymmetricBuffer;

constexpr uint8_t kPoison = 0xA5;

class Faults : public kvtest::BackendTest {
 protected:
  std::vector<uint8_t> read(const void* p, size_t n) {
    kvtest::synchronize(kind_);
    std::vector<uint8_t> v(n);
    kvtest::fromMemory(kind_, v.data(), p, n);
    return v;
  }
  std::unique_ptr<kvtest::Memory> slotsOf(const std::vector<int64_t>& slots) {
    auto m = std::make_unique<kvtest::Memory>(kind_, std::max<size_t>(8, slots.size() * 8));
    if (!slots.empty()) kvtest::toMemory(kind_, m->data(), slots.data(), slots.size() * 8);
    return m;
  }
  // Publishes; returns the error the host path threw or the device reported ("" when none).
  std::string publishAndCheck(Publisher& pub, const std::vector<CacheTensor>& t, const void* slots, size_t n) {
    std::string what;
    try {
      pub.publish(t, {slots, SlotType::Int64, n}, n);
      kvtest::synchronize(kind_);
      pub.checkErrors();
    } catch (const kvcomm::InvalidArgumentError& e) {
      what = e.what();
    }
    return what;
  }
  void callsAfterClose(const char* direct);
};

// Host memory only: the CPU stores through the mappings, so these race with grow/close on other threads; device
// stores are ordered by their stream instead (the caller synchronises before release or close).
class HostFaults : public Faults {};

// The case: strides that wrap modulo 2^64 (rowStride = 2^64 - 4096, blockStride = 2^64 - 1, offset 4096,
// slot 1) used to pass validation and write 64 bytes at offset 0 of every replica. Every wrapping computation is
// refused now, and no replica changes.
TEST_P(Faults, DestinationsThatWouldWrapAreRefusedAndWriteNothing) {
  auto world = kvtest::tcpWorld();
  auto buf = SymmetricBuffer::create(world, 1u << 20, 1u << 20, kind_);
  auto pub = Publisher::create(buf);
  kvtest::Memory src(kind_, 4096);
  auto rows = kvtest::pattern(seed_, world.rank(), 4096);
  kvtest::toMemory(kind_, src.data(), rows.data(), rows.size());
  kvtest::fillMemory(kind_, buf.local(), kPoison, buf.mappedBytes());
  world.barrier();
  const uint64_t max = ~uint64_t(0);
  struct Case {
    CacheTensor t;
    int64_t slot;
    const char* what;
  };
  std::vector<Case> cases = {
      {{src.data(), 0, 64, 4096, 1, max, max - 4095}, 1, "the issue's wrapping strides"},
      {{src.data(), 0, 64, 0, 1, max / 2 + 1, 64}, 2, "block * blockStride wraps"},
      {{src.data(), 0, 64, 4096, 1, 64, 64}, INT64_MAX, "a huge slot"},
      {{src.data(), 0, 64, 8192, 2, 1u << 20, max / 2 + 1}, 1, "(slot % blockSize) * rowStride wraps"},
      // (blockSize - 1) * rowStride + rowBytes wraps to 32 and passed the old check; slot 1 then lands 32 bytes
      // before the tensor's offset, in the previous region.
      {{src.data(), 0, 64, 8192, 2, 4096, max - 31}, 1, "a row stride that wraps back below the offset"},
  };
  for (const Case& c : cases) {
    auto slots = slotsOf({c.slot});
    std::string what;
    try {
      what = publishAndCheck(pub, {c.t}, slots->data(), 1);
    } catch (const kvcomm::Error& e) {
      what = e.what();  // refused when the tensor is described (a wrapping block size)
    }
    EXPECT_FALSE(what.empty()) << c.what << ": accepted";
    world.barrier();
  }
  // Also refused where the host sees it (a default block stride that would wrap): before launch, on both backends.
  CacheTensor huge{src.data(), 0, 64, 0, uint64_t(1) << 60, 0, 64};
  auto one = slotsOf({0});
  EXPECT_THROW(pub.publish({huge}, {one->data(), SlotType::Int64, 1}, 1), kvcomm::InvalidArgumentError);
  world.barrier();
  auto mine = read(buf.local(), buf.mappedBytes());
  size_t changed = 0;
  for (size_t i = 0; i < mine.size() && !changed; ++i)
    if (mine[i] != kPoison) changed = i + 1;
  EXPECT_EQ(changed, 0u) << "byte " << changed - 1 << " of the replica was written";
  world.barrier();
}

// An adopted cache with two committed ranges (two layers): a tensor confined to layer 0 (limitBytes) whose slot
// mapping points into layer 1 is refused, and layer 1 is untouched. The host backend writes nothing of the call
// (all or nothing); the device writes the good rows and reports the bad one.
TEST_P(Faults, RowsPastATensorsLimitAreRefusedAndTheNextLayerIsUntouched) {
  auto world = kvtest::tcpWorld();
  const size_t g = kvtest::EngineCache::granularityOf(kind_);
  const size_t layer = 4 * g;
  kvtest::EngineCache cache(kind_, 2 * layer);
  cache.commit(0, layer);
  cache.commit(layer, layer);
  auto buf = SymmetricBuffer::adopt(world, cache.base(), 2 * layer, kind_);
  buf.commit({{0, layer}, {layer, layer}});
  auto pub = Publisher::create(buf);
  const size_t rowBytes = 128, tokens = 8;
  kvtest::Memory src(kind_, tokens * rowBytes);
  auto rows = kvtest::pattern(seed_, world.rank(), tokens * rowBytes);
  kvtest::toMemory(kind_, src.data(), rows.data(), rows.size());
  kvtest::fillMemory(kind_, cache.base(), kPoison, 2 * layer);
  world.barrier();
  CacheTensor t{src.data(), 0, rowBytes, 0, 1, 0, 0};
  t.limitBytes = layer;
  // Rank r's rows go to slots r * tokens + i of layer 0; one slot of rank 0 lands in layer 1 instead.
  std::vector<int64_t> slots(tokens);
  for (size_t i = 0; i < tokens; ++i) slots[i] = static_cast<int64_t>(world.rank() * tokens + i);
  const size_t bad = 3;
  if (world.rank() == 0) slots[bad] = static_cast<int64_t>(layer / rowBytes + 5);  // inside layer 1
  auto dev = slotsOf(slots);
  std::string what = publishAndCheck(pub, {t}, dev->data(), tokens);
  pub.barrier().sync();
  if (world.rank() == 0) {
    EXPECT_NE(what.find("token 3"), std::string::npos) << "the row into layer 1 was not refused: " << what;
    EXPECT_NE(what.find("limitBytes"), std::string::npos) << what;
  } else {
    EXPECT_EQ(what, "");
  }
  auto got = read(cache.base(), 2 * layer);
  for (size_t i = layer; i < 2 * layer; ++i)
    ASSERT_EQ(got[i], kPoison) << "layer 1 byte " << i - layer << " was written";
  // Layer 0: every rank's rows, except rank 0's (host: none of them; device: all but the bad one).
  for (int r = 0; r < world.size(); ++r) {
    auto want = kvtest::pattern(seed_, r, tokens * rowBytes);
    for (size_t i = 0; i < tokens; ++i) {
      bool missing = r == 0 && (kind_ == MemoryKind::Host || i == bad);
      size_t at = (r * tokens + i) * rowBytes;
      std::vector<uint8_t> row(got.begin() + at, got.begin() + at + rowBytes);
      std::vector<uint8_t> expect =
          missing ? std::vector<uint8_t>(rowBytes, kPoison)
                  : std::vector<uint8_t>(want.begin() + i * rowBytes, want.begin() + (i + 1) * rowBytes);
      EXPECT_EQ(row, expect) << "rank " << r << " token " << i;
    }
  }
  // A limit that reaches past the buffer is refused before launch.
  CacheTensor tooFar = t;
  tooFar.offset = layer;
  tooFar.limitBytes = layer + 1;
  EXPECT_THROW(pub.publish({tooFar}, {dev->data(), SlotType::Int64, 1}, 1), kvcomm::InvalidArgumentError);
  world.barrier();
}

// The sized form checks numTokens against the slot mapping's length and each source's bytes: refused before
// anything is read or written.
TEST_P(Faults, SizedPublishRefusesANumTokensBeyondItsInputs) {
  auto world = kvtest::tcpWorld();
  auto buf = SymmetricBuffer::create(world, 1u << 20, 1u << 20, kind_);
  auto pub = Publisher::create(buf);
  const size_t rowBytes = 64, tokens = 16;
  kvtest::Memory src(kind_, tokens * rowBytes);
  std::vector<int64_t> slots(tokens);
  for (size_t i = 0; i < tokens; ++i) slots[i] = static_cast<int64_t>(world.rank() * tokens + i);
  auto dev = slotsOf(slots);
  kvtest::fillMemory(kind_, buf.local(), kPoison, buf.mappedBytes());
  world.barrier();
  CacheTensor t{src.data(), 0, rowBytes, 0, 1, 0, 0};
  t.srcBytes = tokens * rowBytes;
  kvcomm::SlotMapping sm{dev->data(), SlotType::Int64, tokens};
  try {
    pub.publish({t}, sm, tokens + 1);
    ADD_FAILURE() << "numTokens beyond the slot mapping was accepted";
  } catch (const kvcomm::InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("slot mapping"), std::string::npos) << e.what();
  }
  kvcomm::SlotMapping roomy{dev->data(), SlotType::Int64, 1024};
  try {
    pub.publish({t}, roomy, tokens + 1);
    ADD_FAILURE() << "rows beyond srcBytes were accepted";
  } catch (const kvcomm::InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("srcBytes"), std::string::npos) << e.what();
  }
  EXPECT_THROW(pub.publish({t}, sm, tokens + 1, nullptr, kvcomm::PublishThen::Barrier), kvcomm::InvalidArgumentError);
  auto mine = read(buf.local(), buf.mappedBytes());
  for (size_t i = 0; i < mine.size(); i += 61) ASSERT_EQ(mine[i], kPoison) << "byte " << i;
  // Within bounds it publishes as usual.
  world.barrier();
  pub.publish({t}, sm, tokens);
  pub.barrier().sync();
  kvtest::synchronize(kind_);
  pub.checkErrors();
  world.barrier();
}

// Every call on a closed buffer, and on a publisher whose buffer was closed, is a clear error instead of a crash
// (Direct, and Fallback on host memory).
TEST_P(Faults, CallsAfterCloseAreErrors) {
  for (const char* direct : {"auto", "0"}) {
    if (*direct == '0' && kind_ == MemoryKind::Cuda && !kvtest::distinctGpus(kvtest::tcpWorld())) continue;
    callsAfterClose(direct);
  }
}

void Faults::callsAfterClose(const char* direct) {
  setenv("KVCOMM_DIRECT", direct, 1);
  auto world = kvtest::tcpWorld();
  auto buf = SymmetricBuffer::create(world, 1u << 20, 1u << 20, kind_);
  auto pub = Publisher::create(buf);
  unsetenv("KVCOMM_DIRECT");
  kvcomm::KvLayout layout;
  layout.regions.push_back({0, 4096, 0, 16});
  auto fetcher = kvcomm::Fetcher::create(buf, layout);
  kvtest::Memory src(kind_, 4096);
  auto dev = slotsOf({world.rank()});
  CacheTensor t{src.data(), 0, 64, 0, 1, 0, 0};
  int64_t one = 1, two = 2;
  kvcomm::FetchRequest req{};
  req.srcRank = (world.rank() + 1) % world.size();
  req.srcBlocks = &one;
  req.dstBlocks = &two;
  req.count = 1;
  req.srcLayoutHash = fetcher.layoutHash(req.srcRank);
  kvcomm::FetchPlan before = fetcher.plan({req});
  auto ids = slotsOf({1, 2});
  world.barrier();
  buf.close();
  auto closed = [&](const std::function<void()>& f, const char* what) {
    try {
      f();
      ADD_FAILURE() << what << " worked on a closed buffer";
    } catch (const kvcomm::InvalidArgumentError& e) {
      EXPECT_NE(std::string(e.what()).find("closed"), std::string::npos)
          << "KVCOMM_DIRECT=" << direct << ", " << what << ": " << e.what();
    }
  };
  closed([&] { pub.publish({t}, {dev->data(), SlotType::Int64, 1}, 1); }, "publish");
  closed(
      [&] {
        pub.publish({t}, {dev->data(), SlotType::Int64, 1}, 1, nullptr, kvcomm::PublishThen::Barrier);
      },
      "publish then barrier");
  closed([&] { pub.barrier().sync(); }, "barrier");
  closed([&] { pub.barrier().signal(); }, "signal");
  closed([&] { pub.barrier().wait(); }, "wait");
  closed([&] { buf.grow(2u << 20); }, "grow");
  closed([&] { fetcher.fetch({req}); }, "fetch");
  // Every Fetcher call on the closed buffer names the closure (plan and deviceHandle used to succeed, handing out
  // pointers into unmapped memory; refresh said "not wholly backed").
  closed([&] { (void)fetcher.plan({req}); }, "Fetcher::plan");
  closed([&] { fetcher.submit(before); }, "Fetcher::submit");
  closed([&] { (void)fetcher.start({req}); }, "Fetcher::start");
  closed([&] { (void)fetcher.deviceHandle(); }, "Fetcher::deviceHandle");
  kvcomm::DeviceFetchBatch batch;
  batch.srcBlocks = reinterpret_cast<const int64_t*>(ids->data());
  batch.dstBlocks = reinterpret_cast<const int64_t*>(ids->data()) + 1;
  batch.srcRank = req.srcRank;
  batch.count = 1;
  closed([&] { fetcher.fetchDevice(batch); }, "Fetcher::fetchDevice");
  closed([&] { fetcher.refresh(); }, "Fetcher::refresh");  // collective: every rank closed its buffer
  if (kind_ == MemoryKind::Host)  // every member reachable (the collective form exists): both barriers still run
    closed([&] { fetcher.fetchAll({req}); }, "Fetcher::fetchAll");
  closed([&] { (void)buf.deviceHandle(); }, "deviceHandle");
  EXPECT_EQ(buf.peerTable(), nullptr);
  EXPECT_EQ(buf.backedBitmap(), nullptr);
  EXPECT_FALSE(buf.isBacked(0, 64));
  // The queries describe no memory once it is gone, never the unmapped addresses.
  EXPECT_EQ(buf.local(), nullptr);
  EXPECT_EQ(buf.peer((world.rank() + 1) % world.size()), nullptr);
  EXPECT_FALSE(buf.isMapped(world.rank()));
  EXPECT_EQ(buf.mappedBytes(), 0u);
  EXPECT_TRUE(buf.backedRanges().empty());
  buf.close();  // idempotent
  world.barrier();
}

// close() from another thread while this one keeps publishing (host memory: the CPU writes through the mappings,
// into every replica): the publishing thread gets an error, never a fault. (Direct mode: a fallback publish is a
// collective, which a close on one rank alone would leave its peers waiting in.)
TEST_P(HostFaults, CloseFromAnotherThreadWhilePublishing) {
  setenv("KVCOMM_DIRECT", "1", 1);
  auto world = kvtest::tcpWorld();
  auto buf = SymmetricBuffer::create(world, 4u << 20, 4u << 20, kind_);
  auto pub = Publisher::create(buf);
  unsetenv("KVCOMM_DIRECT");
  const size_t tokens = 256, rowBytes = 1024;
  std::vector<char> rows(tokens * rowBytes, static_cast<char>(world.rank()));
  std::vector<int64_t> slots(tokens);
  for (size_t i = 0; i < tokens; ++i) slots[i] = static_cast<int64_t>(world.rank() * tokens + i);
  CacheTensor t{rows.data(), 0, rowBytes, 0, 1, 0, 0};
  world.barrier();
  std::atomic<int> steps{0};
  std::string error;
  std::thread publisher([&] {
    try {
      while (true) {
        pub.publish({t}, {slots.data(), SlotType::Int64, tokens}, tokens);
        ++steps;
      }
    } catch (const kvcomm::Error& e) {
      error = e.what();
    }
  });
  while (steps.load() < 3) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  buf.close();
  publisher.join();
  EXPECT_NE(error.find("closed"), std::string::npos) << "after " << steps.load() << " steps: " << error;
  world.barrier();
}

// grow() on one thread while another publishes into the backed prefix (the bitmap and the range map change under
// the publisher): no race (TSan runs this suite), no refused row, exact bytes.
TEST_P(HostFaults, GrowOnOneThreadWhileAnotherPublishes) {
  auto world = kvtest::tcpWorld();
  auto buf = SymmetricBuffer::create(world, 64u << 20, 1u << 20, kind_);
  auto pub = Publisher::create(buf);
  const size_t tokens = 64, rowBytes = 256;
  std::vector<uint8_t> rows = kvtest::pattern(seed_, world.rank(), tokens * rowBytes);
  std::vector<int64_t> slots(tokens);
  for (size_t i = 0; i < tokens; ++i) slots[i] = static_cast<int64_t>(world.rank() * tokens + i);
  CacheTensor t{rows.data(), 0, rowBytes, 0, 1, 0, 0};
  world.barrier();
  std::atomic<bool> growing{true};
  std::string error;
  int steps = 0;
  std::thread publisher([&] {
    try {
      while (growing.load() || steps < 10) {
        pub.publish({t}, {slots.data(), SlotType::Int64, tokens}, tokens);
        ++steps;
      }
    } catch (const kvcomm::Error& e) {
      error = e.what();
    }
  });
  size_t g = buf.granularity();
  for (int i = 0; i < 40; ++i) buf.grow(buf.mappedBytes() + g);
  growing = false;
  publisher.join();
  EXPECT_EQ(error, "");
  EXPECT_EQ(buf.mappedBytes(), (1u << 20) + 40 * g);
  pub.barrier().sync();
  auto got = read(buf.local(), world.size() * tokens * rowBytes);
  for (int r = 0; r < world.size(); ++r) {
    auto want = kvtest::pattern(seed_, r, tokens * rowBytes);
    EXPECT_TRUE(std::equal(want.begin(), want.end(), got.begin() + r * tokens * rowBytes)) << "rank " << r;
  }
  world.barrier();
}

// abort() stops a barrier waiting for a member that never arrives: host waits throw Aborted, device waits end (a
// PeerFailed error that checkErrors() throws as Aborted), both within 2 s instead of the 20 s timeout.
TEST_P(Faults, AbortStopsAWaitingBarrier) {
  auto world = kvtest::tcpWorld();
  if (world.size() < 2) GTEST_SKIP() << "needs 2 ranks";
  auto comm = world.split(0, world.rank());  // aborted on rank 0 only; world stays for the test's own sync
  kvcomm::BarrierOptions o;
  o.kind = kind_;
  o.timeoutMs = 20000;
  auto bar = kvcomm::Barrier::create(*comm, o);
  world.barrier();
  if (world.rank() == 0) {
    std::thread aborter([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      comm->abort();
    });
    auto start = std::chrono::steady_clock::now();
    kvcomm::ErrorCode code = kvcomm::ErrorCode::InternalError;
    try {
      bar.sync();  // nobody else arrives
      kvtest::synchronize(kind_);
      bar.checkErrors();
    } catch (const kvcomm::Error& e) {
      code = e.code();
    }
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    aborter.join();
    EXPECT_EQ(code, kvcomm::ErrorCode::Aborted);
    EXPECT_LT(secs, 2.3) << "the wait did not stop at the abort";
    EXPECT_THROW(bar.sync(), kvcomm::Error) << "a barrier after abort() went ahead";
  }
  world.barrier();
}

// abort() reaches the Fetcher: every submission afterwards (plan, fetch, submit of a plan made before, start,
// fetchDevice; from a peer or from this rank's own blocks) throws Aborted naming the call, and a polled fetch running
// at the abort (host memory: paced, so it still runs) ends Failed naming the abort, never Done.
TEST_P(Faults, AbortedFetcherRefusesEverySubmissionAndFailsARunningFetch) {
  auto world = kvtest::tcpWorld();
  if (world.size() < 2) GTEST_SKIP() << "needs 2 ranks";
  auto comm = world.split(0, world.rank());  // aborted on rank 0 only; world stays for the test's own sync
  constexpr size_t kBlock = 1 << 20, kBlocks = 8;
  auto buf = SymmetricBuffer::create(*comm, kBlock * kBlocks, kBlock * kBlocks, kind_);
  kvcomm::KvLayout layout;
  layout.regions.push_back({0, kBlock, 0, kBlocks});
  auto fetcher = kvcomm::Fetcher::create(buf, layout);
  kvcomm::Fetcher overTcp;  // every transport settles with the group's health, not only the peer mappings
  {
    kvtest::ScopedEnv tcp("KVCOMM_FETCH_TRANSPORT", "tcp");
    overTcp = kvcomm::Fetcher::create(buf, layout);
  }
  world.barrier();
  if (world.rank() == 0) {
    std::vector<int64_t> src{0, 1, 2, 3}, dst{4, 5, 6, 7};
    kvcomm::FetchRequest fromPeer{1, src.data(), dst.data(), src.size(), 0};
    kvcomm::FetchRequest local{0, src.data(), dst.data(), src.size(), 0};
    kvcomm::FetchPlan before = fetcher.plan({fromPeer});
    kvcomm::FetchOperation running;
    if (kind_ == MemoryKind::Host) {
      kvcomm::FetchOptions paced;
      paced.maxBytesPerSecond = 8u << 20;  // 4 MiB: about 500 ms
      running = fetcher.start({fromPeer}, paced);
    }
    // Other destination blocks than `running`'s: two operations in flight must not write the same bytes.
    std::vector<int64_t> tcpSrc{0, 1}, tcpDst{2, 3};
    kvcomm::FetchOperation remote =  // may end before abort(), but is not yet observed
        overTcp.start({kvcomm::FetchRequest{1, tcpSrc.data(), tcpDst.data(), tcpSrc.size(), 0}});
    comm->abort();
    auto aborted = [&](const std::function<void()>& f, const char* call) {
      try {
        f();
        kvtest::synchronize(kind_);
        ADD_FAILURE() << call << " went ahead after abort()";
      } catch (const kvcomm::Error& e) {
        EXPECT_EQ(e.code(), kvcomm::ErrorCode::Aborted) << e.what();
        EXPECT_NE(std::string(e.what()).find(call), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("aborted"), std::string::npos) << e.what();
      }
    };
    auto ids = slotsOf({0, 1});
    kvcomm::DeviceFetchBatch batch;
    batch.srcBlocks = reinterpret_cast<const int64_t*>(ids->data());
    batch.dstBlocks = reinterpret_cast<const int64_t*>(ids->data()) + 1;
    batch.srcRank = 1;
    batch.count = 1;
    aborted([&] { (void)fetcher.plan({fromPeer}); }, "Fetcher::plan");
    aborted([&] { fetcher.fetch({fromPeer}); }, "Fetcher::fetch");
    aborted([&] { fetcher.fetch({local}); }, "Fetcher::fetch");
    aborted([&] { fetcher.submit(before); }, "Fetcher::submit");
    aborted([&] { (void)fetcher.start({fromPeer}); }, "Fetcher::start");
    aborted([&] { fetcher.fetchDevice(batch); }, "Fetcher::fetchDevice");
    if (running.valid()) {
      kvcomm::FetchStatus s = running.wait(5000);
      EXPECT_EQ(s.state, kvcomm::FetchState::Failed)
          << "a fetch running at abort() ended " << static_cast<int>(s.state);
      EXPECT_NE(s.error.find("aborted"), std::string::npos) << s.error;
      // However the failure was first seen (between slices or at the end), after an abort no block is landed.
      EXPECT_EQ(s.failedBlocks, dst);
      EXPECT_EQ(s.bytesDone, 0u);
    }
    kvcomm::FetchStatus t = remote.wait(10000);
    EXPECT_EQ(t.state, kvcomm::FetchState::Failed)
        << "a TCP fetch observed after abort() ended " << static_cast<int>(t.state);
    EXPECT_NE(t.error.find("aborted"), std::string::npos) << t.error;
    EXPECT_EQ(t.failedBlocks, tcpDst) << "after an abort no block is reported landed";
    EXPECT_EQ(t.bytesDone, 0u);
  }
  world.barrier();
}

INSTANTIATE_TEST_SUITE_P(Backends, Faults, ::testing::Values(MemoryKind::Host, MemoryKind::Cuda), kvtest::kindName);
INSTANTIATE_TEST_SUITE_P(Host, HostFaults, ::testing::Values(MemoryKind::Host), kvtest::kindName);

// Fallback publishers on two communicators of one world, each driven by its own thread: no deadlock (the one-mesh
// lock is gone), exact bytes.
TEST(Threads, FallbackPublishersOfTwoCommunicatorsOnTwoThreads) {
  setenv("KVCOMM_DIRECT", "0", 1);
  auto world = kvtest::tcpWorld();
  auto other = world.split(0, world.rank());
  uint64_t seed = kvtest::sharedSeed();
  auto bufA = SymmetricBuffer::create(world, 1u << 20, 1u << 20, MemoryKind::Host);
  auto bufB = SymmetricBuffer::create(*other, 1u << 20, 1u << 20, MemoryKind::Host);
  auto pubA = Publisher::create(bufA);
  auto pubB = Publisher::create(bufB);
  unsetenv("KVCOMM_DIRECT");
  ASSERT_EQ(pubA.mode(), kvcomm::PublishMode::Fallback);
  const size_t tokens = 32, rowBytes = 512;
  auto drive = [&](Publisher& pub, SymmetricBuffer& buf, uint64_t salt, std::string* err) {
    try {
      for (int step = 0; step < 100; ++step) {
        auto rows = kvtest::pattern(seed + salt + step, world.rank(), tokens * rowBytes);
        std::vector<int64_t> slots(tokens);
        for (size_t i = 0; i < tokens; ++i) slots[i] = static_cast<int64_t>(world.rank() * tokens + i);
        CacheTensor t{rows.data(), 0, rowBytes, 0, 1, 0, 0};
        pub.publish({t}, {slots.data(), SlotType::Int64, tokens}, tokens);
        pub.barrier().sync();
        for (int r = 0; r < world.size(); ++r) {
          auto want = kvtest::pattern(seed + salt + step, r, tokens * rowBytes);
          if (std::memcmp(static_cast<char*>(buf.local()) + r * tokens * rowBytes, want.data(), want.size()) != 0) {
            *err = "step " + std::to_string(step) + ": rank " + std::to_string(r) + "'s rows differ";
            return;
          }
        }
        pub.barrier().sync();  // nobody overwrites before everyone compared
      }
    } catch (const std::exception& e) {
      *err = e.what();
    }
  };
  std::string errA, errB;
  auto start = std::chrono::steady_clock::now();
  std::thread a([&] { drive(pubA, bufA, 0, &errA); });
  std::thread b([&] { drive(pubB, bufB, 1000, &errB); });
  a.join();
  b.join();
  EXPECT_EQ(errA, "");
  EXPECT_EQ(errB, "");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(60));
  world.barrier();
}

}  // namespace
