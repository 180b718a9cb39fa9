// Fetch under mpirun, on the host backend and (where a GPU is present) the CUDA backend: every fetch compared byte
// for byte, over each rank's whole buffer (guard bytes, untouched blocks, other regions), with a per-block oracle.
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kvcomm/capabilities.hpp"
#include "kvcomm/error.hpp"
#include "kvcomm/fetch.hpp"
#include "mpi/mpi_util.hpp"
#include "support/expect_error.hpp"
#include "support/scoped_env.hpp"
#include "verify/fetch_oracle.hpp"
#include "verify/memory.hpp"

namespace {

using kvtest::expectError;
using kvtest::ScopedEnv;

using kvcomm::Fetcher;
using kvcomm::FetchPath;
using kvcomm::KvLayout;
using kvcomm::MemoryKind;
using kvcomm::SymmetricBuffer;
using kvtest::FetchBatch;
using kvtest::FetchCase;

class Fetch : public kvtest::BackendTest {
 protected:
  // One case: every rank's buffer filled with its blocks, a fetcher, then `run(fetcher, batch)`; every rank's
  // whole buffer compared with the oracle.
  template <typename Run>
  void scenario(kvcomm::Communicator& comm, const FetchCase& c, size_t maxPairs, int sources, Run&& run) {
    size_t extent = 0;
    KvLayout mine = kvtest::makeFetchLayout(c, seed_, comm.rank(), &extent);
    std::vector<KvLayout> layouts;
    size_t most = 0;
    for (int r = 0; r < comm.size(); ++r) {
      size_t e = 0;
      layouts.push_back(kvtest::makeFetchLayout(c, seed_, r, &e));
      most = std::max(most, e);
    }
    auto buf = SymmetricBuffer::create(comm, most, most, kind_);
    auto image = kvtest::initialImage(mine, seed_, comm.rank(), extent);
    kvtest::toMemory(kind_, buf.local(), image.data(), extent);
    Fetcher f = Fetcher::create(buf, mine);
    for (int r = 0; r < comm.size(); ++r)
      ASSERT_EQ(f.layoutHash(r), kvcomm::layoutHash(layouts[static_cast<size_t>(r)]));
    FetchBatch batch = kvtest::makeFetchBatch(seed_, comm.rank(), comm.size(), c.numBlocks, maxPairs, sources);
    comm.barrier();  // every source is filled
    run(f, batch);
    kvtest::synchronize(kind_);
    std::vector<uint8_t> got(extent);
    kvtest::fromMemory(kind_, got.data(), buf.local(), extent);
    kvtest::applyFetchOracle(image, layouts, comm.rank(), seed_, batch);
    std::string diff = kvtest::describeMismatch(got, image, mine);
    EXPECT_EQ(diff, "") << "case blockBytes " << c.blockBytes << " layers " << c.layers << " split " << c.split;
    f.checkErrors();
    comm.barrier();  // nobody refills a buffer a peer still reads
  }

  // This rank's layout for `c`, its extent, and a buffer size that covers every rank's extent.
  KvLayout layoutOf(kvcomm::Communicator& comm, const FetchCase& c, size_t* extent, size_t* most) const {
    *most = 0;
    for (int r = 0; r < comm.size(); ++r) {
      size_t e = 0;
      kvtest::makeFetchLayout(c, seed_, r, &e);
      *most = std::max(*most, e);
    }
    return kvtest::makeFetchLayout(c, seed_, comm.rank(), extent);
  }

  std::vector<FetchCase> cases() const {
    std::vector<FetchCase> v = {
        {16, 64, true, 512}, {656 * 16, 8, false, 128}, {64 << 10, 4, true, 32}, {2 << 20, 1, false, 8}};
    std::mt19937_64 rng(seed_);
    for (int i = 0; i < 3; ++i) {  // random ones: block sizes in 16-byte steps, any layer count up to 64
      size_t bb = 16 * (1 + rng() % 512);
      int layers = 1 + static_cast<int>(rng() % 64);
      v.push_back({bb, layers, rng() % 2 == 0, 8 + rng() % 40});
    }
    return v;
  }

  std::vector<FetchPath> paths() const {
    if (kind_ == MemoryKind::Host) return {FetchPath::Auto};
    return {FetchPath::Kernel, FetchPath::CopyEngine, FetchPath::Auto};
  }
};

TEST_P(Fetch, MatchesPerBlockOracleAcrossLayoutsAndPaths) {
  auto comm = kvtest::tcpWorld();
  for (const FetchCase& c : cases())
    for (FetchPath path : paths()) {
      kvcomm::FetchOptions o;
      o.path = path;
      o.copyEngineMinRunBytes = 3 * c.blockBytes;  // Auto mixes both engines
      scenario(comm, c, 1000, 3, [&](Fetcher& f, const FetchBatch& b) {
        kvcomm::FetchPlanInfo info = f.fetch(b.requests(), nullptr, o);
        EXPECT_EQ(info.pairsIn, b.pairs());
        EXPECT_LE(info.runsOut, (info.pairsIn - info.pairsSkipped) * f.layout(0).regions.size());
        // A plan whose every run goes over the network reports that (KVCOMM_FETCH_TRANSPORT=tcp runs these cases).
        const bool network = info.runsOut > 0 && info.tcpRuns + info.rdmaRuns == info.runsOut;
        if (network) {
          EXPECT_EQ(info.path, FetchPath::Network) << info.toString();
        } else if (kind_ == MemoryKind::Host) {
          EXPECT_EQ(info.path, FetchPath::Host) << info.toString();
        } else if (path != FetchPath::Auto) {
          EXPECT_EQ(info.path, path) << info.toString();
        }
      });
    }
}

TEST_P(Fetch, PlanOnceSubmitTwiceAndPlanReportsCoalescing) {
  auto comm = kvtest::tcpWorld();
  FetchCase c{4096, 2, true, 64};
  scenario(comm, c, 30, 2, [&](Fetcher& f, const FetchBatch& b) {
    kvcomm::FetchPlan plan = f.plan(b.requests());
    EXPECT_EQ(plan.generation(), f.generation());
    EXPECT_GT(plan.info().pairsIn, 0u);
    f.submit(plan);
    f.submit(plan);  // same bytes again
  });
  // One run of 10 consecutive blocks in 4 regions is 4 copies.
  size_t extent = 0;
  KvLayout mine = kvtest::makeFetchLayout(c, seed_, comm.rank(), &extent);
  auto buf = SymmetricBuffer::create(comm, 1u << 22, 1u << 22, kind_);
  Fetcher f = Fetcher::create(buf, mine);
  std::vector<int64_t> src{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, dst{40, 41, 42, 43, 44, 45, 46, 47, 48, 49};
  kvcomm::FetchRequest q{(comm.rank() + 1) % comm.size(), src.data(), dst.data(), src.size(), 0};
  kvcomm::FetchPlan p = f.plan({q});
  EXPECT_EQ(p.info().pairsIn, 10u);
  EXPECT_EQ(p.info().runsOut, 4u) << p.info().toString();
  EXPECT_EQ(p.info().bytes, 10u * 4 * 4096);
  // A plan outlives its fetcher, but no other fetcher takes it: one created after the planner died may sit at its
  // address (such a fetcher accepted the plan and wrote outside its own, smaller layout).
  { Fetcher gone = std::move(f); }
  FetchCase small{4096, 2, true, 8};
  for (int i = 0; i < 5; ++i) {
    Fetcher g = Fetcher::create(buf, kvtest::makeFetchLayout(small, seed_, comm.rank(), &extent));
    kvtest::expectError([&] { g.submit(p); }, kvcomm::ErrorCode::InvalidArgument,
                        {"Fetcher::submit", "made by another fetcher"});
  }
  comm.barrier();
}

// A reused plan copies the sources as they are at each submit (on CUDA its pairs stay in device memory after the
// first submit of a gather-kernel plan: later submits must still read the sources afresh, not replay old bytes).
TEST_P(Fetch, ReusedPlanCopiesTheSourcesAsTheyAreAtEachSubmit) {
  auto comm = kvtest::tcpWorld();
  const FetchCase c{4096, 2, true, 256};
  size_t extent = 0, most = 0;
  const KvLayout mine = layoutOf(comm, c, &extent, &most);
  std::vector<KvLayout> layouts;
  for (int r = 0; r < comm.size(); ++r) {
    size_t e = 0;
    layouts.push_back(kvtest::makeFetchLayout(c, seed_, r, &e));
  }
  auto buf = SymmetricBuffer::create(comm, most, most, kind_);
  Fetcher f = Fetcher::create(buf, mine);
  const FetchBatch batch = kvtest::makeFetchBatch(seed_, comm.rank(), comm.size(), c.numBlocks, 200, 2);
  ASSERT_GT(batch.pairs(), 32u);  // more than a launch carries inline: the pairs live in memory of the plan's
  for (FetchPath path : paths()) {
    kvcomm::FetchOptions o;
    o.path = path;
    const kvcomm::FetchPlan plan = f.plan(batch.requests(), o);
    for (int round = 0; round < 3; ++round) {
      const uint64_t seed = seed_ + 1000 * static_cast<uint64_t>(round + 1) + static_cast<uint64_t>(path);
      auto image = kvtest::initialImage(mine, seed, comm.rank(), extent);
      kvtest::toMemory(kind_, buf.local(), image.data(), extent);
      kvtest::synchronize(kind_);
      comm.barrier();  // every source holds this round's bytes
      f.submit(plan);
      kvtest::synchronize(kind_);
      std::vector<uint8_t> got(extent);
      kvtest::fromMemory(kind_, got.data(), buf.local(), extent);
      kvtest::applyFetchOracle(image, layouts, comm.rank(), seed, batch);
      EXPECT_EQ(kvtest::describeMismatch(got, image, mine), "")
          << "path " << kvcomm::fetchPathName(path) << ", round " << round;
      comm.barrier();  // nobody refills a buffer a peer still reads
    }
  }
  f.checkErrors();
}

TEST_P(Fetch, DeviceIdsFetchAndBadIdsAreReportedByPair) {
  auto comm = kvtest::tcpWorld();
  FetchCase c{1024, 3, true, 40};
  scenario(comm, c, 200, 2, [&](Fetcher& f, const FetchBatch& b) {
    for (size_t k = 0; k < b.ranks.size(); ++k) {
      size_t n = b.src[k].size();
      kvtest::Memory s(kind_, n * 8 + 8), d(kind_, n * 8 + 8);
      kvtest::toMemory(kind_, s.data(), b.src[k].data(), n * 8);
      kvtest::toMemory(kind_, d.data(), b.dst[k].data(), n * 8);
      kvcomm::DeviceFetchBatch db;
      db.srcBlocks = reinterpret_cast<const int64_t*>(s.data());
      db.dstBlocks = reinterpret_cast<const int64_t*>(d.data());
      db.srcRank = b.ranks[k];
      db.count = n;
      f.fetchDevice(db);
      kvtest::synchronize(kind_);
    }
  });
  // A bad id: CUDA copies the other pairs and reports the bad one; host refuses before copying anything.
  size_t extent = 0, most = 0;
  KvLayout mine = layoutOf(comm, c, &extent, &most);
  auto buf = SymmetricBuffer::create(comm, most, most, kind_);
  kvtest::fillMemory(kind_, buf.local(), static_cast<uint8_t>(comm.rank() + 1), extent);  // every byte says whose
  Fetcher f = Fetcher::create(buf, mine);
  comm.barrier();
  std::vector<int64_t> src{1, 2, 999}, dst{30, 31, 32};
  std::vector<int32_t> ranks(3, (comm.rank() + 1) % comm.size());
  kvtest::Memory s(kind_, 24), d(kind_, 24), r(kind_, 12);
  kvtest::toMemory(kind_, s.data(), src.data(), 24);
  kvtest::toMemory(kind_, d.data(), dst.data(), 24);
  kvtest::toMemory(kind_, r.data(), ranks.data(), 12);
  kvcomm::DeviceFetchBatch db{reinterpret_cast<const int64_t*>(s.data()), reinterpret_cast<const int64_t*>(d.data()),
                              reinterpret_cast<const int32_t*>(r.data()), -1, 3};
  if (kind_ == MemoryKind::Host) {
    expectError([&] { f.fetchDevice(db); }, kvcomm::ErrorCode::InvalidArgument, {"pair 2", "999"});
  } else {
    f.fetchDevice(db);
    kvtest::synchronize(kind_);
    expectError([&] { f.checkErrors(); }, kvcomm::ErrorCode::InvalidArgument, {"pair 2", "block id 999"});
  }
  std::vector<uint8_t> got(extent);
  kvtest::fromMemory(kind_, got.data(), buf.local(), extent);
  const kvcomm::KvRegion& r0 = mine.regions[0];
  const uint8_t source = static_cast<uint8_t>((comm.rank() + 1) % comm.size() + 1),
                own = static_cast<uint8_t>(comm.rank() + 1);
  bool landed = got[r0.offset + 30 * r0.blockStride] == source;
  EXPECT_EQ(landed, kind_ == MemoryKind::Cuda) << "pair 0 " << (landed ? "landed" : "did not land");
  EXPECT_EQ(got[r0.offset + 32 * r0.blockStride], own) << "the bad pair wrote its destination";
  comm.barrier();
}

// Device ids that name one destination block several times: the last pair naming it wins the whole block (every
// region, every byte from its source block), on the GPU as on the CPU; never bytes of two sources in one block.
TEST_P(Fetch, DuplicateDestinationsOfDeviceIdsGoWholeToTheLastPair) {
  auto comm = kvtest::tcpWorld();
  FetchCase c{64 << 10, 2, true, 32};  // 4 regions of 64 KiB blocks: many warps per block
  size_t extent = 0, most = 0;
  KvLayout mine = layoutOf(comm, c, &extent, &most);
  std::vector<KvLayout> layouts;
  for (int r = 0; r < comm.size(); ++r) {
    size_t e = 0;
    layouts.push_back(kvtest::makeFetchLayout(c, seed_, r, &e));
  }
  auto buf = SymmetricBuffer::create(comm, most, most, kind_);
  std::vector<uint8_t> want = kvtest::initialImage(mine, seed_, comm.rank(), extent);
  kvtest::toMemory(kind_, buf.local(), want.data(), extent);
  Fetcher f = Fetcher::create(buf, mine);
  comm.barrier();
  const int src = (comm.rank() + 1) % comm.size();
  std::mt19937_64 rng(seed_ + static_cast<uint64_t>(comm.rank()));
  for (int round = 0; round < 4; ++round) {
    // 256 pairs into 8 destination blocks of [16, 24) from source blocks of [0, 16) (never written by anyone).
    const size_t n = 256;
    kvtest::FetchBatch b;
    b.ranks = {src};
    b.src.resize(1);
    b.dst.resize(1);
    for (size_t i = 0; i < n; ++i) {
      b.src[0].push_back(static_cast<int64_t>(rng() % 16));
      b.dst[0].push_back(16 + static_cast<int64_t>(rng() % 8));
    }
    kvtest::applyFetchOracle(want, layouts, comm.rank(), seed_, b);  // pair by pair: the last one stays
    kvtest::Memory s(kind_, n * 8), d(kind_, n * 8);
    kvtest::toMemory(kind_, s.data(), b.src[0].data(), n * 8);
    kvtest::toMemory(kind_, d.data(), b.dst[0].data(), n * 8);
    kvcomm::DeviceFetchBatch db;
    db.srcBlocks = reinterpret_cast<const int64_t*>(s.data());
    db.dstBlocks = reinterpret_cast<const int64_t*>(d.data());
    db.srcRank = src;
    db.count = n;
    f.fetchDevice(db);
    kvtest::synchronize(kind_);
    f.checkErrors();
    std::vector<uint8_t> got(extent);
    kvtest::fromMemory(kind_, got.data(), buf.local(), extent);
    ASSERT_EQ(kvtest::describeMismatch(got, want, mine), "") << "round " << round;
  }
  comm.barrier();
}

// Pairs checked on the device (FetchValidation::Device): the same bytes as the host planner's fetch, whether the
// ids are pageable, pinned or in device memory. Host buffers check on the host (documented), same bytes.
TEST_P(Fetch, DeviceValidatedFetchMatchesOracleWhereverTheIdsLive) {
  auto comm = kvtest::tcpWorld();
  enum Where { Pageable, Pinned, OnDevice };
  const std::vector<Where> wheres =
      kind_ == MemoryKind::Cuda ? std::vector<Where>{Pageable, Pinned, OnDevice} : std::vector<Where>{Pageable};
  std::vector<FetchCase> all = cases();
  for (size_t ci = 0; ci < all.size(); ci += 2)
    for (Where where : wheres) {
      kvcomm::FetchOptions o;
      o.validation = kvcomm::FetchValidation::Device;
      scenario(comm, all[ci], 1000, 3, [&](Fetcher& f, const FetchBatch& b) {
        std::vector<kvcomm::FetchRequest> q = b.requests();
        std::vector<std::unique_ptr<kvtest::PinnedMemory>> pins;
        std::vector<std::unique_ptr<kvtest::Memory>> mem;
        for (size_t k = 0; k < q.size(); ++k) {
          const size_t bytes = q[k].count * sizeof(int64_t);
          if (where == Pinned) {
            for (int side = 0; side < 2; ++side) {
              pins.push_back(std::make_unique<kvtest::PinnedMemory>(bytes));
              std::memcpy(pins.back()->data(), side ? q[k].dstBlocks : q[k].srcBlocks, bytes);
              (side ? q[k].dstBlocks : q[k].srcBlocks) = reinterpret_cast<const int64_t*>(pins.back()->data());
            }
          } else if (where == OnDevice) {
            for (int side = 0; side < 2; ++side) {
              mem.push_back(std::make_unique<kvtest::Memory>(kind_, bytes + 8));
              kvtest::toMemory(kind_, mem.back()->data(), side ? q[k].dstBlocks : q[k].srcBlocks, bytes);
              (side ? q[k].dstBlocks : q[k].srcBlocks) = reinterpret_cast<const int64_t*>(mem.back()->data());
            }
          }
        }
        kvcomm::FetchPlanInfo info = f.fetch(q, nullptr, o);
        EXPECT_EQ(info.pairsIn, b.pairs());
        kvtest::synchronize(kind_);  // before the ids are unpinned or freed
      });
    }
}

// A bad pair anywhere in a batch checked on the device: nothing of the batch lands (every byte of this rank's
// buffer as it was), the first bad pair in batch order is named as the host planner names it, and the next batch
// runs as if nothing happened. Host buffers refuse synchronously (checked on the host).
TEST_P(Fetch, DeviceValidationRefusesTheWholeBatchNamingTheFirstBadPair) {
  auto comm = kvtest::tcpWorld();
  FetchCase c{4096, 2, true, 64};
  size_t extent = 0, most = 0;
  KvLayout mine = layoutOf(comm, c, &extent, &most);
  auto buf = SymmetricBuffer::create(comm, most, most, kind_);
  const uint8_t own = static_cast<uint8_t>(comm.rank() + 1);
  kvtest::fillMemory(kind_, buf.local(), own, extent);  // every byte says whose
  Fetcher f = Fetcher::create(buf, mine);
  comm.barrier();
  const int peer = (comm.rank() + 1) % comm.size(), me = comm.rank();
  kvcomm::FetchOptions o;
  o.validation = kvcomm::FetchValidation::Device;
  struct Bad {
    const char* what;
    std::vector<int64_t> src0, dst0, src1, dst1;  // request 0 from the peer, request 1 from `rank1`
    int rank1;
    std::vector<std::string> says;
  };
  const std::vector<Bad> bads = {
      {"source out of range",
       {1, 2, 3},
       {10, 11, 12},
       {4, 999, 5},
       {13, 14, 15},
       peer,
       {"request 1, pair 1", "source block 999"}},
      {"destination out of range",
       {1, 2, 3},
       {10, 11, 12},
       {4, 5, 6},
       {13, 14, 64},
       peer,
       {"request 1, pair 2", "destination block 64"}},
      {"negative id other than -1",
       {1, -1, 3},
       {10, 11, -2},
       {4},
       {13},
       peer,
       {"request 0, pair 2", "destination block -2"}},
      // Two duplicate groups (11 and 10): the first second use in order is request 1, pair 1 (11 again).
      {"duplicate destination",
       {1, 2, 3, 7},
       {10, 11, 12, 20},
       {4, 5, 6, 8},
       {13, 11, 14, 10},
       peer,
       {"request 1, pair 1", "destination block 11", "duplicate destination"}},
      // Reads a local block (30) that request 0 writes; a range error would come first, so none here.
      {"reads a block the batch writes",
       {1, 2, 3},
       {30, 31, 32},
       {40, 30},
       {41, 42},
       me,
       {"request 1, pair 1", "source block 30", "also written by"}}};
  for (const Bad& bad : bads) {
    std::vector<kvcomm::FetchRequest> q(2);
    q[0] = {peer, bad.src0.data(), bad.dst0.data(), bad.src0.size(), 0};
    q[1] = {bad.rank1, bad.src1.data(), bad.dst1.data(), bad.src1.size(), 0};
    if (kind_ == MemoryKind::Host) {
      expectError([&] { f.fetch(q, nullptr, o); }, kvcomm::ErrorCode::InvalidArgument, bad.says);
    } else {
      f.fetch(q, nullptr, o);
      kvtest::synchronize(kind_);
      std::vector<std::string> says = bad.says;
      says.push_back("nothing of the batch was copied");
      expectError([&] { f.checkErrors(); }, kvcomm::ErrorCode::InvalidArgument, says);
      EXPECT_FALSE(f.pollError()) << "the refusal is reported once";
    }
    std::vector<uint8_t> got(extent);
    kvtest::fromMemory(kind_, got.data(), buf.local(), extent);
    size_t wrong = 0;
    for (uint8_t v : got) wrong += v != own;
    EXPECT_EQ(wrong, 0u) << bad.what << ": bytes of this rank's buffer changed";
  }
  // After every refusal: a good batch (one destination of each bad one) lands whole, on both sides of the parity.
  for (int round = 0; round < 2; ++round) {
    std::vector<int64_t> src{1, 2, 3, 4}, dst{10 + round, 11 + 2 * round, 12 + 4 * round, 30};
    std::vector<kvcomm::FetchRequest> q{{peer, src.data(), dst.data(), src.size(), 0}};
    f.fetch(q, nullptr, o);
    kvtest::synchronize(kind_);
    f.checkErrors();
    std::vector<uint8_t> got(extent);
    kvtest::fromMemory(kind_, got.data(), buf.local(), extent);
    for (const kvcomm::KvRegion& r : mine.regions)
      for (int64_t d : dst)
        EXPECT_EQ(got[r.offset + static_cast<uint64_t>(d) * r.blockStride + r.blockBytes - 1],
                  static_cast<uint8_t>(peer + 1))
            << "round " << round << ": block " << d << " did not land";
  }
  comm.barrier();
}

// What a batch checked on the device cannot do is refused before anything is enqueued, naming it.
TEST_P(Fetch, DeviceValidationRefusesWhatItCannotCheck) {
  auto comm = kvtest::tcpWorld();
  FetchCase c{4096, 1, true, 64};
  size_t extent = 0, most = 0;
  KvLayout mine = layoutOf(comm, c, &extent, &most);
  auto buf = SymmetricBuffer::create(comm, most, most, kind_);
  Fetcher f = Fetcher::create(buf, mine);
  const int peer = (comm.rank() + 1) % comm.size();
  std::vector<int64_t> src{1}, dst{2};
  std::vector<kvcomm::FetchRequest> one{{peer, src.data(), dst.data(), 1, 0}};
  kvcomm::FetchOptions o;
  o.validation = static_cast<kvcomm::FetchValidation>(7);
  expectError([&] { f.fetch(one, nullptr, o); }, kvcomm::ErrorCode::InvalidArgument, {"options.validation", "7"});
  o.validation = kvcomm::FetchValidation::Device;
  if (kind_ == MemoryKind::Cuda) {
    kvcomm::FetchOptions ce = o;
    ce.path = FetchPath::CopyEngine;
    expectError([&] { f.fetch(one, nullptr, ce); }, kvcomm::ErrorCode::Unsupported, {"gather kernel", "copy"});
    std::vector<kvcomm::FetchRequest> many(17, kvcomm::FetchRequest{peer, src.data(), dst.data(), 0, 0});
    expectError([&] { f.fetch(many, nullptr, o); }, kvcomm::ErrorCode::InvalidArgument,
                {"17 requests", "kMaxDeviceCheckedRequests"});
    std::vector<kvcomm::FetchRequest> hash{{peer, src.data(), dst.data(), 1, 12345}};
    expectError([&] { f.fetch(hash, nullptr, o); }, kvcomm::ErrorCode::InvalidArgument, {"request 0", "layout hash"});
    std::vector<kvcomm::FetchRequest> nul{{peer, nullptr, dst.data(), 1, 0}};
    expectError([&] { f.fetch(nul, nullptr, o); }, kvcomm::ErrorCode::InvalidArgument, {"request 0", "null id array"});
    std::vector<kvcomm::FetchRequest> rank{{comm.size(), src.data(), dst.data(), 1, 0}};
    expectError([&] { f.fetch(rank, nullptr, o); }, kvcomm::ErrorCode::InvalidArgument,
                {"request 0", "outside the group"});
  }
  f.fetch(one, nullptr, o);  // and a good one still runs
  kvtest::synchronize(kind_);
  f.checkErrors();
  comm.barrier();
  {
    // Sources reached over a network transport: their pairs can only be checked on the host.
    ScopedEnv tcp("KVCOMM_FETCH_TRANSPORT", "tcp");
    Fetcher t = Fetcher::create(buf, mine);
    if (kind_ == MemoryKind::Cuda && t.transport(peer) == kvcomm::FetchTransportKind::Tcp)
      expectError([&] { t.fetch(one, nullptr, o); }, kvcomm::ErrorCode::Unsupported,
                  {"request 0", "reached over tcp", "validation host"});
    comm.barrier();
  }
}

TEST_P(Fetch, PolledFetchReportsBytesAndCompletes) {
  auto comm = kvtest::tcpWorld();
  FetchCase c{8192, 4, false, 64};
  scenario(comm, c, 500, 3, [&](Fetcher& f, const FetchBatch& b) {
    kvcomm::FetchOperation op = f.start(b.requests());
    kvcomm::FetchStatus s = op.wait(10000);
    ASSERT_EQ(s.state, kvcomm::FetchState::Done) << s.error;
    EXPECT_EQ(s.bytesDone, s.bytesTotal);
    size_t kept = 0;
    for (size_t k = 0; k < b.src.size(); ++k)
      for (size_t i = 0; i < b.src[k].size(); ++i) kept += b.src[k][i] != -1 && b.dst[k][i] != -1;
    EXPECT_EQ(s.bytesTotal, kept * 4 * 8192);
    EXPECT_TRUE(s.failedBlocks.empty());
    EXPECT_EQ(op.test().state, kvcomm::FetchState::Done);
  });
  if (kind_ == MemoryKind::Host) {
    // Paced: 4 MiB at 4 MiB/s takes most of a second (the pause follows each 1 MiB slice); a wait far shorter than
    // that returns InProgress and cancels nothing, with room for a loaded machine's stalls.
    size_t extent = 0, most = 0;
    KvLayout mine = layoutOf(comm, FetchCase{1 << 20, 1, false, 16}, &extent, &most);
    auto buf = SymmetricBuffer::create(comm, most, most, kind_);
    Fetcher f = Fetcher::create(buf, mine);
    std::vector<int64_t> src{0, 1, 2, 3}, dst{8, 9, 10, 11};
    kvcomm::FetchOptions o;
    o.maxBytesPerSecond = 4u << 20;
    kvcomm::FetchOperation op = f.start({{(comm.rank() + 1) % comm.size(), src.data(), dst.data(), 4, 0}}, o);
    kvcomm::FetchStatus early = op.wait(30);
    EXPECT_EQ(early.state, kvcomm::FetchState::InProgress);
    EXPECT_LT(early.bytesDone, early.bytesTotal);
    kvcomm::FetchStatus done = op.wait(5000);
    EXPECT_EQ(done.state, kvcomm::FetchState::Done) << done.error;
    EXPECT_EQ(done.bytesDone, 4u << 20);
    // A timeout too large for a deadline (INT64_MAX, anything above 10^12 ms) waits for the end, like -1: it used to
    // wrap into the past and return InProgress at once.
    for (int64_t huge : {INT64_MAX, int64_t{1000000000001}}) {
      auto t0 = std::chrono::steady_clock::now();  // before start: a stall between the two only adds to the wait
      kvcomm::FetchOperation again = f.start({{(comm.rank() + 1) % comm.size(), src.data(), dst.data(), 4, 0}}, o);
      kvcomm::FetchStatus s = again.wait(huge);
      EXPECT_EQ(s.state, kvcomm::FetchState::Done) << "wait(" << huge << "): " << s.error;
      EXPECT_EQ(s.bytesDone, 4u << 20) << "wait(" << huge << ")";
      EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(700)) << "wait(" << huge << ")";
    }
    comm.barrier();
  }
}

TEST_P(Fetch, CollectiveFormIsABlockAllToAll) {
  auto comm = kvtest::tcpWorld();
  for (const FetchCase& c : {FetchCase{16 << 10, 2, false, 64}, FetchCase{64 << 10, 1, true, 32}})
    scenario(comm, c, 60, comm.size(), [&](Fetcher& f, const FetchBatch& b) {
      for (int step = 0; step < 3; ++step) f.fetchAll(b.requests());  // idempotent: sources are never written
    });
}

TEST_P(Fetch, StaleAfterGrowUntilRefresh) {
  auto comm = kvtest::tcpWorld();
  size_t extent = 0, most = 0;
  KvLayout mine = layoutOf(comm, {4096, 2, false, 16}, &extent, &most);
  auto buf = SymmetricBuffer::create(comm, 64u << 20, most, kind_);
  Fetcher f = Fetcher::create(buf, mine);
  std::vector<int64_t> src{0}, dst{9};
  kvcomm::FetchRequest q{(comm.rank() + 1) % comm.size(), src.data(), dst.data(), 1, 0};
  kvcomm::FetchPlan plan = f.plan({q});
  buf.grow(most + (4u << 20));
  expectError([&] { f.plan({q}); }, kvcomm::ErrorCode::InvalidArgument, {"stale", "refresh"});
  expectError([&] { f.submit(plan); }, kvcomm::ErrorCode::InvalidArgument, {"stale"});
  f.refresh();
  EXPECT_EQ(f.generation(), buf.generation());
  f.fetch({q});
  expectError([&] { f.submit(plan); }, kvcomm::ErrorCode::InvalidArgument, {"stale"});  // plans stay old
  kvtest::synchronize(kind_);
  comm.barrier();
}

TEST_P(Fetch, PathsThatCannotRunAreRefusedLoudly) {
  auto comm = kvtest::tcpWorld();
  size_t extent = 0, most = 0;
  KvLayout mine = layoutOf(comm, {4096, 1, false, 8}, &extent, &most);
  auto buf = SymmetricBuffer::create(comm, most, most, kind_);
  Fetcher f = Fetcher::create(buf, mine);
  std::vector<int64_t> src{0}, dst{5};
  kvcomm::FetchRequest q{(comm.rank() + 1) % comm.size(), src.data(), dst.data(), 1, 0};
  kvcomm::FetchOptions o;
  o.path = kind_ == MemoryKind::Host ? FetchPath::Kernel : FetchPath::Host;
  expectError([&] { f.fetch({q}, nullptr, o); }, kvcomm::ErrorCode::Unsupported, {"path"});
  {
    ScopedEnv bad("KVCOMM_FETCH_PATH", "teleport");
    expectError([&] { f.fetch({q}); }, kvcomm::ErrorCode::InvalidArgument,
                {"KVCOMM_FETCH_PATH", "teleport", "accepted"});
  }
  {
    ScopedEnv demand("KVCOMM_FETCH_PATH", kind_ == MemoryKind::Host ? "copy" : "host");
    expectError([&] { f.fetch({q}); }, kvcomm::ErrorCode::Unsupported, {"path"});
  }
  // A path outside the enum (an integer cast by the caller) is an InvalidArgumentError naming the call and the
  // value, not an Unsupported naming some path; fetchAll's refusal still runs both barriers (no rank is stranded).
  // Each call that takes options refuses `o`, naming itself and `what`.
  auto everyCallRefuses = [&](const std::string& what) {
    expectError([&] { (void)f.plan({q}, o); }, kvcomm::ErrorCode::InvalidArgument, {"Fetcher::plan", what});
    expectError([&] { f.fetch({q}, nullptr, o); }, kvcomm::ErrorCode::InvalidArgument, {"Fetcher::fetch", what});
    expectError([&] { (void)f.start({q}, o); }, kvcomm::ErrorCode::InvalidArgument, {"Fetcher::start", what});
    expectError([&] { f.fetchAll({q}, nullptr, o); }, kvcomm::ErrorCode::InvalidArgument, {"Fetcher::fetchAll", what});
  };
  o.path = static_cast<FetchPath>(77);
  everyCallRefuses("options.path 77");
  // The same for a validation outside its enum.
  o.path = FetchPath::Auto;
  o.validation = static_cast<kvcomm::FetchValidation>(9);
  everyCallRefuses("options.validation 9");
  kvtest::synchronize(kind_);
  comm.barrier();
}

// Every method of an empty (default-constructed or moved-from) Fetcher, FetchPlan and FetchOperation throws
// InvalidArgumentError naming it.
TEST_P(Fetch, EveryMethodOfAnEmptyHandleThrows) {
  auto comm = kvtest::tcpWorld();
  auto buf = SymmetricBuffer::create(comm, 1u << 20, 1u << 20, kind_);
  KvLayout l;
  l.regions.push_back({0, 4096, 0, 16});
  Fetcher made = Fetcher::create(buf, l);
  Fetcher taken = std::move(made);
  EXPECT_TRUE(taken.valid());
  std::vector<int64_t> src{0}, dst{1};
  kvcomm::FetchRequest q{comm.rank(), src.data(), dst.data(), 1, 0};
  auto empty = [&](const std::function<void()>& f, const char* call) {
    expectError(f, kvcomm::ErrorCode::InvalidArgument, {call, "empty"});
  };
  Fetcher fresh;
  for (Fetcher* f : {&fresh, &made}) {
    EXPECT_FALSE(f->valid());
    empty([&] { (void)f->plan({q}); }, "Fetcher::plan");
    empty([&] { f->fetch({q}); }, "Fetcher::fetch");
    empty([&] { f->submit(kvcomm::FetchPlan()); }, "Fetcher::submit");
    empty([&] { f->fetchDevice(kvcomm::DeviceFetchBatch()); }, "Fetcher::fetchDevice");
    empty([&] { (void)f->start({q}); }, "Fetcher::start");
    empty([&] { f->fetchAll({q}); }, "Fetcher::fetchAll");
    empty([&] { f->refresh(); }, "Fetcher::refresh");
    empty([&] { (void)f->transport(0); }, "Fetcher::transport");
    empty([&] { (void)f->layout(0); }, "Fetcher::layout");
    empty([&] { (void)f->layoutHash(0); }, "Fetcher::layoutHash");
    empty([&] { (void)f->generation(); }, "Fetcher::generation");
    empty([&] { (void)f->buffer(); }, "Fetcher::buffer");
    empty([&] { (void)f->deviceHandle(); }, "Fetcher::deviceHandle");
    empty([&] { (void)f->pollError(); }, "Fetcher::pollError");
    empty([&] { f->checkErrors(); }, "Fetcher::checkErrors");
  }
  kvcomm::FetchPlan plan;
  EXPECT_FALSE(plan.valid());
  empty([&] { (void)plan.info(); }, "FetchPlan::info");
  empty([&] { (void)plan.generation(); }, "FetchPlan::generation");
  kvcomm::FetchOperation op = taken.start({q});
  kvcomm::FetchOperation kept = std::move(op);
  EXPECT_EQ(kept.wait(5000).state, kvcomm::FetchState::Done);
  for (kvcomm::FetchOperation* o : {&op, static_cast<kvcomm::FetchOperation*>(nullptr)}) {
    kvcomm::FetchOperation none;
    kvcomm::FetchOperation& e = o ? *o : none;
    EXPECT_FALSE(e.valid());
    empty([&] { (void)e.test(); }, "FetchOperation::test");
    empty([&] { (void)e.wait(0); }, "FetchOperation::wait");
  }
  kvtest::synchronize(kind_);
  comm.barrier();
}

TEST_P(Fetch, CreateRefusesIncompatibleOrUnbackedLayoutsOnEveryRank) {
  auto comm = kvtest::tcpWorld();
  if (comm.size() < 2) GTEST_SKIP() << "needs 2 ranks";
  auto buf = SymmetricBuffer::create(comm, 8u << 20, 4u << 20, kind_);
  KvLayout l;
  l.regions.push_back({0, 4096, 0, 64});
  l.regions.push_back({1u << 20, comm.rank() == 1 ? 2048u : 4096u, 4096, 64});
  expectError([&] { Fetcher::create(buf, l); }, kvcomm::ErrorCode::InvalidArgument, {"region 1 of rank 1", "2048"});
  KvLayout beyond;
  beyond.regions.push_back({comm.rank() == 1 ? (6u << 20) : 0u, 4096, 0, 16});  // rank 1: not backed (grow first)
  expectError([&] { Fetcher::create(buf, beyond); }, kvcomm::ErrorCode::InvalidArgument,
              {"rank 1", "not wholly backed"});
  KvLayout overlapping;  // rank 1: region 1's block k is region 0's block k + 1
  overlapping.regions.push_back({0, 4096, 0, 16});
  overlapping.regions.push_back({comm.rank() == 1 ? 4096u : (1u << 20), 4096, 0, 16});
  expectError([&] { Fetcher::create(buf, overlapping); }, kvcomm::ErrorCode::InvalidArgument,
              {"rank 1", "regions 0 and 1 overlap"});
  {  // a knob only rank 1 gets wrong fails every member at once (the others waited for rank 1 in create)
    ScopedEnv bad("KVCOMM_FETCH_TCP_CONNECTIONS", comm.rank() == 1 ? "0" : "");
    auto t0 = std::chrono::steady_clock::now();
    KvLayout good;
    good.regions.push_back({0, 4096, 0, 64});
    expectError([&] { Fetcher::create(buf, good); }, kvcomm::ErrorCode::InvalidArgument,
                {"rank 1", "KVCOMM_FETCH_TCP_CONNECTIONS"});
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
  }
  comm.barrier();
}

TEST_P(Fetch, WorksOnAdoptedEngineMemory) {
  auto comm = kvtest::tcpWorld();
  kvtest::EngineCache cache(kind_, 64u << 20);
  const size_t g = cache.granularity();
  const size_t first = (1u << 20) / g * g + g, second = 16u << 20, secondBytes = (512u << 10) / g * g + g;
  cache.commit(0, first);
  cache.commit(second, secondBytes);
  auto buf = SymmetricBuffer::adopt(comm, cache.base(), 64u << 20, kind_);
  buf.commit({{0, first}, {second, secondBytes}});
  // Two regions in two committed ranges (a gap between them, like two layers of an engine's cache).
  KvLayout l;
  l.regions.push_back({4096, 4096, 8192, 32});
  l.regions.push_back({second + 128, 4096, 4096, 32});
  for (size_t j = 0; j < 2; ++j)
    for (size_t b = 0; b < 32; ++b) {
      auto v = kvtest::blockContent(seed_, comm.rank(), j, static_cast<int64_t>(b), 4096);
      kvtest::toMemory(kind_, cache.base() + l.regions[j].offset + b * l.regions[j].blockStride, v.data(), 4096);
    }
  Fetcher f = Fetcher::create(buf, l);
  comm.barrier();
  const int src = (comm.rank() + 1) % comm.size();
  std::vector<int64_t> s{3, 4, 5, 0}, d{20, 21, 22, 31};
  f.fetch({{src, s.data(), d.data(), s.size(), f.layoutHash(src)}});
  kvtest::synchronize(kind_);
  for (size_t j = 0; j < 2; ++j)
    for (size_t i = 0; i < s.size(); ++i) {
      std::vector<uint8_t> got(4096);
      kvtest::fromMemory(kind_, got.data(), cache.base() + l.regions[j].offset + d[i] * l.regions[j].blockStride, 4096);
      EXPECT_EQ(got, kvtest::blockContent(seed_, src, j, s[i], 4096)) << "region " << j << " pair " << i;
    }
  comm.barrier();
  f = Fetcher();
  buf.close();
}

TEST_P(Fetch, OneHostPicksThePeerMappingsAndTcpWhenDemanded) {
  auto comm = kvtest::tcpWorld();
  size_t extent = 0, most = 0;
  KvLayout mine = layoutOf(comm, {4096, 2, false, 16}, &extent, &most);
  auto buf = SymmetricBuffer::create(comm, most, most, kind_);
  {
    ScopedEnv automatic("KVCOMM_FETCH_TRANSPORT", "auto");
    Fetcher f = Fetcher::create(buf, mine);
    for (int r = 0; r < comm.size(); ++r)
      EXPECT_EQ(f.transport(r), buf.isMapped(r) ? kvcomm::FetchTransportKind::Peer : kvcomm::FetchTransportKind::Tcp)
          << "rank " << r;
  }
  {
    ScopedEnv tcp("KVCOMM_FETCH_TRANSPORT", "tcp");
    Fetcher f = Fetcher::create(buf, mine);
    for (int r = 0; r < comm.size(); ++r)
      EXPECT_EQ(f.transport(r), r == comm.rank() ? kvcomm::FetchTransportKind::Peer : kvcomm::FetchTransportKind::Tcp)
          << "rank " << r;
    if (comm.size() > 1) {  // alone, the next rank is this one: a local copy
      EXPECT_STREQ(kvcomm::fetchTransportName(f.transport((comm.rank() + 1) % comm.size())), "tcp");
    }
  }
  {
    ScopedEnv bad("KVCOMM_FETCH_TRANSPORT", "carrier-pigeon");
    expectError([&] { Fetcher::create(buf, mine); }, kvcomm::ErrorCode::InvalidArgument,
                {"KVCOMM_FETCH_TRANSPORT", "carrier-pigeon", "auto, peer, rdma, tcp"});
  }
  comm.barrier();
}

// Every fetch form over the TCP transport (a server per member, on this host's interface), byte for byte against the
// oracle with guard bytes: CUDA buffers go through pinned staging on both ends.
TEST_P(Fetch, OverTcpMatchesPerBlockOracle) {
  auto comm = kvtest::tcpWorld();
  ScopedEnv tcp("KVCOMM_FETCH_TRANSPORT", "tcp");
  for (const FetchCase& c : {FetchCase{4096, 4, true, 64}, FetchCase{656 * 16, 3, false, 48},
                             FetchCase{1 << 20, 2, true, 16}, FetchCase{48, 64, false, 200}})
    scenario(comm, c, 400, 3, [&](Fetcher& f, const FetchBatch& b) {
      kvcomm::FetchPlanInfo info = f.fetch(b.requests());
      size_t remote = 0;
      for (size_t k = 0; k < b.ranks.size(); ++k)
        if (b.ranks[k] != comm.rank())
          for (size_t i = 0; i < b.src[k].size(); ++i) remote += b.src[k][i] != -1 && b.dst[k][i] != -1;
      EXPECT_EQ(info.tcpRuns > 0, remote > 0) << info.toString();
      EXPECT_EQ(info.rdmaRuns, 0u);
      EXPECT_EQ(info.runsOut, info.kernelRuns + info.copyEngineRuns + info.hostRuns + info.tcpRuns);
      if (info.kernelRuns + info.copyEngineRuns + info.hostRuns == 0 && info.tcpRuns > 0) {
        EXPECT_EQ(info.path, kvcomm::FetchPath::Network) << info.toString();  // not a same-host path
      }
      kvcomm::FetchPlan plan = f.plan(b.requests());
      f.submit(plan);
      kvcomm::FetchOperation op = f.start(b.requests());  // the same bytes again, polled
      kvcomm::FetchStatus st = op.wait(20000);
      EXPECT_EQ(st.state, kvcomm::FetchState::Done) << st.error;
      EXPECT_EQ(st.bytesDone, st.bytesTotal);
    });
}

TEST_P(Fetch, DemandedRdmaRunsWhereThereIsADeviceAndIsRefusedLoudlyWhereNot) {
  auto comm = kvtest::tcpWorld();
  ScopedEnv rdma("KVCOMM_FETCH_TRANSPORT", "rdma");
  if (!kvcomm::capabilities().rdma) {
    size_t extent = 0, most = 0;
    KvLayout mine = layoutOf(comm, {4096, 2, false, 16}, &extent, &most);
    auto buf = SymmetricBuffer::create(comm, most, most, kind_);
    expectError([&] { Fetcher::create(buf, mine); }, kvcomm::ErrorCode::Unsupported,
                {"KVCOMM_FETCH_TRANSPORT=rdma", "no usable RDMA device"});
    comm.barrier();
    return;
  }
  // A device is present: the blocks move by RDMA READ between the members of this host (loopback through the NIC).
  scenario(comm, FetchCase{8192, 3, true, 64}, 300, 3, [&](Fetcher& f, const FetchBatch& b) {
    for (int r = 0; r < comm.size(); ++r)
      EXPECT_EQ(f.transport(r), r == comm.rank() ? kvcomm::FetchTransportKind::Peer : kvcomm::FetchTransportKind::Rdma);
    kvcomm::FetchPlanInfo info = f.fetch(b.requests());
    EXPECT_EQ(info.tcpRuns, 0u);
    kvcomm::FetchStatus st = f.start(b.requests()).wait(20000);
    EXPECT_EQ(st.state, kvcomm::FetchState::Done) << st.error;
  });
}

// release() on the group while a paced polled host fetch still reads a peer's range through the mappings it unmaps:
// the operation fails at its next slice naming the change (the process crashed reading the unmapped peer range).
TEST(FetchHostMemory, ReleaseDuringAPolledFetchFailsItAndNothingCrashes) {
  auto comm = kvtest::tcpWorld();
  if (comm.size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const size_t reserved = 64u << 20, committed = 32u << 20;
  kvtest::EngineCache cache(MemoryKind::Host, reserved);
  cache.commit(0, committed);
  auto buf = SymmetricBuffer::adopt(comm, cache.base(), reserved, MemoryKind::Host);
  buf.commit({{0, committed}});
  KvLayout l;
  l.regions.push_back({0, 1u << 20, 0, 16});
  Fetcher f = Fetcher::create(buf, l);
  comm.barrier();
  std::vector<int64_t> s{0, 1, 2, 3, 4, 5, 6, 7}, d{8, 9, 10, 11, 12, 13, 14, 15};
  kvcomm::FetchOptions paced;
  paced.maxBytesPerSecond = 1u << 20;  // 8 MiB: about 8 s, so the release lands in the middle
  kvcomm::FetchOperation op = f.start({{(comm.rank() + 1) % comm.size(), s.data(), d.data(), s.size(), 0}}, paced);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  buf.release({{0, committed}});  // collective: every member unmaps its view of every peer's range
  kvcomm::FetchStatus st = op.wait(30000);
  EXPECT_EQ(st.state, kvcomm::FetchState::Failed);
  EXPECT_NE(st.error.find("the buffer changed"), std::string::npos) << st.error;
  EXPECT_LT(st.bytesDone, st.bytesTotal);
  comm.barrier();
}

INSTANTIATE_TEST_SUITE_P(Backends, Fetch, ::testing::Values(MemoryKind::Host, MemoryKind::Cuda), kvtest::kindName);

}  // namespace
