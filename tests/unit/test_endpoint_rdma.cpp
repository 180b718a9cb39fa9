// Endpoints over RDMA against the fake verbs provider (tests/support/fake_verbs.hpp), two endpoints in one process:
// the pairwise connection (a control request over the pair's TCP connection with the capability), READ and WRITE of
// block lists byte-exact with guard bytes over several layouts, and every failure path: a work request that fails
// (remote access, retry exceeded, flushed), completions that never come (timeout), a completion queue that overruns,
// a cancel, the owner unregistering or revoking while a transfer is on the wire, forged metadata, no device. Each
// fails the transfer naming the peer and the blocks not known to have landed, after a full drain: nothing in flight,
// no queue pair or memory region left behind once the endpoints close.
#include <gtest/gtest.h>

#if KVCOMM_HAVE_VERBS

#include <dirent.h>

#include <chrono>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "endpoint/metadata.hpp"
#include "fetch/transport/negotiation.hpp"
#include "kvcomm/endpoint.hpp"
#include "kvcomm/error.hpp"
#include "platform/ibverbs.hpp"
#include "support/fake_verbs.hpp"

namespace {

using namespace kvcomm;
namespace fake = kvtest::fakeverbs;
using Clock = std::chrono::steady_clock;

// Split K/V with padded blocks on one side and a packed layout on the other: local SGEs scatter, remote runs cut.
KvLayout splitKv(size_t blockBytes, size_t blocks, size_t gap) {
  KvLayout l;
  l.regions.push_back({64, blockBytes, 2 * blockBytes + gap, blocks});
  l.regions.push_back({64 + blockBytes, blockBytes, 2 * blockBytes + gap, blocks});
  return l;
}
KvLayout layered(size_t layers, size_t blockBytes, size_t blocks) {
  KvLayout l;
  size_t off = 16;
  for (size_t j = 0; j < layers; ++j) {
    l.regions.push_back({off, blockBytes, blockBytes, blocks});
    off += blockBytes * blocks + 48;
  }
  return l;
}
size_t extent(const KvLayout& l) {
  size_t e = 0;
  for (const KvRegion& g : l.regions) e = std::max(e, g.offset + (g.numBlocks - 1) * g.blockStride + g.blockBytes);
  return e + 64;
}
size_t at(const KvLayout& l, size_t r, int64_t b) {
  return l.regions[r].offset + static_cast<size_t>(b) * l.regions[r].blockStride;
}

int openFds() {
  int n = 0;
  if (DIR* d = opendir("/proc/self/fd")) {
    while (readdir(d)) ++n;
    closedir(d);
  }
  return n;
}

// Waits up to 5 s for `f` to hold.
template <typename F>
bool eventually(F&& f) {
  const auto end = Clock::now() + std::chrono::seconds(5);
  while (!f()) {
    if (Clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

struct Side {
  KvLayout layout;
  std::vector<uint8_t> mem;
  Side(const KvLayout& l, uint64_t seed) : layout(l), mem(extent(l)) {
    std::mt19937_64 rng(seed);
    for (auto& b : mem) b = static_cast<uint8_t>(rng());
  }
};

// Copies block `src` of `from` into block `dst` of `to` (the oracle: every region, nothing else).
void copyBlock(const Side& from, int64_t src, Side& to, int64_t dst) {
  for (size_t r = 0; r < from.layout.regions.size(); ++r)
    std::memcpy(&to.mem[at(to.layout, r, dst)], &from.mem[at(from.layout, r, src)], from.layout.regions[r].blockBytes);
}

class EndpointRdma : public ::testing::Test {
 protected:
  void SetUp() override {
    fake::reset(config());
    detail::fetchTestHooks().verbs = fake::api();
  }
  void TearDown() override {
    detail::fetchTestHooks().verbs = nullptr;
    fake::setStall(false);
    fake::Counts c = fake::counts();
    EXPECT_TRUE(c.zero()) << "contexts " << c.contexts << ", pds " << c.pds << ", mrs " << c.mrs << ", cqs " << c.cqs
                          << ", qps " << c.qps;
    fake::Violations v = fake::violations();
    EXPECT_EQ(v.overDepth + v.unreapedAtDestroy + v.cqNotEmpty + v.badPost, 0) << v.first;
  }
  virtual fake::Config config() { return {}; }

 public:
  static EndpointOptions options(const char* name, int64_t timeoutMs = 5000) {
    EndpointOptions o;
    o.name = name;
    o.tcpAddress = "127.0.0.1:0";
    o.timeoutMs = timeoutMs;
    return o;
  }
  static TransferOptions viaRdma() {
    TransferOptions t;
    t.via = TransferVia::Rdma;
    return t;
  }
};

// Pull and push random pairs (with -1 skips) between two layouts of one block size, byte-exact against the oracle,
// guard bytes included, over the RDMA transport.
void pullAndPush(const KvLayout& serverLayout, const KvLayout& clientLayout, uint64_t seed) {
  Side server(serverLayout, seed), client(clientLayout, seed + 1);
  Endpoint se = Endpoint::create(EndpointRdma::options("server")),
           ce = Endpoint::create(EndpointRdma::options("client"));
  Registration sr = se.registerMemory(server.mem.data(), server.mem.size(), MemoryKind::Host, serverLayout);
  Registration cr = ce.registerMemory(client.mem.data(), client.mem.size(), MemoryKind::Host, clientLayout);
  RemoteMemory remote = ce.connect(sr.metadata());
  const int64_t sb = static_cast<int64_t>(serverLayout.regions[0].numBlocks);
  const int64_t cb = static_cast<int64_t>(clientLayout.regions[0].numBlocks);
  std::mt19937_64 rng(seed);
  for (int round = 0; round < 3; ++round) {
    for (bool push : {false, true}) {
      // Distinct destinations; runs of consecutive ids so that some coalesce into one work request.
      const int64_t dstBlocks = push ? sb : cb, srcBlocks = push ? cb : sb;
      std::vector<int64_t> dst(static_cast<size_t>(dstBlocks));
      for (int64_t i = 0; i < dstBlocks; ++i) dst[static_cast<size_t>(i)] = i;
      std::shuffle(dst.begin(), dst.end(), rng);
      const size_t n = static_cast<size_t>(std::min(dstBlocks, srcBlocks) / 2);
      std::vector<int64_t> remoteIds(n), localIds(n);
      int64_t s = static_cast<int64_t>(rng() % static_cast<uint64_t>(srcBlocks));
      for (size_t i = 0; i < n; ++i) {
        const int64_t src = (i % 5 == 0) ? static_cast<int64_t>(rng() % static_cast<uint64_t>(srcBlocks)) : s;
        s = (src + 1) % srcBlocks;
        const int64_t d = i % 9 == 4 ? -1 : dst[i];
        (push ? localIds : remoteIds)[i] = src;
        (push ? remoteIds : localIds)[i] = d;
      }
      Side& to = push ? server : client;
      Side want = to;
      for (size_t i = 0; i < n; ++i) {
        if (remoteIds[i] < 0 || localIds[i] < 0) continue;
        if (push)
          copyBlock(client, localIds[i], want, remoteIds[i]);
        else
          copyBlock(server, remoteIds[i], want, localIds[i]);
      }
      Transfer t = push ? ce.write(cr, remote, remoteIds.data(), localIds.data(), n, EndpointRdma::viaRdma())
                        : ce.read(cr, remote, remoteIds.data(), localIds.data(), n, EndpointRdma::viaRdma());
      EXPECT_EQ(t.transport(), FetchTransportKind::Rdma);
      EXPECT_GT(t.info().rdmaRuns, 0u);
      FetchStatus st = t.wait(20000);
      ASSERT_EQ(st.state, FetchState::Done) << st.error;
      EXPECT_EQ(st.bytesDone, st.bytesTotal);
      ASSERT_TRUE(to.mem == want.mem) << (push ? "push" : "pull") << " round " << round << ": bytes differ";
    }
  }
  ce.unregister(cr);
  se.unregister(sr);
}

TEST_F(EndpointRdma, PullAndPushByteExactOverSplitKvLayersAndLargeBlocks) {
  const uint64_t seed = std::random_device{}();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  pullAndPush(splitKv(4096, 96, 0), splitKv(4096, 80, 256), seed);           // padded destination: SGEs scatter
  pullAndPush(layered(64, 16, 48), layered(64, 16, 40), seed + 10);          // 64 layers of 16 B blocks
  pullAndPush(layered(1, 2u << 20, 6), layered(1, 2u << 20, 5), seed + 20);  // 2 MiB blocks: cut at message size
}

TEST_F(EndpointRdma, MetadataOffersRdmaAndAutoBetweenEndpointsOfOneHostStaysOffIt) {
  std::vector<uint8_t> a(extent(splitKv(1024, 16, 0)), 1), b(a.size(), 2);
  Endpoint se = Endpoint::create(options("server")), ce = Endpoint::create(options("client"));
  Registration sr = se.registerMemory(a.data(), a.size(), MemoryKind::Host, splitKv(1024, 16, 0));
  Registration cr = ce.registerMemory(b.data(), b.size(), MemoryKind::Host, splitKv(1024, 16, 0));
  const std::vector<uint8_t> m = sr.metadata();
  detail::EndpointMetadata meta;
  ASSERT_EQ(detail::decodeMetadata(m.data(), m.size(), &meta), "");
  EXPECT_EQ(meta.transports & detail::kMetaRdma, detail::kMetaRdma);
  RemoteMemory r = ce.connect(m);
  std::vector<int64_t> ids{0, 1, 2};
  Transfer t = ce.read(cr, r, ids.data(), ids.data(), ids.size());  // one host: Auto picks the peer path or TCP
  EXPECT_NE(t.transport(), FetchTransportKind::Rdma);
  EXPECT_EQ(t.wait(20000).state, FetchState::Done);
  EXPECT_EQ(fake::counts().qps, 0);  // nothing connected over verbs
}

struct Fault {
  const char* name;
  fake::Config config;
  int64_t timeoutMs;
  const char* needle;
};

fake::Config failing(uint64_t nth, ibv_wc_status status) {
  fake::Config c;
  c.failNth = nth;
  c.failStatus = status;
  return c;
}
fake::Config stalled() {
  fake::Config c;
  c.stall = true;
  return c;
}
fake::Config smallCq() {
  fake::Config c;
  c.cqCapacity = 3;
  c.progressPerPoll = 4;
  return c;
}

class EndpointRdmaFaults : public EndpointRdma, public ::testing::WithParamInterface<Fault> {
  fake::Config config() override { return GetParam().config; }
};

// A failure on the wire fails the transfer naming the peer, the cause and the blocks not known to have landed; the
// blocks said to have landed hold the right bytes; nothing stays in flight; the next transfer connects afresh.
TEST_P(EndpointRdmaFaults, FailTheTransferNamingPeerCauseAndBlocksThenReconnect) {
  const Fault& f = GetParam();
  const KvLayout l = splitKv(4096, 64, 0);
  Side server(l, 7), client(l, 8);
  const Side before = client;
  Endpoint se = Endpoint::create(options("server", f.timeoutMs));
  Endpoint ce = Endpoint::create(options("client", f.timeoutMs));
  Registration sr = se.registerMemory(server.mem.data(), server.mem.size(), MemoryKind::Host, l);
  Registration cr = ce.registerMemory(client.mem.data(), client.mem.size(), MemoryKind::Host, l);
  RemoteMemory r = ce.connect(sr.metadata());
  std::vector<int64_t> src, dst;  // 32 separate blocks: 32 work requests
  for (int64_t i = 0; i < 32; ++i) {
    src.push_back(2 * i);
    dst.push_back(63 - 2 * i);
  }
  FetchStatus st = ce.read(cr, r, src.data(), dst.data(), src.size(), viaRdma()).wait(20000);
  ASSERT_EQ(st.state, FetchState::Failed);
  EXPECT_NE(st.error.find("endpoint 'server'"), std::string::npos) << st.error;
  EXPECT_NE(st.error.find(f.needle), std::string::npos) << st.error;
  ASSERT_FALSE(st.failedBlocks.empty());
  EXPECT_EQ(fake::inFlight(), 0);
  for (size_t i = 0; i < src.size(); ++i) {
    const bool failed = std::find(st.failedBlocks.begin(), st.failedBlocks.end(), dst[i]) != st.failedBlocks.end();
    for (size_t g = 0; g < l.regions.size(); ++g) {
      const uint8_t* got = &client.mem[at(l, g, dst[i])];
      const uint8_t* want = failed ? got : &server.mem[at(l, g, src[i])];
      EXPECT_EQ(std::memcmp(got, want, l.regions[g].blockBytes), 0) << "block " << dst[i] << " said landed";
    }
  }
  // Blocks outside the transfer are untouched.
  for (int64_t b = 0; b < 64; ++b) {
    if (std::find(dst.begin(), dst.end(), b) != dst.end()) continue;
    for (size_t g = 0; g < l.regions.size(); ++g)
      EXPECT_EQ(std::memcmp(&client.mem[at(l, g, b)], &before.mem[at(l, g, b)], l.regions[g].blockBytes), 0);
  }
  // Injections off: the broken queue pairs are replaced by a new connection.
  fake::reset({});
  st = ce.read(cr, r, src.data(), dst.data(), src.size(), viaRdma()).wait(20000);
  ASSERT_EQ(st.state, FetchState::Done) << st.error;
  for (size_t i = 0; i < src.size(); ++i)
    EXPECT_EQ(std::memcmp(&client.mem[at(l, 0, dst[i])], &server.mem[at(l, 0, src[i])], 4096), 0);
}

INSTANTIATE_TEST_SUITE_P(
    Faults, EndpointRdmaFaults,
    ::testing::Values(Fault{"remote_access_error", failing(9, IBV_WC_REM_ACCESS_ERR), 5000, "remote access error"},
                      Fault{"retry_exceeded", failing(5, IBV_WC_RETRY_EXC_ERR), 5000, "retry counter exceeded"},
                      Fault{"flushed", failing(12, IBV_WC_WR_FLUSH_ERR), 5000, "Flushed"},
                      Fault{"no_completion", stalled(), 300, "no RDMA completion from endpoint 'server'"},
                      Fault{"cq_overrun", smallCq(), 5000, "completion queue failed"}),
    [](const ::testing::TestParamInfo<Fault>& i) { return std::string(i.param.name); });

// The owner unregisters while a write is on the wire: its queue pairs and memory regions go first, so the work
// requests still queued fail (naming the blocks) and not one byte lands after unregister returned.
TEST_F(EndpointRdma, OwnerUnregisteringMidWriteFailsItAndNothingLandsAfterwards) {
  const KvLayout l = splitKv(4096, 64, 0);
  Side server(l, 3), client(l, 4);
  Endpoint se = Endpoint::create(options("server")), ce = Endpoint::create(options("client"));
  Registration sr = se.registerMemory(server.mem.data(), server.mem.size(), MemoryKind::Host, l);
  Registration cr = ce.registerMemory(client.mem.data(), client.mem.size(), MemoryKind::Host, l);
  RemoteMemory r = ce.connect(sr.metadata());
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < 64; i += 2) ids.push_back(i);
  ASSERT_EQ(ce.read(cr, r, ids.data(), ids.data(), ids.size(), viaRdma()).wait(20000).state, FetchState::Done);
  fake::setStall(true);
  Transfer t = ce.write(cr, r, ids.data(), ids.data(), ids.size(), viaRdma());
  ASSERT_TRUE(eventually([] { return fake::inFlight() > 0; }));
  se.unregister(sr);
  const std::vector<uint8_t> after = server.mem;
  fake::setStall(false);
  FetchStatus st = t.wait(20000);
  ASSERT_EQ(st.state, FetchState::Failed);
  EXPECT_NE(st.error.find("RDMA WRITE to endpoint 'server'"), std::string::npos) << st.error;
  EXPECT_FALSE(st.failedBlocks.empty());
  EXPECT_EQ(fake::inFlight(), 0);
  EXPECT_TRUE(server.mem == after) << "bytes landed after unregister returned";
  // The owner is gone for good: the next transfer is refused at the hello, naming why.
  st = ce.read(cr, r, ids.data(), ids.data(), ids.size(), viaRdma()).wait(20000);
  ASSERT_EQ(st.state, FetchState::Failed);
  EXPECT_NE(st.error.find("unregistered"), std::string::npos) << st.error;
}

// A transfer whose handle is destroyed while its work requests are stuck is cancelled: drained (queue pairs to ERR,
// every completion reaped) before the destructor returns.
TEST_F(EndpointRdma, ACancelledTransferDrainsBeforeItsHandleIsGone) {
  const KvLayout l = splitKv(1024, 32, 0);
  Side server(l, 5), client(l, 6);
  Endpoint se = Endpoint::create(options("server")), ce = Endpoint::create(options("client"));
  Registration sr = se.registerMemory(server.mem.data(), server.mem.size(), MemoryKind::Host, l);
  Registration cr = ce.registerMemory(client.mem.data(), client.mem.size(), MemoryKind::Host, l);
  RemoteMemory r = ce.connect(sr.metadata());
  std::vector<int64_t> ids{0, 2, 4, 6, 8, 10};
  fake::setStall(true);
  {
    Transfer t = ce.read(cr, r, ids.data(), ids.data(), ids.size(), viaRdma());
    ASSERT_TRUE(eventually([] { return fake::inFlight() > 0; }));
    EXPECT_EQ(t.test().state, FetchState::InProgress);
  }
  EXPECT_EQ(fake::inFlight(), 0);
  fake::setStall(false);
  EXPECT_EQ(ce.read(cr, r, ids.data(), ids.data(), ids.size(), viaRdma()).wait(20000).state, FetchState::Done);
  // The client's own registration unregistered mid-transfer: cancelled, drained, named.
  fake::setStall(true);
  Transfer t = ce.read(cr, r, ids.data(), ids.data(), ids.size(), viaRdma());
  ASSERT_TRUE(eventually([] { return fake::inFlight() > 0; }));
  ce.unregister(cr, 0);
  EXPECT_EQ(fake::inFlight(), 0);
  FetchStatus st = t.test();
  EXPECT_EQ(st.state, FetchState::Failed);
  EXPECT_NE(st.error.find("unregistered"), std::string::npos) << st.error;
}

// Revoke: the old keys stop working at once (the next work request fails) and the old metadata cannot connect again;
// the new metadata can. A forged capability is refused at the hello, before a queue pair exists on either side.
TEST_F(EndpointRdma, RevokeAndForgedCapabilitiesAreRefusedBeforeAnyQueuePairExists) {
  const KvLayout l = splitKv(1024, 32, 0);
  Side server(l, 11), client(l, 12);
  Endpoint se = Endpoint::create(options("server")), ce = Endpoint::create(options("client"));
  Registration sr = se.registerMemory(server.mem.data(), server.mem.size(), MemoryKind::Host, l);
  Registration cr = ce.registerMemory(client.mem.data(), client.mem.size(), MemoryKind::Host, l);
  std::vector<uint8_t> m = sr.metadata();
  std::vector<uint8_t> forged = m;
  forged[16 + 24] ^= 0x01;  // first byte of the capability (body offset 24)
  uint32_t h = 2166136261u;
  for (size_t i = 16; i < forged.size(); ++i) h = (h ^ forged[i]) * 16777619u;
  std::memcpy(&forged[12], &h, 4);
  std::vector<int64_t> ids{1, 3, 5};
  const Side before = server;
  FetchStatus st = ce.write(cr, ce.connect(forged), ids.data(), ids.data(), ids.size(), viaRdma()).wait(20000);
  ASSERT_EQ(st.state, FetchState::Failed);
  EXPECT_NE(st.error.find("capability refused"), std::string::npos) << st.error;
  EXPECT_EQ(fake::counts().qps, 0);
  EXPECT_TRUE(server.mem == before.mem);

  RemoteMemory ok = ce.connect(m);
  ASSERT_EQ(ce.read(cr, ok, ids.data(), ids.data(), ids.size(), viaRdma()).wait(20000).state, FetchState::Done);
  sr.revoke();
  st = ce.read(cr, ok, ids.data(), ids.data(), ids.size(), viaRdma()).wait(20000);
  ASSERT_EQ(st.state, FetchState::Failed);  // its queue pairs and keys are gone
  EXPECT_NE(st.error.find("endpoint 'server'"), std::string::npos) << st.error;
  st = ce.read(cr, ok, ids.data(), ids.data(), ids.size(), viaRdma()).wait(20000);
  ASSERT_EQ(st.state, FetchState::Failed);  // reconnecting with the old metadata
  EXPECT_NE(st.error.find("capability refused"), std::string::npos) << st.error;
  EXPECT_EQ(ce.read(cr, ce.connect(sr.metadata()), ids.data(), ids.data(), ids.size(), viaRdma()).wait(20000).state,
            FetchState::Done);
}

// A read-only registration's memory regions refuse WRITEs even from a requester that skips the API's check.
TEST_F(EndpointRdma, ReadOnlyRegistrationsAreRefusedWritesBeforeAnythingMoves) {
  const KvLayout l = splitKv(1024, 16, 0);
  Side server(l, 13), client(l, 14);
  Endpoint se = Endpoint::create(options("server")), ce = Endpoint::create(options("client"));
  RegisterOptions ro;
  ro.access = Access::ReadOnly;
  Registration sr = se.registerMemory(server.mem.data(), server.mem.size(), MemoryKind::Host, l, -1, ro);
  Registration cr = ce.registerMemory(client.mem.data(), client.mem.size(), MemoryKind::Host, l);
  RemoteMemory r = ce.connect(sr.metadata());
  std::vector<int64_t> ids{0, 1};
  EXPECT_THROW(ce.write(cr, r, ids.data(), ids.data(), 2, viaRdma()), InvalidArgumentError);
  EXPECT_EQ(ce.read(cr, r, ids.data(), ids.data(), 2, viaRdma()).wait(20000).state, FetchState::Done);
}

// A long-lived client: connect, transfer over RDMA, disconnect, 200 times: queue pairs (ours and the owner's, which
// go when the pair's connection closes), descriptors and memory regions stay flat.
TEST_F(EndpointRdma, TwoHundredConnectTransferDisconnectCyclesLeaveNoQueuePairOrDescriptorBehind) {
  const KvLayout l = splitKv(1024, 16, 0);
  Side server(l, 15), client(l, 16);
  Endpoint se = Endpoint::create(options("server")), ce = Endpoint::create(options("client"));
  Registration sr = se.registerMemory(server.mem.data(), server.mem.size(), MemoryKind::Host, l);
  Registration cr = ce.registerMemory(client.mem.data(), client.mem.size(), MemoryKind::Host, l);
  const std::vector<uint8_t> m = sr.metadata();
  std::vector<int64_t> ids{0, 5, 9};
  int fds = -1, mrs = -1;
  for (int i = 0; i < 200; ++i) {
    RemoteMemory r = ce.connect(m);
    FetchStatus st = (i % 2 ? ce.write(cr, r, ids.data(), ids.data(), 3, viaRdma())
                            : ce.read(cr, r, ids.data(), ids.data(), 3, viaRdma()))
                         .wait(20000);
    ASSERT_EQ(st.state, FetchState::Done) << "cycle " << i << ": " << st.error;
    ce.disconnect(r);
    ASSERT_TRUE(eventually([] { return fake::counts().qps == 0; })) << "cycle " << i << ": " << fake::counts().qps;
    if (i == 20) {
      fds = openFds();
      mrs = fake::counts().mrs;
    }
  }
  EXPECT_TRUE(eventually([&] { return openFds() <= fds; })) << openFds() << " descriptors, " << fds << " at cycle 20";
  EXPECT_EQ(fake::counts().mrs, mrs);
}

// Without a device: demanding RDMA is Unsupported naming why; Auto takes TCP; the metadata offers no RDMA.
TEST(EndpointRdmaAbsent, DemandingRdmaWithoutADeviceIsUnsupportedNamingWhy) {
  std::string why;
  if (!detail::listRdmaDevices(&why).empty()) GTEST_SKIP() << "this machine has an RDMA device";
  const KvLayout l = splitKv(1024, 8, 0);
  Side server(l, 1), client(l, 2);
  Endpoint se = Endpoint::create(EndpointRdma::options("server")),
           ce = Endpoint::create(EndpointRdma::options("client"));
  Registration sr = se.registerMemory(server.mem.data(), server.mem.size(), MemoryKind::Host, l);
  Registration cr = ce.registerMemory(client.mem.data(), client.mem.size(), MemoryKind::Host, l);
  RemoteMemory r = ce.connect(sr.metadata());
  std::vector<int64_t> ids{0, 1};
  try {
    ce.read(cr, r, ids.data(), ids.data(), 2, EndpointRdma::viaRdma());
    ADD_FAILURE() << "a demanded RDMA read ran without a device";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no RDMA device"), std::string::npos) << e.what();
  }
  TransferOptions tcp;
  tcp.via = TransferVia::Tcp;
  EXPECT_EQ(ce.read(cr, r, ids.data(), ids.data(), 2, tcp).wait(20000).state, FetchState::Done);
}

}  // namespace

#else

TEST(EndpointRdma, NotBuilt) {
  GTEST_SKIP() << "built without rdma-core headers (libibverbs-dev): the verbs transport is not part of this build";
}

#endif
