// The pure parts of cross-host fetch: the wire decoders and the server's re-validation (every malformed,
// oversize, out-of-range, stale or unbacked request named; checked arithmetic near 2^63), the segment order both ends
// share, version agreement and descriptor heads, the route choice per source, NIC choice by PCIe path, and a
// randomized run of the decoders (the fuzz target's invariants, in CI).
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "fetch/transport/negotiation.hpp"
#include "fetch/transport/net/segments.hpp"
#include "fetch/transport/net/wire.hpp"
#include "kvcomm/error.hpp"
#include "platform/ibverbs.hpp"
#include "support/fetch_wire_fuzz.hpp"

namespace {

using namespace kvcomm::detail;
using kvcomm::FetchRegionView;

struct View {
  std::vector<FetchRegionView> regions;
  std::vector<kvcomm::Range> backed;
  ServedView get() const {
    ServedView v;
    v.generation = 3;
    v.layoutHash = 0x55;
    v.regions = regions.data();
    v.numRegions = regions.size();
    v.minBlocks = 100;
    for (auto& r : regions) v.blockBytesSum += r.blockBytes;
    v.backed = backed.data();
    v.numBacked = backed.size();
    return v;
  }
};

View twoRegions() {
  View v;
  v.regions = {{0, 1024, 1024, 100}, {200000, 512, 640, 120}};
  v.backed = {{0, 102400}, {200000, 640 * 119 + 512}};
  return v;
}

WireStatus check(const View& v, std::vector<WireRun> runs, uint64_t* bytes = nullptr, std::string* why = nullptr,
                 uint64_t gen = 3, uint64_t hash = 0x55) {
  WireRequest q{kWireRequestMagic, static_cast<uint32_t>(runs.size()), 1, gen, hash};
  uint64_t b = 0;
  std::string w;
  WireStatus s = validateRequest(q, runs.data(), v.get(), &b, &w);
  if (bytes) *bytes = b;
  if (why) *why = w;
  return s;
}

TEST(FetchWire, DecodersRefuseWrongSizesMagicsAndRanges) {
  WireRequest q{kWireRequestMagic, 4, 9, 1, 2}, out{};
  EXPECT_EQ(decodeRequest(&q, sizeof(q), &out), "");
  EXPECT_EQ(out.numRuns, 4u);
  EXPECT_NE(decodeRequest(&q, sizeof(q) - 1, &out), "");
  q.numRuns = 0;
  EXPECT_NE(decodeRequest(&q, sizeof(q), &out).find("run count 0"), std::string::npos);
  q.numRuns = kMaxRunsPerRequest + 1;
  EXPECT_NE(decodeRequest(&q, sizeof(q), &out).find("outside [1, 4096]"), std::string::npos);
  q.numRuns = 1;
  q.magic = 0x1234;
  EXPECT_NE(decodeRequest(&q, sizeof(q), &out).find("bad magic"), std::string::npos);

  WireHello h{kWireHelloMagic, 1, 1, 3, 0, 1, 2}, ho{};
  EXPECT_EQ(decodeHello(&h, sizeof(h), &ho), "");
  h.minVersion = 2;  // min above newest
  EXPECT_NE(decodeHello(&h, sizeof(h), &ho), "");
  h.minVersion = 1;
  h.requesterRank = -1;
  EXPECT_NE(decodeHello(&h, sizeof(h), &ho), "");

  WireReply r{kWireReplyMagic, 0, 1, 100, 0, 0}, ro{};
  EXPECT_EQ(decodeReply(&r, sizeof(r), &ro), "");
  r.errorBytes = 3;  // Ok with error text
  EXPECT_NE(decodeReply(&r, sizeof(r), &ro), "");
  r = {kWireReplyMagic, 3, 1, 5, 0, 0};  // error with payload
  EXPECT_NE(decodeReply(&r, sizeof(r), &ro), "");
  r = {kWireReplyMagic, 3, 1, 0, kMaxWireErrorText + 1, 0};
  EXPECT_NE(decodeReply(&r, sizeof(r), &ro), "");
  r = {kWireReplyMagic, 0, 1, kMaxReplyBytes + 1, 0, 0};
  EXPECT_NE(decodeReply(&r, sizeof(r), &ro), "");
  r = {kWireReplyMagic, 99, 1, 0, 0, 0};
  EXPECT_NE(decodeReply(&r, sizeof(r), &ro), "");

  WireHelloReply hr = makeHelloReply(WireStatus::Busy, 1, 0, 7, std::string(500, 'x')), hro{};
  EXPECT_EQ(hr.reason[sizeof(hr.reason) - 1], '\0');  // truncated and terminated
  std::memset(hr.reason, 'y', sizeof(hr.reason));     // a peer that does not terminate its text
  EXPECT_EQ(decodeHelloReply(&hr, sizeof(hr), &hro), "");
  EXPECT_EQ(std::strlen(hro.reason), sizeof(hro.reason) - 1);
}

TEST(FetchWire, ValidationNamesEveryProblemWithCheckedArithmetic) {
  View v = twoRegions();
  uint64_t bytes = 0;
  std::string why;
  EXPECT_EQ(check(v, {{0, 1}, {10, 90}}, &bytes), WireStatus::Ok);
  EXPECT_EQ(bytes, 91u * 1536);
  EXPECT_EQ(check(v, {{0, 1}}, nullptr, &why, 4), WireStatus::Stale);
  EXPECT_NE(why.find("generation 4"), std::string::npos) << why;
  EXPECT_EQ(check(v, {{0, 1}}, nullptr, &why, 3, 0x56), WireStatus::LayoutMismatch);
  EXPECT_EQ(check(v, {{100, 1}}, nullptr, &why), WireStatus::OutOfRange);  // minBlocks is 100
  EXPECT_NE(why.find("run 0"), std::string::npos) << why;
  EXPECT_EQ(check(v, {{99, 2}}), WireStatus::OutOfRange);
  EXPECT_EQ(check(v, {{-1, 1}}), WireStatus::OutOfRange);
  EXPECT_EQ(check(v, {{0, 0}}), WireStatus::OutOfRange);
  EXPECT_EQ(check(v, {{0, -5}}), WireStatus::OutOfRange);
  EXPECT_EQ(check(v, {{1, INT64_MAX}}), WireStatus::OutOfRange);  // 1 + (2^63 - 1) must not wrap
  EXPECT_EQ(check(v, {{INT64_MAX, 1}}), WireStatus::OutOfRange);
  // Unbacked: block 50 of region 1 released.
  v.backed = {{0, 102400}, {200000, 640 * 50}, {200000 + 640 * 51, 640 * 68 + 512}};
  EXPECT_EQ(check(v, {{49, 1}}), WireStatus::Ok);
  EXPECT_EQ(check(v, {{49, 3}}, nullptr, &why), WireStatus::NotBacked);
  EXPECT_NE(why.find("region 1"), std::string::npos) << why;
  // A reply above the cap: many blocks of a wide layout.
  View wide;
  wide.regions = {{0, 1 << 20, 1 << 20, 1000}};
  wide.backed = {{0, 1000ull << 20}};
  ServedView w = wide.get();
  w.minBlocks = 1000;
  WireRequest q{kWireRequestMagic, 1, 1, 3, 0x55};
  WireRun big{0, 257};
  EXPECT_EQ(validateRequest(q, &big, w, &bytes, &why), WireStatus::Oversize);
  WireRun ok{0, 256};
  EXPECT_EQ(validateRequest(q, &ok, w, &bytes, &why), WireStatus::Ok);
  // Many runs whose sum is too large, each small.
  std::vector<WireRun> many(300, WireRun{0, 1});
  q.numRuns = 300;
  EXPECT_EQ(validateRequest(q, many.data(), w, &bytes, &why), WireStatus::Oversize);
}

TEST(FetchWire, RangeCoverage) {
  std::vector<kvcomm::Range> r = {{10, 10}, {30, 5}};
  EXPECT_TRUE(rangeCovered(r.data(), 2, 10, 10));
  EXPECT_TRUE(rangeCovered(r.data(), 2, 31, 4));
  EXPECT_FALSE(rangeCovered(r.data(), 2, 15, 16));
  EXPECT_FALSE(rangeCovered(r.data(), 2, 9, 2));
  EXPECT_FALSE(rangeCovered(r.data(), 2, 34, 2));
  EXPECT_FALSE(rangeCovered(r.data(), 0, 0, 1));
  EXPECT_TRUE(rangeCovered(r.data(), 2, 100, 0));
  EXPECT_FALSE(rangeCovered(r.data(), 2, 30, ~0ull));
}

TEST(FetchWire, BothEndsWalkTheSameBytesInWireOrder) {
  // Source: packed regions; destination: padded regions in another order of offsets. The byte streams must match.
  std::vector<FetchRegionView> src = {{0, 16, 16, 10}, {1000, 8, 8, 10}};
  std::vector<FetchRegionView> dst = {{500, 16, 32, 10}, {0, 8, 24, 10}};
  std::vector<WireRun> sr = {{2, 3}, {7, 1}}, dr = {{5, 3}, {0, 1}};
  std::vector<uint8_t> srcMem(2000), dstMem(2000, 0xee), wire;
  for (size_t i = 0; i < srcMem.size(); ++i) srcMem[i] = static_cast<uint8_t>(i * 7);
  SegmentCursor a(src.data(), 2, sr.data(), sr.size());
  uint64_t off = 0, len = 0;
  int segments = 0;
  while (a.take(5, &off, &len)) {  // small takes: splitting must not change the stream
    wire.insert(wire.end(), srcMem.begin() + static_cast<long>(off), srcMem.begin() + static_cast<long>(off + len));
    ++segments;
  }
  EXPECT_EQ(wire.size(), 4u * 24);
  SegmentCursor b(dst.data(), 2, dr.data(), dr.size());
  size_t at = 0;
  while (b.take(~0ull, &off, &len)) {
    std::memcpy(dstMem.data() + off, wire.data() + at, len);
    at += len;
  }
  EXPECT_EQ(at, wire.size());
  for (int64_t k = 0; k < 3; ++k) {
    EXPECT_EQ(std::memcmp(dstMem.data() + 500 + (5 + k) * 32, srcMem.data() + (2 + k) * 16, 16), 0);
    EXPECT_EQ(std::memcmp(dstMem.data() + (5 + k) * 24, srcMem.data() + 1000 + (2 + k) * 8, 8), 0);
  }
  EXPECT_EQ(std::memcmp(dstMem.data() + 500, srcMem.data() + 7 * 16, 16), 0);
  EXPECT_EQ(dstMem[500 + 16], 0xee);  // guard bytes between padded blocks untouched
  // Packed source runs are one segment per region (48, 24, 16 and 8 bytes), split in takes of at most 5 bytes.
  EXPECT_EQ(segments, 10 + 5 + 4 + 2);
}

TEST(FetchNegotiation, VersionsMeetOrNameTheOlderSide) {
  EXPECT_EQ(agreeVersion(3, 1, 2, 2), 2);
  EXPECT_EQ(agreeVersion(1, 1, 2, 2), 0);
  EXPECT_EQ(agreeVersion(2, 2, 1, 1), 0);
  EXPECT_EQ(agreeVersion(1, 1, 0, 0), 0);
  std::vector<DescriptorHead> heads(3, makeHead(kCapDirect | kCapTcp));
  EXPECT_EQ(checkHeads(heads, "test"), kFetchProtocolVersion);
  heads[2].version = heads[2].minVersion = 0;
  try {
    checkHeads(heads, "test");
    ADD_FAILURE() << "an older member was accepted";
  } catch (const kvcomm::Error& e) {
    EXPECT_EQ(e.code(), kvcomm::ErrorCode::Unsupported);
    EXPECT_NE(std::string(e.what()).find("rank 2"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("older"), std::string::npos) << e.what();
  }
  heads[2] = makeHead(0);
  heads[1].magic = 0;
  EXPECT_THROW(checkHeads(heads, "test"), kvcomm::InvalidArgumentError);
}

RemoteDescriptor desc(uint32_t caps, const char* link = "", bool tcp = true) {
  RemoteDescriptor d{};
  d.head = makeHead(caps);
  if (tcp) d.tcp = SockAddr::parse("10.0.0.1:5000");
  std::snprintf(d.rdmaLinkLayer, sizeof(d.rdmaLinkLayer), "%s", link);
  return d;
}

TEST(FetchNegotiation, RoutesFollowTheKnobAndNameWhyNot) {
  RouteInput in;
  in.me = 0;
  in.mapped = {1, 1, 0, 0, 0};
  const uint32_t all = kCapDirect | kCapTcp;
  in.descs = {desc(all | kCapRdma, "InfiniBand"), desc(all), desc(all | kCapRdma, "InfiniBand"),
              desc(all | kCapRdma, "Ethernet"), desc(kCapTcp)};
  std::vector<std::string> why;
  auto r = chooseRoutes(in, &why);
  EXPECT_EQ(r, (std::vector<Route>{Route::Peer, Route::Peer, Route::Rdma, Route::Tcp, Route::None}));
  EXPECT_NE(why[4].find("does not serve direct"), std::string::npos) << why[4];
  in.demand = kvcomm::detail::TransportDemand::Tcp;
  r = chooseRoutes(in, &why);
  EXPECT_EQ(r, (std::vector<Route>{Route::Peer, Route::Tcp, Route::Tcp, Route::Tcp, Route::None}));
  in.demand = kvcomm::detail::TransportDemand::Rdma;
  r = chooseRoutes(in, &why);
  EXPECT_EQ(r, (std::vector<Route>{Route::Peer, Route::None, Route::Rdma, Route::None, Route::None}));
  EXPECT_NE(why[1].find("KVCOMM_FETCH_TRANSPORT=rdma"), std::string::npos) << why[1];
  EXPECT_NE(why[3].find("Ethernet"), std::string::npos) << why[3];
  in.demand = kvcomm::detail::TransportDemand::Peer;
  r = chooseRoutes(in, &why);
  EXPECT_EQ(r, (std::vector<Route>{Route::Peer, Route::Peer, Route::None, Route::None, Route::None}));
  EXPECT_NE(why[2].find("not mapped"), std::string::npos) << why[2];
  // This rank without RDMA: auto goes to TCP, and says why not RDMA only where nothing reaches.
  in.demand = kvcomm::detail::TransportDemand::Auto;
  in.descs[0] = desc(all);
  r = chooseRoutes(in, &why);
  EXPECT_EQ(r[2], Route::Tcp);
}

TEST(FetchNegotiation, NicClosestToTheGpuByPciePath) {
  const std::string gpu = "/sys/devices/pci0000:17/0000:17:00.0/0000:18:00.0/0000:19:04.0/0000:1a:00.0";
  std::vector<std::string> nics = {"/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0",
                                   "/sys/devices/pci0000:17/0000:17:00.0/0000:18:00.0/0000:19:00.0/0000:1b:00.0",
                                   "/sys/devices/pci0000:17/0000:17:00.0/0000:18:00.0/0000:19:04.0/0000:1c:00.0", ""};
  EXPECT_EQ(closestByPciPath(gpu, nics), 2);
  EXPECT_EQ(closestByPciPath("", nics), 0);
  EXPECT_EQ(closestByPciPath(gpu, {}), -1);
  EXPECT_EQ(closestByPciPath("/sys/devices/pci0000:170", {"/sys/devices/pci0000:17/x", "/sys/devices/pci0000:170"}), 1);
}

TEST(FetchWire, RandomBytesThroughEveryDecoderKeepTheInvariants) {
  // The fuzz target's body (fetch/fuzz_request.hpp) over random and mutated inputs: it aborts on a broken invariant.
  std::mt19937_64 rng(12345);
  std::vector<uint8_t> buf;
  WireRequest q{kWireRequestMagic, 3, 1, 3, 0x55};
  std::vector<WireRun> runs = {{0, 2}, {50, 10}, {99, 1}};
  std::vector<uint8_t> valid(sizeof(q) + runs.size() * sizeof(WireRun));
  std::memcpy(valid.data(), &q, sizeof(q));
  std::memcpy(valid.data() + sizeof(q), runs.data(), runs.size() * sizeof(WireRun));
  size_t accepted = 0;
  for (int i = 0; i < 200000; ++i) {
    if (i % 2) {
      buf.resize(rng() % 200);
      for (auto& b : buf) b = static_cast<uint8_t>(rng());
    } else {
      buf = valid;
      for (int m = 0, n = 1 + static_cast<int>(rng() % 4); m < n; ++m)
        buf[rng() % buf.size()] = static_cast<uint8_t>(rng());
      if (rng() % 8 == 0) buf.resize(rng() % buf.size());
    }
    accepted += fuzzFetchRequest(buf.data(), buf.size()) == 1;
  }
  EXPECT_GT(accepted, 100u);  // mutations that stay valid are served, the rest refused
}

TEST(FetchWire, ControlRequestsCarryTheirBodyAndRdmaConnectMessagesRoundTripAndRefuseWhatIsMalformed) {
  const std::vector<uint8_t> body = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17};
  std::vector<WireRun> runs = encodeControl(kControlRdmaConnect, body.data(), body.size());
  ASSERT_EQ(runs.size(), 3u);  // head + 17 bytes padded to two runs
  WireControlHead head{};
  const uint8_t* at = nullptr;
  ASSERT_EQ(decodeControl(runs.data(), static_cast<uint32_t>(runs.size()), &head, &at), "");
  EXPECT_EQ(head.kind, kControlRdmaConnect);
  ASSERT_EQ(head.bytes, body.size());
  EXPECT_EQ(std::memcmp(at, body.data(), body.size()), 0);
  // A body that claims more than its runs hold, or leaves a whole run of padding, is refused.
  std::vector<WireRun> lying = runs;
  head.bytes = 40;
  std::memcpy(lying.data(), &head, sizeof(head));
  EXPECT_NE(decodeControl(lying.data(), 3, &head, &at), "");
  head.bytes = 8;
  std::memcpy(lying.data(), &head, sizeof(head));
  EXPECT_NE(decodeControl(lying.data(), 3, &head, &at), "");

  RdmaConnectReply r;
  r.fabric.valid = 1;
  r.fabric.maxMsg = 1u << 20;
  r.fabric.readDepth = 4;
  r.qps = {{0x40, 7}, {0x41, 9}};
  r.chunks = {{0, 4096, 0x1000, 5, 0}, {8192, 4096, 0x9000, 6, 0}};
  std::vector<uint8_t> m = encodeConnectReply(r);
  RdmaConnectReply back;
  ASSERT_EQ(decodeConnectReply(m.data(), m.size(), 1u << 20, &back), "");
  EXPECT_EQ(back.qps[1].psn, 9u);
  EXPECT_EQ(back.chunks[1].rkey, 6u);
  EXPECT_NE(decodeConnectReply(m.data(), m.size(), 8192, &back), "");          // a piece past the registration
  EXPECT_NE(decodeConnectReply(m.data(), m.size() - 1, 1u << 20, &back), "");  // truncated
  RdmaConnectReply overlap = r;
  overlap.chunks[1].offset = 2048;
  m = encodeConnectReply(overlap);
  EXPECT_NE(decodeConnectReply(m.data(), m.size(), 1u << 20, &back).find("overlaps"), std::string::npos);
  RdmaConnectRequest q;
  q.fabric = r.fabric;
  q.qps = r.qps;
  m = encodeConnectRequest(q);
  RdmaConnectRequest qb;
  ASSERT_EQ(decodeConnectRequest(m.data(), m.size(), &qb), "");
  q.qps.pop_back();
  m = encodeConnectRequest(q);
  EXPECT_NE(decodeConnectRequest(m.data(), m.size(), &qb).find("queue pairs"), std::string::npos);
  // Mutations of a valid reply through the fuzz target's invariants.
  std::mt19937_64 rng(77);
  const std::vector<uint8_t> valid = encodeConnectReply(r);
  for (int i = 0; i < 50000; ++i) {
    std::vector<uint8_t> buf = valid;
    for (int k = 0, n = 1 + static_cast<int>(rng() % 3); k < n; ++k)
      buf[rng() % buf.size()] = static_cast<uint8_t>(rng());
    if (rng() % 8 == 0) buf.resize(rng() % buf.size());
    fuzzRdmaConnect(buf.data(), buf.size());
  }
}

}  // namespace
