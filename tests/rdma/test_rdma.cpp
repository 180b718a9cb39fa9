// The verbs transport on a real RDMA device (tests/unit/test_verbs_fake.cpp runs the same paths on the fake
// provider): two fabrics of this process on the device, connected by loopback RC queue pairs; READs of host memory
// byte for byte within the device's READ depth, and a read of a released (deregistered) piece failing as a remote
// access error after a full drain. Without a device the binary prints "not run (no RDMA device): why" and exits
// 77, which CTest reports as skipped, never as passed.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "fetch/member_layouts.hpp"
#include "fetch/planner.hpp"
#include "fetch/transport/rdma/verbs_transport.hpp"
#include "kvcomm/error.hpp"
#include "platform/ibverbs.hpp"

namespace {

using namespace kvcomm::detail;
using kvcomm::FetchRegionView;

constexpr size_t kMem = 8 << 20;

TEST(RdmaDevice, LoopbackReadsAreByteExactAndAReleasedPieceFaults) {
  std::vector<uint8_t> src(kMem), dst(kMem, 0x5a);
  std::mt19937_64 rng(5);
  for (auto& b : src) b = static_cast<uint8_t>(rng());
  std::string why;
  auto a = VerbsFabric::open(nullptr, kvcomm::MemoryKind::Host, -1, "", "memfd", 3000, &why);
  ASSERT_TRUE(a) << why;
  auto b = VerbsFabric::open(nullptr, kvcomm::MemoryKind::Host, -1, "", "memfd", 3000, &why);
  ASSERT_TRUE(b) << why;
  std::printf("device %s (%s), READ depth %u\n", a->deviceName().c_str(), a->linkLayer().c_str(),
              a->address().readDepth);
  char* s = reinterpret_cast<char*>(src.data());
  char* d = reinterpret_cast<char*>(dst.data());
  a->registerPieces(d, {{0, kMem, d}}, false);
  auto keys = b->registerPieces(s, {{0, kMem / 2, s}, {kMem / 2, kMem / 2, s + kMem / 2}}, false);
  auto qa = a->createQps(1), qb = b->createQps(0);
  a->connectQps(1, b->address(), qb);
  b->connectQps(0, a->address(), qa);
  a->setRemoteChunks(1, keys);
  // Source: packed 64 KiB blocks; destination: padded, so local SGEs scatter.
  MemberLayouts t;
  t.numRegions = 1;
  t.views = {{0, 64 << 10, (64 << 10) + 512, 100}, {0, 64 << 10, 64 << 10, 128}};
  t.minBlocks = {100, 128};
  t.hashes = {1, 2};
  t.contiguous = {0, 1};
  t.minBlockBytes = t.blockBytesSum = 64 << 10;
  t.layouts.resize(2);
  NetContext ctx;
  ctx.local = d;
  ctx.table = &t;
  ctx.descs.resize(2);
  auto transport = makeVerbsTransport(ctx, a.get());
  PlanOutput p;
  p.runs = {{1, 0, 50, 20, 0, kvcomm::FetchPath::Host}, {1, 60, 10, 30, 0, kvcomm::FetchPath::Host}};
  transport->submit(p, {0, 1}, nullptr);
  for (const BlockRun& r : p.runs)
    for (int64_t k = 0; k < r.blocks; ++k)
      ASSERT_EQ(std::memcmp(d + (r.dst + k) * ((64 << 10) + 512), s + (r.src + k) * (64 << 10), 64 << 10), 0)
          << "block " << r.dst + k;
  FabricStats st = a->stats();
  EXPECT_EQ(st.completed, st.posted);
  EXPECT_LE(st.maxOutstanding, st.readDepth);
  // The source releases its first piece: a read of it fails (remote access error), drained, naming the blocks.
  b->unback({{0, kMem / 2}});
  PlanOutput stale;
  stale.runs = {{1, 0, 0, 4, 0, kvcomm::FetchPath::Host}};
  try {
    transport->submit(stale, {0}, nullptr);
    ADD_FAILURE() << "a read of a released piece succeeded";
  } catch (const kvcomm::Error& e) {
    std::printf("stale read: %s\n", e.what());
    EXPECT_NE(std::string(e.what()).find("source rank 1"), std::string::npos);
  }
  st = a->stats();
  EXPECT_EQ(st.completed, st.posted) << "completions left unreaped after the drain";
}

}  // namespace

int main(int argc, char** argv) {
  std::string why;
  if (listRdmaDevices(&why).empty()) {
    std::printf("not run (no RDMA device): %s\n", why.c_str());
    return 77;
  }
#if !KVCOMM_HAVE_VERBS
  std::printf("not run (built without rdma-core headers)\n");
  return 77;
#endif
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
