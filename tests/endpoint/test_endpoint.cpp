// Endpoints between real processes (fork, no MPI, no communicator): a server and clients that meet through metadata
// alone. Every byte of both sides is checked against an oracle of where each block's content came from (guard bytes
// between and around blocks, untouched blocks, -1 skips); refusals, faults and churn leave nothing behind.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#ifdef KVCOMM_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#include "arena/harness.hpp"
#include "kvcomm/bootstrap.hpp"
#include "kvcomm/comm.hpp"
#include "kvcomm/endpoint.hpp"
#include "kvcomm/error.hpp"
#include "support/sanitizers.hpp"

namespace {

using namespace kvcomm;
using kvtest::arena::Gate;
using kvtest::arena::readFile;
using kvtest::arena::reap;
using kvtest::arena::runAll;
using kvtest::arena::spawn;
using kvtest::arena::tempPath;
using kvtest::arena::writeFile;

// ---- the oracle ---------------------------------------------------------------------------------------------------

uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Memory as an oracle sees it: guard bytes everywhere, and block (region, block) holding the content of `tag`.
struct Image {
  KvLayout layout;
  std::vector<uint8_t> bytes;
  Image(const KvLayout& l, size_t n, uint64_t guardSeed) : layout(l), bytes(n) {
    for (size_t i = 0; i < n; ++i) bytes[i] = static_cast<uint8_t>(mix(guardSeed * 1315423911u + i / 8) >> (i % 8 * 8));
  }
  size_t at(size_t r, int64_t b) const {
    const KvRegion& g = layout.regions[r];
    return g.offset + static_cast<size_t>(b) * (g.blockStride ? g.blockStride : g.blockBytes);
  }
  // Content of `tag` in region r (what moves with a block).
  void put(size_t r, int64_t b, uint64_t tag) {
    const size_t n = layout.regions[r].blockBytes, o = at(r, b);
    for (size_t i = 0; i < n; ++i)
      bytes[o + i] = static_cast<uint8_t>(mix(tag * 0x100000001b3ull + r * 7919 + i / 8) >> (i % 8 * 8));
  }
  void copyBlock(const Image& from, int64_t src, int64_t dst) {
    for (size_t r = 0; r < layout.regions.size(); ++r)
      std::memcpy(&bytes[at(r, dst)], &from.bytes[from.at(r, src)], layout.regions[r].blockBytes);
  }
};

std::string firstDifference(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want) {
  if (got.size() != want.size()) return "sizes differ";
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != want[i]) {
      size_t bad = 0;
      for (size_t j = i; j < got.size(); ++j) bad += got[j] != want[j];
      return "byte " + std::to_string(i) + " differs (" + std::to_string(bad) + " bytes in all)";
    }
  return "";
}

size_t extent(const KvLayout& l) {
  size_t e = 0;
  for (const KvRegion& g : l.regions)
    e = std::max(e, g.offset + (g.numBlocks - 1) * (g.blockStride ? g.blockStride : g.blockBytes) + g.blockBytes);
  return e + 64;  // guard bytes after the last block
}

// ---- layouts ------------------------------------------------------------------------------------------------------

struct Shape {
  const char* name;
  KvLayout layout;
};

// Split K/V: two regions interleaved per block (K at 0, V at blockBytes, stride 2 blocks + a gap).
KvLayout splitKv(size_t blockBytes, size_t blocks) {
  KvLayout l;
  l.regions.push_back({32, blockBytes, 2 * blockBytes + 32, blocks});
  l.regions.push_back({32 + blockBytes, blockBytes, 2 * blockBytes + 32, blocks});
  return l;
}
// `layers` regions one after another, blocks packed, a gap between regions.
KvLayout layered(size_t layers, size_t blockBytes, size_t blocks) {
  KvLayout l;
  size_t off = 16;
  for (size_t j = 0; j < layers; ++j) {
    l.regions.push_back({off, blockBytes, blockBytes, blocks});
    off += blockBytes * blocks + 48;
  }
  return l;
}

std::vector<Shape> shapes() {
  return {{"split_kv_4k", splitKv(4096, 64)},
          {"layers64_16B", layered(64, 16, 64)},
          {"layers1_2MiB", layered(1, 2u << 20, 12)},
          {"layers3_gaps", kvtest::arena::testLayout(48)}};
}

// ---- processes ----------------------------------------------------------------------------------------------------

EndpointOptions local(const char* name) {
  EndpointOptions o;
  o.name = name;
  o.tcpAddress = "127.0.0.1:0";
  return o;
}

uint64_t testSeed() {
  static const uint64_t seed = [] {
    uint64_t s = std::random_device{}();
    std::printf("endpoint tests: seed %llu\n", static_cast<unsigned long long>(s));
    return s;
  }();
  return seed;
}

int openFds() {
  return kvtest::arena::fds();
}
long rssKiB() {
  std::ifstream f("/proc/self/statm");
  long pages = 0, resident = 0;
  f >> pages >> resident;
  return resident * (sysconf(_SC_PAGESIZE) / 1024);
}
int threads() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("Threads:", 0) == 0) return std::stoi(line.substr(8));
  return -1;
}

// ---- a server and 8 clients, pull and push, several layouts --------------------------------------------------------

class EndpointShapes : public ::testing::TestWithParam<size_t> {};

TEST_P(EndpointShapes, AServerAndEightClientsPullAndPushByteExact) {
  const Shape shape = shapes()[GetParam()];
  const KvLayout& layout = shape.layout;
  const size_t bytes = extent(layout);
  const int64_t blocks = static_cast<int64_t>(layout.regions[0].numBlocks);
  const int clients = 8;
  const uint64_t seed = testSeed() ^ GetParam();
  const std::string metaPath = tempPath("meta");
  Gate ready, done;
  // Clients read from the lower half of the server's blocks and write into the upper half: client c owns remote
  // blocks [half + c * per, half + (c + 1) * per).
  const int64_t half = blocks / 2, per = std::max<int64_t>(1, half / clients);
  auto serverImage = [&] {
    Image im(layout, bytes, seed + 1);
    for (size_t r = 0; r < layout.regions.size(); ++r)
      for (int64_t b = 0; b < blocks; ++b) im.put(r, b, seed * 31 + static_cast<uint64_t>(b));
    return im;
  };
  auto clientImage = [&](int c) {
    Image im(layout, bytes, seed + 100 + static_cast<uint64_t>(c));
    for (size_t r = 0; r < layout.regions.size(); ++r)
      for (int64_t b = 0; b < per; ++b) im.put(r, b, seed * 131 + static_cast<uint64_t>(c) * 1000 + b);  // to push
    return im;
  };
  // Client c's pull: remote blocks in the lower half into local blocks from `per` up, shuffled, every 5th pair -1.
  auto pulls = [&](int c, std::vector<int64_t>& remote, std::vector<int64_t>& mine) {
    std::mt19937_64 rng(seed + static_cast<uint64_t>(c));
    for (int64_t b = per; b < blocks; ++b) mine.push_back(b);
    std::shuffle(mine.begin(), mine.end(), rng);
    mine.resize(static_cast<size_t>(std::min<int64_t>(half, static_cast<int64_t>(mine.size()))));
    for (size_t i = 0; i < mine.size(); ++i)
      remote.push_back(static_cast<int64_t>(rng() % static_cast<uint64_t>(half)));
    for (size_t i = 0; i < mine.size(); i += 5) (i % 10 ? remote[i] : mine[i]) = -1;
  };

  pid_t server = spawn([&] {
    Endpoint ep = Endpoint::create(local("server"));
    Image im = serverImage();
    Registration reg = ep.registerMemory(im.bytes.data(), im.bytes.size(), MemoryKind::Host, layout);
    writeFile(metaPath, reg.metadata());
    for (int c = 0; c < clients; ++c) ready.pass();
    for (int c = 0; c < clients; ++c)
      if (!done.wait(120000)) return false;
    // Expected: the server's own blocks, and each client's pushed blocks in its range of the upper half.
    Image want = serverImage();
    for (int c = 0; c < clients; ++c) {
      Image from = clientImage(c);
      for (int64_t b = 0; b < per && half + c * per + b < blocks; ++b) want.copyBlock(from, b, half + c * per + b);
    }
    std::string diff = firstDifference(im.bytes, want.bytes);
    if (!diff.empty()) std::fprintf(stderr, "server memory after the pushes: %s\n", diff.c_str());
    return diff.empty();
  });
  std::vector<std::function<bool()>> bodies;
  for (int c = 0; c < clients; ++c)
    bodies.push_back([&, c] {
      if (!ready.wait(60000)) return false;
      Endpoint ep = Endpoint::create(local("client"));
      RemoteMemory remote = ep.connect(readFile(metaPath));
      Image im = clientImage(c);
      Registration reg = ep.registerMemory(im.bytes.data(), im.bytes.size(), MemoryKind::Host, layout);
      std::vector<int64_t> src, dst;
      pulls(c, src, dst);
      Transfer t = ep.read(reg, remote, src.data(), dst.data(), src.size());
      FetchStatus s = t.wait(60000);
      bool ok = s.state == FetchState::Done && s.bytesDone == s.bytesTotal && t.info().tcpRuns > 0;
      if (!ok) std::fprintf(stderr, "client %d read: %s\n", c, s.error.c_str());
      Image want = clientImage(c);
      Image srv = serverImage();
      for (size_t i = 0; i < src.size(); ++i)
        if (src[i] >= 0 && dst[i] >= 0) want.copyBlock(srv, src[i], dst[i]);
      std::string diff = firstDifference(im.bytes, want.bytes);
      if (!diff.empty()) std::fprintf(stderr, "client %d after its read: %s\n", c, diff.c_str());
      ok = ok && diff.empty();
      // Push local blocks [0, per) into its range of the upper half.
      std::vector<int64_t> from, to;
      for (int64_t b = 0; b < per && half + c * per + b < blocks; ++b) {
        from.push_back(b);
        to.push_back(half + c * per + b);
      }
      Transfer w = ep.write(reg, remote, to.data(), from.data(), to.size());
      FetchStatus ws = w.wait(60000);
      if (ws.state != FetchState::Done) std::fprintf(stderr, "client %d write: %s\n", c, ws.error.c_str());
      ok = ok && ws.state == FetchState::Done;
      done.pass();
      return ok;
    });
  EXPECT_TRUE(runAll(bodies, 180));
  EXPECT_EQ(reap(server, 180), 0);
  std::remove(metaPath.c_str());
}

INSTANTIATE_TEST_SUITE_P(Layouts, EndpointShapes, ::testing::Range<size_t>(0, 4),
                         [](const ::testing::TestParamInfo<size_t>& i) { return shapes()[i.param].name; });

// ---- one process: refusals and lifetimes (server and client endpoints side by side) ---------------------------------

struct Pair {
  KvLayout layout = splitKv(1024, 32);
  size_t bytes = extent(layout);
  std::vector<uint8_t> serverMem = std::vector<uint8_t>(bytes, 0x5a), clientMem = std::vector<uint8_t>(bytes, 0xc3);
  Endpoint server = Endpoint::create(local("server"));
  Endpoint client = Endpoint::create(local("client"));
  Registration served = server.registerMemory(serverMem.data(), bytes, MemoryKind::Host, layout);
  Registration mine = client.registerMemory(clientMem.data(), bytes, MemoryKind::Host, layout);
  std::vector<int64_t> ids{0, 1, 2, 3};

  FetchStatus pull(const RemoteMemory& r) {
    return client.read(mine, r, ids.data(), ids.data(), ids.size()).wait(20000);
  }
};

void expectFailure(const FetchStatus& s, const std::string& needle) {
  EXPECT_EQ(s.state, FetchState::Failed);
  EXPECT_NE(s.error.find(needle), std::string::npos) << s.error;
}

template <typename F>
std::string thrown(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Endpoint, MetadataThatIsTruncatedForeignOrFromAnotherVersionIsRefusedNamingWhy) {
  Pair p;
  std::vector<uint8_t> m = p.served.metadata();
  auto cut = m;
  cut.resize(m.size() - 1);
  EXPECT_NE(thrown([&] { p.client.connect(cut); }).find("truncated"), std::string::npos);
  EXPECT_NE(thrown([&] { p.client.connect(m.data(), 7); }).find("truncated"), std::string::npos);
  auto foreign = m;
  foreign[0] ^= 0xff;
  EXPECT_NE(thrown([&] { p.client.connect(foreign); }).find("not kvcomm endpoint metadata"), std::string::npos);
  auto future = m;  // a peer whose oldest version is newer than this build's newest
  future[4] = 9, future[6] = 9;
  EXPECT_NE(thrown([&] { p.client.connect(future); }).find("newer than this kvcomm reads"), std::string::npos);
  auto past = m;
  past[4] = 0, past[6] = 0;  // version 0: never valid
  EXPECT_NE(thrown([&] { p.client.connect(past); }).find("bad version range"), std::string::npos);
  auto flipped = m;
  flipped[m.size() - 3] ^= 1;  // a layout byte: the checksum catches it
  EXPECT_NE(thrown([&] { p.client.connect(flipped); }).find("checksum"), std::string::npos);
  // Nothing was sent anywhere: the server memory is as it was.
  EXPECT_EQ(p.serverMem, std::vector<uint8_t>(p.bytes, 0x5a));
  // And the genuine metadata works, idempotently.
  RemoteMemory a = p.client.connect(m), b = p.client.connect(m);
  EXPECT_EQ(a.id(), b.id());
  EXPECT_EQ(p.pull(a).state, FetchState::Done);
}

// Rewrites the checksum of forged metadata (FNV-1a 32 of every byte after the 16-byte head, at offset 12): the
// format is public, so a forger can; only the capability stops it.
void reseal(std::vector<uint8_t>& m) {
  uint32_t h = 2166136261u;
  for (size_t i = 16; i < m.size(); ++i) h = (h ^ m[i]) * 16777619u;
  std::memcpy(&m[12], &h, 4);
}

TEST(Endpoint, AForgedOrRevokedCapabilityIsRefusedBeforeAnyMemoryIsDescribedOrTouched) {
  Pair p;
  std::vector<uint8_t> m = p.served.metadata();
  auto forged = m;
  forged[16 + 24] ^= 0x01;  // first byte of the capability (body offset 24)
  reseal(forged);
  RemoteMemory f = p.client.connect(forged);
  expectFailure(p.pull(f), "capability refused");
  std::vector<int64_t> ids{5, 6};
  expectFailure(p.client.write(p.mine, f, ids.data(), ids.data(), 2).wait(20000), "capability refused");
  EXPECT_EQ(p.serverMem, std::vector<uint8_t>(p.bytes, 0x5a));
  EXPECT_EQ(p.clientMem, std::vector<uint8_t>(p.bytes, 0xc3));

  RemoteMemory ok = p.client.connect(m);
  EXPECT_EQ(p.pull(ok).state, FetchState::Done);  // a connection is open now
  const uint64_t g = p.served.generation();
  p.served.revoke();
  EXPECT_EQ(p.served.generation(), g + 1);
  // The open connection's next request is stale; a new connection with the old metadata is refused.
  expectFailure(p.pull(ok), "revoked");
  Endpoint other = Endpoint::create(local("other"));
  Registration om = other.registerMemory(p.clientMem.data(), p.bytes, MemoryKind::Host, p.layout);
  expectFailure(other.read(om, other.connect(m), p.ids.data(), p.ids.data(), 4).wait(20000), "capability refused");
  // The new metadata works.
  EXPECT_EQ(p.pull(p.client.connect(p.served.metadata())).state, FetchState::Done);
}

TEST(Endpoint, ReadOnlyRegistrationsRefuseWritesAndBadPairsAreRefusedBeforeAnythingMoves) {
  Pair p;
  std::vector<uint8_t> roMem(p.bytes, 0x11);
  RegisterOptions ro;
  ro.access = Access::ReadOnly;
  Registration r = p.server.registerMemory(roMem.data(), p.bytes, MemoryKind::Host, p.layout, -1, ro);
  RemoteMemory rm = p.client.connect(r.metadata());
  EXPECT_NE(thrown([&] { p.client.write(p.mine, rm, p.ids.data(), p.ids.data(), 4); }).find("read-only"),
            std::string::npos);
  EXPECT_EQ(roMem, std::vector<uint8_t>(p.bytes, 0x11));
  RemoteMemory m = p.client.connect(p.served.metadata());
  std::vector<int64_t> src{0, 99}, dst{0, 1};
  EXPECT_NE(thrown([&] { p.client.read(p.mine, m, src.data(), dst.data(), 2); }).find("source block 99"),
            std::string::npos);
  std::vector<int64_t> dup{3, 3};
  EXPECT_NE(thrown([&] { p.client.read(p.mine, m, src.data(), dup.data(), 1 + 1); }).find("outside"),
            std::string::npos);
  std::vector<int64_t> s2{0, 1};
  EXPECT_NE(thrown([&] { p.client.read(p.mine, m, s2.data(), dup.data(), 2); }).find("duplicate destination"),
            std::string::npos);
  EXPECT_NE(thrown([&] { p.client.write(p.mine, m, dup.data(), s2.data(), 2); }).find("duplicate destination"),
            std::string::npos);
  std::vector<int64_t> neg{-2};
  EXPECT_NE(thrown([&] { p.client.read(p.mine, m, neg.data(), s2.data(), 1); }).find("outside"), std::string::npos);
  TransferOptions peer;
  peer.via = TransferVia::Peer;
  // Plain host memory cannot be mapped by another process: the demanded peer path says so (Auto takes TCP).
  EXPECT_NE(thrown([&] { p.client.read(p.mine, m, s2.data(), s2.data(), 2, peer); }).find("memfd or shm"),
            std::string::npos);
  EXPECT_EQ(p.client.read(p.mine, m, s2.data(), s2.data(), 2).transport(), FetchTransportKind::Tcp);
  // Layouts that cannot pair (another block size) are named.
  KvLayout other = splitKv(512, 32);
  std::vector<uint8_t> om(extent(other));
  Registration o = p.client.registerMemory(om.data(), om.size(), MemoryKind::Host, other);
  EXPECT_NE(thrown([&] { p.client.read(o, m, s2.data(), s2.data(), 2); }).find("blocks of"), std::string::npos);
  EXPECT_EQ(p.serverMem, std::vector<uint8_t>(p.bytes, 0x5a));
  EXPECT_EQ(p.clientMem, std::vector<uint8_t>(p.bytes, 0xc3));
  // All -1: nothing to do, done at once.
  std::vector<int64_t> skip{-1, -1};
  Transfer t = p.client.read(p.mine, m, skip.data(), s2.data(), 2);
  EXPECT_EQ(t.test().state, FetchState::Done);
  EXPECT_EQ(t.info().pairsSkipped, 2u);
}

TEST(Endpoint, UnregisterDrainsTransfersAndPeersLearnOfIt) {
  // Big blocks, a slow pace of reads: unregistering the client's memory mid-read cancels the read, and nothing lands
  // after unregister() returns.
  KvLayout layout = layered(1, 1u << 20, 64);
  const size_t bytes = extent(layout);
  std::vector<uint8_t> srv(bytes, 0x42), cli(bytes, 0);
  Endpoint server = Endpoint::create(local("server"));
  Endpoint client = Endpoint::create(local("client"));
  Registration s = server.registerMemory(srv.data(), bytes, MemoryKind::Host, layout);
  Registration c = client.registerMemory(cli.data(), bytes, MemoryKind::Host, layout);
  RemoteMemory r = client.connect(s.metadata());
  std::vector<int64_t> ids(64);
  for (int64_t i = 0; i < 64; ++i) ids[static_cast<size_t>(i)] = i;
  Transfer t = client.read(c, r, ids.data(), ids.data(), ids.size());
  client.unregister(c, 0);
  FetchStatus st = t.test();
  EXPECT_NE(st.state, FetchState::InProgress);
  std::memset(cli.data(), 0x99, bytes);  // nothing may land after unregister returned
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(cli, std::vector<uint8_t>(bytes, 0x99));
  EXPECT_FALSE(c.registered());
  EXPECT_NE(thrown([&] { client.read(c, r, ids.data(), ids.data(), 1); }).find("unregistered"), std::string::npos);

  // The server unregisters: a peer's next transfer fails naming it.
  std::vector<uint8_t> cli2(bytes, 0);
  Registration c2 = client.registerMemory(cli2.data(), bytes, MemoryKind::Host, layout);
  EXPECT_EQ(client.read(c2, r, ids.data(), ids.data(), 2).wait(20000).state, FetchState::Done);
  server.unregister(s);
  expectFailure(client.read(c2, r, ids.data(), ids.data(), 2).wait(20000), "unregistered");
  std::memset(srv.data(), 0x77, bytes);  // the server may reuse its memory now
  std::vector<int64_t> two{0, 1};
  expectFailure(client.write(c2, r, two.data(), two.data(), 2).wait(20000), "unregistered");
  EXPECT_EQ(srv, std::vector<uint8_t>(bytes, 0x77));
}

TEST(Endpoint, ChurnOfAThousandConnectTransferDisconnectCyclesLeavesNothingBehind) {
  KvLayout layout = splitKv(256, 16);
  const size_t bytes = extent(layout);
  std::vector<uint8_t> srv(bytes), cli(bytes);
  for (size_t i = 0; i < bytes; ++i) srv[i] = static_cast<uint8_t>(i * 7);
  Endpoint server = Endpoint::create(local("server"));
  Registration s = server.registerMemory(srv.data(), bytes, MemoryKind::Host, layout);
  const std::vector<uint8_t> meta = s.metadata();
  std::vector<int64_t> ids{0, 1, 2, 3, 4, 5, 6, 7};
  int fd0 = -1, th0 = -1, maps0 = -1;
  long rss0 = 0;
  for (int cycle = 0; cycle < 1000; ++cycle) {
    {
      Endpoint client = Endpoint::create(local("client"));
      Registration c = client.registerMemory(cli.data(), bytes, MemoryKind::Host, layout);
      RemoteMemory r = client.connect(meta);
      FetchStatus st = (cycle % 2 ? client.write(c, r, ids.data(), ids.data(), ids.size())
                                  : client.read(c, r, ids.data(), ids.data(), ids.size()))
                           .wait(20000);
      ASSERT_EQ(st.state, FetchState::Done) << "cycle " << cycle << ": " << st.error;
    }
    if (cycle == 99) {  // after warm-up (malloc's per-thread arenas, cached thread stacks, the server's threads)
      std::this_thread::sleep_for(std::chrono::milliseconds(500));  // the server reaps finished connections
      fd0 = openFds();
      th0 = threads();
      maps0 = kvtest::arena::mappings();
      rss0 = rssKiB();
    }
  }
  // The server reaps finished connection threads as it polls: give it a moment.
  EXPECT_TRUE(kvtest::arena::waitUntil([&] { return openFds() <= fd0 && threads() <= th0; }, 5000))
      << "descriptors " << fd0 << " -> " << openFds() << ", threads " << th0 << " -> " << threads();
  // Mappings and memory: flat after the warm-up, up to what glibc may still add under load (a malloc arena or a
  // cached thread stack: a few mappings, a few MiB), far below one mapping or one buffer per cycle (900 cycles); a
  // sanitizer's allocator keeps freed memory, so there only kvcomm's mappings count.
  EXPECT_LE(kvtest::arena::mappings(), maps0 + 32) << "mappings " << maps0 << " -> " << kvtest::arena::mappings();
  if (!kvtest::kSanitizerAllocator) {
    EXPECT_LE(rssKiB(), rss0 + 16 * 1024) << "RSS " << rss0 << " KiB -> " << rssKiB();
  }
}

TEST(Endpoint, SixtyFourClientsAtOnceAgainstOneServer) {
  KvLayout layout = layered(2, 4096, 128);
  const size_t bytes = extent(layout);
  std::vector<uint8_t> srv(bytes);
  for (size_t i = 0; i < bytes; ++i) srv[i] = static_cast<uint8_t>(mix(i) & 0xff);
  Endpoint server = Endpoint::create(local("server"));
  Registration s = server.registerMemory(srv.data(), bytes, MemoryKind::Host, layout);
  const std::vector<uint8_t> meta = s.metadata();
  std::atomic<int> good{0};
  std::vector<std::thread> ts;
  for (int c = 0; c < 64; ++c)
    ts.emplace_back([&, c] {
      try {
        Endpoint client = Endpoint::create(local("client"));
        std::vector<uint8_t> mine(bytes, 0);
        Registration r = client.registerMemory(mine.data(), bytes, MemoryKind::Host, layout);
        std::vector<int64_t> src(32), dst(32);
        for (int i = 0; i < 32; ++i) src[static_cast<size_t>(i)] = (c + i * 3) % 128, dst[static_cast<size_t>(i)] = i;
        FetchStatus st = client.read(r, client.connect(meta), src.data(), dst.data(), 32).wait(60000);
        bool same = st.state == FetchState::Done;
        for (size_t j = 0; j < 2 && same; ++j)
          for (int i = 0; i < 32 && same; ++i) {
            const KvRegion& g = layout.regions[j];
            same = std::memcmp(&mine[g.offset + static_cast<size_t>(i) * g.blockStride],
                               &srv[g.offset + static_cast<size_t>(src[static_cast<size_t>(i)]) * g.blockStride],
                               g.blockBytes) == 0;
          }
        good += same;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "client %d: %s\n", c, e.what());
      }
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(good.load(), 64);
}

TEST(Endpoint, ArenasAndSymmetricBuffersRegisterAndArePinnedWhileRegistered) {
  KvLayout layout = splitKv(2048, 16);
  const size_t bytes = extent(layout);
  Endpoint server = Endpoint::create(local("server"));
  Endpoint client = Endpoint::create(local("client"));
  std::vector<uint8_t> mine(bytes, 0);
  Registration c = client.registerMemory(mine.data(), bytes, MemoryKind::Host, layout);
  std::vector<int64_t> ids{0, 5, 9};

  // An arena this process owns: served, and pinned (free() is refused) until unregistered.
  ArenaOptions ao;
  ao.kind = MemoryKind::Host;
  Arena arena = Arena::create(layout, ao);
  std::vector<uint8_t> pattern(arena.bytes());
  for (size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<uint8_t>(mix(i) >> 8);
  arena.write(0, pattern.data(), pattern.size());
  Registration a = server.registerArena(arena);
  EXPECT_EQ(a.layout().regions.size(), 2u);
  ASSERT_EQ(client.read(c, client.connect(a.metadata()), ids.data(), ids.data(), 3).wait(20000).state,
            FetchState::Done);
  for (int64_t b : ids)
    for (size_t r = 0; r < 2; ++r) {
      const KvRegion& g = layout.regions[r];
      const size_t o = g.offset + static_cast<size_t>(b) * g.blockStride;
      EXPECT_EQ(std::memcmp(&mine[o], &pattern[o], g.blockBytes), 0) << "arena block " << b;
    }
  EXPECT_NE(thrown([&] { arena.free(); }), "");  // busy: the registration pins it
  server.unregister(a);
  arena.free();
  EXPECT_TRUE(arena.freed());

  // A SymmetricBuffer's local memory (a communicator of one), in a child process: a communicator looks for the
  // current CUDA device, and the test process must stay free of CUDA for the CUDA cases' children.
  pid_t child = spawn([&] {
    Endpoint srv = Endpoint::create(local("buffer server"));
    Endpoint cli = Endpoint::create(local("buffer client"));
    std::vector<uint8_t> got(bytes, 0);
    Registration cr = cli.registerMemory(got.data(), bytes, MemoryKind::Host, layout);
    auto comm = Communicator::create(std::make_shared<TcpBootstrap>(TcpBootstrap::createUniqueId(), 0, 1));
    SymmetricBuffer buf = SymmetricBuffer::create(comm, bytes, bytes, MemoryKind::Host);
    std::memset(buf.local(), 0x6b, bytes);
    Registration sb = srv.registerBuffer(buf, layout);
    FetchStatus st = cli.read(cr, cli.connect(sb.metadata()), ids.data(), ids.data(), 3).wait(20000);
    const KvRegion& g = layout.regions[1];
    const bool ok = st.state == FetchState::Done && got[g.offset + 9 * g.blockStride] == 0x6b &&
                    got[g.offset + 1 * g.blockStride] == 0;  // a block not read stays
    if (!ok) std::fprintf(stderr, "buffer registration: %s\n", st.error.c_str());
    srv.unregister(sb);
    buf.close();
    return ok;
  });
  EXPECT_EQ(reap(child, 60), 0);
}

// ---- faults between processes ---------------------------------------------------------------------------------------

TEST(EndpointFaults,
     AServerKilledMidReadOrMidWriteFailsTheTransferWithinFiveSecondsNamingBlocksAndARestartIsReachable) {
  KvLayout layout = layered(1, 1u << 20, 256);
  const size_t bytes = extent(layout);
  for (bool push : {false, true}) {
    const std::string metaPath = tempPath("kill");
    Gate ready;
    pid_t server = spawn([&] {
      std::vector<uint8_t> srv(bytes, 0x3c);
      Endpoint ep = Endpoint::create(local("victim"));
      Registration reg = ep.registerMemory(srv.data(), bytes, MemoryKind::Host, layout);
      writeFile(metaPath, reg.metadata());
      ready.pass();
      pause();
      return true;
    });
    ASSERT_TRUE(ready.wait(30000));
    std::vector<uint8_t> cli(bytes, 0);
    EndpointOptions o = local("client");
    o.timeoutMs = 2000;
    o.connectionsPerPeer = 1;
    Endpoint client = Endpoint::create(o);
    Registration c = client.registerMemory(cli.data(), bytes, MemoryKind::Host, layout);
    RemoteMemory r = client.connect(readFile(metaPath));
    std::vector<int64_t> ids(256);
    for (int64_t i = 0; i < 256; ++i) ids[static_cast<size_t>(i)] = i;
    // Many rounds of 256 MiB: the kill lands while one runs.
    Transfer t = push ? client.write(c, r, ids.data(), ids.data(), ids.size())
                      : client.read(c, r, ids.data(), ids.data(), ids.size());
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    kill(server, SIGKILL);
    auto t0 = std::chrono::steady_clock::now();
    FetchStatus st = t.wait(20000);
    const double secs = kvtest::arena::since(t0);
    reap(server);
    if (st.state == FetchState::Done) {  // it finished before the kill: nothing to check but the restart
      std::printf("(%s finished before the kill)\n", push ? "write" : "read");
    } else {
      EXPECT_EQ(st.state, FetchState::Failed);
      EXPECT_LT(secs, 5.0);
      EXPECT_FALSE(st.failedBlocks.empty());
      EXPECT_NE(st.error.find("victim"), std::string::npos) << st.error;
    }
    // The server restarts on the same address with new metadata: the old metadata is refused naming the restart,
    // the new one works.
    Gate again;
    const std::string address = r.address();
    pid_t restarted = spawn([&] {
      std::vector<uint8_t> srv(bytes, 0x3d);
      EndpointOptions so = local("victim");
      so.tcpAddress = address;
      Endpoint ep = Endpoint::create(so);
      Registration reg = ep.registerMemory(srv.data(), bytes, MemoryKind::Host, layout);
      writeFile(metaPath, reg.metadata());
      again.pass();
      pause();
      return true;
    });
    ASSERT_TRUE(again.wait(30000));
    expectFailure(client.read(c, r, ids.data(), ids.data(), 2).wait(20000), "restarted (now 0x");
    RemoteMemory fresh = client.connect(readFile(metaPath));
    EXPECT_EQ(client.read(c, fresh, ids.data(), ids.data(), 2).wait(20000).state, FetchState::Done);
    EXPECT_EQ(cli[layout.regions[0].offset], 0x3d);
    kill(restarted, SIGKILL);
    reap(restarted);
    std::remove(metaPath.c_str());
  }
}

TEST(EndpointFaults, AClientKilledMidWriteLeavesTheServerServingAndNothingBehind) {
  KvLayout layout = layered(1, 1u << 20, 256);
  const size_t bytes = extent(layout);
  std::vector<uint8_t> srv(bytes, 0x21);
  Endpoint server = Endpoint::create(local("server"));
  Registration reg = server.registerMemory(srv.data(), bytes, MemoryKind::Host, layout);
  const std::string metaPath = tempPath("client-kill");
  writeFile(metaPath, reg.metadata());
  Gate started;                                                 // (its pipe before the baseline)
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the server's threads settle
  const int fd0 = openFds(), th0 = threads();
  pid_t client = spawn([&] {
    std::vector<uint8_t> mine(bytes, 0x5c);
    EndpointOptions o = local("doomed");
    o.connectionsPerPeer = 4;
    Endpoint ep = Endpoint::create(o);
    Registration c = ep.registerMemory(mine.data(), bytes, MemoryKind::Host, layout);
    RemoteMemory r = ep.connect(readFile(metaPath));
    std::vector<int64_t> ids(256);
    for (int64_t i = 0; i < 256; ++i) ids[static_cast<size_t>(i)] = i;
    for (;;) {  // writes until killed
      Transfer t = ep.write(c, r, ids.data(), ids.data(), ids.size());
      started.pass();
      t.wait();
    }
    return true;
  });
  ASSERT_TRUE(started.wait(30000));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  kill(client, SIGKILL);
  EXPECT_EQ(reap(client), -SIGKILL);
  // The server drops the dead client's connections (end of stream mid-payload) and keeps serving.
  EXPECT_TRUE(kvtest::arena::waitUntil([&] { return openFds() <= fd0 && threads() <= th0; }, 5000))
      << "descriptors " << fd0 << " -> " << openFds() << ", threads " << th0 << " -> " << threads();
  Endpoint next = Endpoint::create(local("next"));
  std::vector<uint8_t> mine(bytes, 0);
  Registration c = next.registerMemory(mine.data(), bytes, MemoryKind::Host, layout);
  std::vector<int64_t> two{0, 255};
  EXPECT_EQ(next.read(c, next.connect(readFile(metaPath)), two.data(), two.data(), 2).wait(20000).state,
            FetchState::Done);
  std::remove(metaPath.c_str());
}

// The notification of item k of a sender's stream (tests below): its index, and bytes that tell a torn message.
std::string streamMessage(int64_t k, bool write) {
  std::string m = (write ? "w " : "m ") + std::to_string(k) + ":";
  for (int64_t i = 0; i < k % 301; ++i) m.push_back(static_cast<char>(mix(static_cast<uint64_t>(k * 1000 + i))));
  return m;
}

// Pattern of block k in a sender's memory (what its write k lands).
void fillBlock(uint8_t* base, const KvLayout& l, int64_t k) {
  const KvRegion& g = l.regions[0];
  for (size_t i = 0; i < g.blockBytes; ++i)
    base[g.offset + static_cast<size_t>(k) * g.blockStride + i] =
        static_cast<uint8_t>(mix(static_cast<uint64_t>(k) * 7 + i / 8) >> (i % 8 * 8));
}

TEST(EndpointFaults, ASenderKilledMidStreamLeavesNoPhantomNotification) {
  // Both sides arenas on one host: writes go through the peer mapping, notifications over TCP.
  constexpr int64_t kBlocks = 2048;
  KvLayout layout = layered(1, 512, kBlocks);
  ArenaOptions ao;
  ao.kind = MemoryKind::Host;
  Arena srvArena = Arena::create(layout, ao);
  std::memset(srvArena.data(), 0, srvArena.bytes());
  Endpoint server = Endpoint::create(local("server"));
  Registration reg = server.registerArena(srvArena);
  const std::string metaPath = tempPath("notify-kill");
  writeFile(metaPath, reg.metadata());
  Gate started;
  pid_t sender = spawn([&] {
    Arena mine = Arena::create(layout, ao);
    for (int64_t k = 0; k < kBlocks; ++k) fillBlock(static_cast<uint8_t*>(mine.data()), layout, k);
    Endpoint ep = Endpoint::create(local("doomed"));
    Registration c = ep.registerArena(mine);
    RemoteMemory r = ep.connect(readFile(metaPath));
    std::vector<Transfer> inflight;
    for (int64_t k = 0;; ++k) {  // until killed: writes with notifications and plain messages, 8 in flight
      if (k % 2 && k < kBlocks) {
        TransferOptions t;
        t.notify = streamMessage(k, true);
        inflight.push_back(ep.write(c, r, &k, &k, 1, t));
        if (inflight.back().transport() != FetchTransportKind::Peer) return false;
        if (inflight.size() == 8) {
          if (inflight.front().wait().state != FetchState::Done) return false;
          inflight.erase(inflight.begin());
        }
      } else {
        ep.notify(r, streamMessage(k, false));
      }
      if (k == 64) started.pass();
    }
  });
  ASSERT_TRUE(started.wait(30000));
  std::vector<Notification> got;
  auto take = [&](int64_t ms) {
    for (Notification& n : server.notifications(ms)) got.push_back(std::move(n));
  };
  while (got.size() < 200) take(100);
  kill(sender, SIGKILL);
  EXPECT_EQ(reap(sender), -SIGKILL);
  for (int i = 0; i < 10; ++i) take(100);
  // A prefix of the stream, each message whole, each write's block in place.
  std::vector<uint8_t> want(srvArena.bytes());
  for (size_t i = 0; i < got.size(); ++i) {
    const int64_t k = static_cast<int64_t>(i);
    const bool write = k % 2 && k < kBlocks;
    ASSERT_EQ(got[i].message, streamMessage(k, write)) << "notification " << i << " is not item " << k;
    ASSERT_EQ(got[i].fromName, "doomed");
    if (write) {
      fillBlock(want.data(), layout, k);
      const KvRegion& g = layout.regions[0];
      const size_t at = g.offset + static_cast<size_t>(k) * g.blockStride;
      ASSERT_EQ(std::memcmp(static_cast<const uint8_t*>(srvArena.data()) + at, want.data() + at, g.blockBytes), 0)
          << "write " << k << " was notified but its block is not in place";
    }
  }
  // The server goes on receiving from others.
  Endpoint next = Endpoint::create(local("next"));
  next.notify(next.connect(readFile(metaPath)), "after");
  got.clear();
  take(5000);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].message, "after");
  server.unregister(reg);
  std::remove(metaPath.c_str());
}

// ---- same-host peers: the registration mapped, not copied over a socket ---------------------------------------------

// A host arena (memfd: another process can map it) holding `im`'s bytes.
Arena hostArena(const KvLayout& layout) {
  ArenaOptions ao;
  ao.kind = MemoryKind::Host;
  return Arena::create(layout, ao);
}

std::vector<uint8_t> arenaBytes(const Arena& a) {
  const auto* p = static_cast<const uint8_t*>(a.data());
  return std::vector<uint8_t>(p, p + a.bytes());
}

// The state letter of /proc/<pid>/stat ('T': stopped), or '?'.
char processState(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(f, line);
  const size_t close = line.rfind(')');
  return close != std::string::npos && close + 2 < line.size() ? line[close + 2] : '?';
}

// Shared-memory mappings of this process (memfd: a peer's arena mapped here adds some; threads' stacks do not).
size_t mappings() {
  std::ifstream f("/proc/self/maps");
  size_t n = 0;
  for (std::string line; std::getline(f, line);) n += line.find("/memfd:") != std::string::npos;
  return n;
}

TEST(EndpointPeer, ArenasOfTwoProcessesOnOneHostPullAndPushThroughTheMappingByteExact) {
  KvLayout layout = splitKv(4096, 64);
  const uint64_t seed = testSeed() ^ 0x9eed;
  const std::string metaPath = tempPath("peer");
  Gate ready, done;
  auto serverImage = [&](size_t n) {
    Image im(layout, n, seed + 3);
    for (size_t r = 0; r < 2; ++r)
      for (int64_t b = 0; b < 64; ++b) im.put(r, b, seed * 13 + static_cast<uint64_t>(b));
    return im;
  };
  pid_t server = spawn([&] {
    Endpoint ep = Endpoint::create(local("peer-server"));
    Arena arena = hostArena(layout);
    Image im = serverImage(arena.bytes());
    std::memcpy(arena.data(), im.bytes.data(), im.bytes.size());
    Registration reg = ep.registerArena(arena);
    writeFile(metaPath, reg.metadata());
    ready.pass();
    if (!done.wait(60000)) return false;
    Image want = serverImage(arena.bytes());
    Image pushed(layout, arena.bytes(), seed + 5);
    pushed.put(0, 9, seed * 5);
    pushed.put(1, 9, seed * 6);
    want.copyBlock(pushed, 9, 40);  // the client pushed its block 9 into block 40
    std::string diff = firstDifference(arenaBytes(arena), want.bytes);
    if (!diff.empty()) std::fprintf(stderr, "peer server after the push: %s\n", diff.c_str());
    ep.unregister(reg);
    return diff.empty();
  });
  ASSERT_TRUE(ready.wait(60000));
  Endpoint ep = Endpoint::create(local("peer-client"));
  Arena arena = hostArena(layout);
  Image mine(layout, arena.bytes(), seed + 5);
  mine.put(0, 9, seed * 5);
  mine.put(1, 9, seed * 6);
  std::memcpy(arena.data(), mine.bytes.data(), mine.bytes.size());
  Registration c = ep.registerArena(arena);
  RemoteMemory r = ep.connect(readFile(metaPath));
  const Image srv = serverImage(arena.bytes());

  // Pull (Auto picks the mapping on one host), with skipped pairs and runs that coalesce; the whole arena, guard
  // bytes included, must equal the oracle.
  std::vector<int64_t> src{3, 4, 5, -1, 63, 0}, dst{10, 11, 12, 13, 0, -1};
  Transfer t = ep.read(c, r, src.data(), dst.data(), src.size());
  EXPECT_EQ(t.transport(), FetchTransportKind::Peer);
  FetchStatus s = t.wait(20000);
  ASSERT_EQ(s.state, FetchState::Done) << s.error;
  EXPECT_EQ(t.info().hostRuns + t.info().kernelRuns + t.info().copyEngineRuns, 2u * 2u);  // 2 runs x 2 regions
  Image want = mine;
  for (size_t i = 0; i < src.size(); ++i)
    if (src[i] >= 0 && dst[i] >= 0) want.copyBlock(srv, src[i], dst[i]);
  EXPECT_EQ(firstDifference(arenaBytes(arena), want.bytes), "");

  // Device-id form on host memory: synchronous CPU copies; a bad id is refused before anything moves.
  std::vector<int64_t> dsrc{7, 8}, ddst{20, 21};
  ep.readDevice(c, r, {dsrc.data(), ddst.data(), 2});
  for (size_t i = 0; i < 2; ++i) want.copyBlock(srv, dsrc[i], ddst[i]);
  EXPECT_EQ(firstDifference(arenaBytes(arena), want.bytes), "");
  std::vector<int64_t> bad{64}, one{22};
  EXPECT_NE(thrown([&] { ep.readDevice(c, r, {bad.data(), one.data(), 1}); }), "");
  EXPECT_EQ(firstDifference(arenaBytes(arena), want.bytes), "");

  // Push, and the same over TCP when demanded (both paths land the same bytes).
  std::vector<int64_t> from{9}, to{40};
  Transfer w = ep.write(c, r, to.data(), from.data(), 1);
  EXPECT_EQ(w.transport(), FetchTransportKind::Peer);
  ASSERT_EQ(w.wait(20000).state, FetchState::Done);
  TransferOptions tcp;
  tcp.via = TransferVia::Tcp;
  std::vector<int64_t> ts{30}, td{31};
  Transfer viaTcp = ep.read(c, r, ts.data(), td.data(), 1, tcp);
  EXPECT_EQ(viaTcp.transport(), FetchTransportKind::Tcp);
  ASSERT_EQ(viaTcp.wait(20000).state, FetchState::Done);
  want.copyBlock(srv, 30, 31);
  EXPECT_EQ(firstDifference(arenaBytes(arena), want.bytes), "");
  done.pass();
  EXPECT_EQ(reap(server, 60), 0);
  ep.unregister(c);
  std::remove(metaPath.c_str());
}

TEST(EndpointPeer, UnregisterAndRevokeEndTheMappingAfterThePeerStoppedAndStaleMetadataIsRefused) {
  KvLayout layout = splitKv(2048, 16);
  Endpoint server = Endpoint::create(local("server"));
  Endpoint client = Endpoint::create(local("client"));
  Arena sa = hostArena(layout), ca = hostArena(layout);
  std::memset(sa.data(), 0x3c, sa.bytes());
  std::memset(ca.data(), 0, ca.bytes());
  Registration s = server.registerArena(sa), c = client.registerArena(ca);
  const size_t maps0 = mappings();
  std::vector<int64_t> ids{1, 2};
  RemoteMemory r = client.connect(s.metadata());
  ASSERT_EQ(client.read(c, r, ids.data(), ids.data(), 2).wait(20000).state, FetchState::Done);
  EXPECT_GT(mappings(), maps0);  // the server's arena is mapped here

  // Revoke: the holder is told, stops, unmaps; the old metadata is refused naming the revoke.
  s.revoke();
  EXPECT_TRUE(kvtest::arena::waitUntil([&] { return mappings() == maps0; }, 5000)) << mappings() << " vs " << maps0;
  FetchStatus st = client.read(c, r, ids.data(), ids.data(), 2).wait(20000);
  EXPECT_EQ(st.state, FetchState::Failed);
  EXPECT_NE(st.error.find("capability refused"), std::string::npos) << st.error;
  EXPECT_EQ(st.failedBlocks, ids);

  // New metadata maps again; unregister returns only after the holder unmapped, and later reads are refused.
  RemoteMemory r2 = client.connect(s.metadata());
  ASSERT_EQ(client.read(c, r2, ids.data(), ids.data(), 2).wait(20000).state, FetchState::Done);
  EXPECT_GT(mappings(), maps0);
  server.unregister(s);
  EXPECT_TRUE(kvtest::arena::waitUntil([&] { return mappings() == maps0; }, 5000));
  st = client.read(c, r2, ids.data(), ids.data(), 2).wait(20000);
  EXPECT_EQ(st.state, FetchState::Failed);
  EXPECT_NE(st.error.find("unregistered"), std::string::npos) << st.error;
  sa.free();  // unpinned: nothing maps it any more
}

TEST(EndpointPeer, ThreeHundredMapTransferUnregisterCyclesLeaveNoDescriptorMappingOrThreadBehind) {
  KvLayout layout = splitKv(4096, 8);
  Endpoint server = Endpoint::create(local("server"));
  Endpoint client = Endpoint::create(local("client"));
  Arena sa = hostArena(layout), ca = hostArena(layout);
  std::memset(sa.data(), 0x77, sa.bytes());
  Registration c = client.registerArena(ca);
  std::vector<int64_t> ids{0, 3, 7};
  int fd0 = 0, th0 = 0;
  size_t maps0 = 0;
  for (int cycle = 0; cycle < 300; ++cycle) {
    if (cycle == 1) {  // after the first cycle: every lazily made thread exists
      fd0 = openFds();
      th0 = threads();
      maps0 = mappings();
    }
    Registration s = server.registerArena(sa);
    std::memset(ca.data(), 0, ca.bytes());
    Transfer t = client.read(c, client.connect(s.metadata()), ids.data(), ids.data(), ids.size());
    ASSERT_EQ(t.transport(), FetchTransportKind::Peer);
    ASSERT_EQ(t.wait(20000).state, FetchState::Done) << "cycle " << cycle;
    ASSERT_EQ(static_cast<uint8_t*>(ca.data())[layout.regions[1].offset + 7 * layout.regions[1].blockStride], 0x77);
    server.unregister(s);  // the client unmapped before this returns
  }
  EXPECT_TRUE(kvtest::arena::waitUntil([&] { return openFds() <= fd0 && threads() <= th0; }, 5000))
      << "descriptors " << fd0 << " -> " << openFds() << ", threads " << th0 << " -> " << threads();
  EXPECT_EQ(mappings(), maps0);
  client.unregister(c);
  sa.free();
}

TEST(EndpointPeer, ALongLivedEndpointThatConnectsTransfersAndDisconnectsThreeHundredTimesStaysFlat) {
  KvLayout layout = splitKv(4096, 8);
  Endpoint server = Endpoint::create(local("server"));
  Endpoint client = Endpoint::create(local("client"));
  Arena sa = hostArena(layout), ca = hostArena(layout);
  std::memset(sa.data(), 0x5d, sa.bytes());
  std::vector<uint8_t> plain(extent(layout), 0x2e);  // plain memory: reached over TCP
  Registration s = server.registerArena(sa);
  Registration sp = server.registerMemory(plain.data(), plain.size(), MemoryKind::Host, layout);
  Registration c = client.registerArena(ca);
  std::vector<int64_t> ids{1, 4};
  int fd0 = 0, th0 = 0;
  size_t maps0 = 0;
  for (int cycle = 0; cycle < 300; ++cycle) {
    if (cycle == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the server reaps finished connections
      fd0 = openFds();
      th0 = threads();
      maps0 = mappings();
    }
    const bool tcp = cycle % 2;
    RemoteMemory r = client.connect(tcp ? sp.metadata() : s.metadata());
    Transfer t = client.read(c, r, ids.data(), ids.data(), ids.size());
    ASSERT_EQ(t.transport(), tcp ? FetchTransportKind::Tcp : FetchTransportKind::Peer);
    ASSERT_EQ(t.wait(20000).state, FetchState::Done) << "cycle " << cycle;
    client.disconnect(r);
    EXPECT_NE(thrown([&] { client.read(c, r, ids.data(), ids.data(), ids.size()); }).find("disconnected"),
              std::string::npos);
  }
  EXPECT_TRUE(kvtest::arena::waitUntil([&] { return openFds() <= fd0 && threads() <= th0; }, 5000))
      << "descriptors " << fd0 << " -> " << openFds() << ", threads " << th0 << " -> " << threads();
  EXPECT_EQ(mappings(), maps0);
  // A disconnect while a transfer runs cancels it (failed, naming the disconnect) and returns once it stopped.
  RemoteMemory r = client.connect(s.metadata());
  std::vector<int64_t> all{0, 1, 2, 3, 4, 5, 6, 7};
  Transfer t = client.read(c, r, all.data(), all.data(), all.size());
  client.disconnect(r);
  FetchStatus st = t.wait(20000);
  EXPECT_NE(st.state, FetchState::InProgress);
  if (st.state == FetchState::Failed) {
    EXPECT_NE(st.error.find("disconnected"), std::string::npos) << st.error;
  }
  server.unregister(s);
  sa.free();
}

// revoke() returns only once same-host holders unmapped: a read started right after it, from a registration that
// never mapped the peer (a fresh link: the cached mapping would be reused if it were still there), is refused every
// time. Before revoke waited, one round in three read the revoked memory through the mapping a previous,
// unregistered registration had left behind.
TEST(EndpointPeer, NothingCopiesThroughAMappingOnceRevokeReturned) {
  KvLayout layout = splitKv(2048, 16);
  Endpoint server = Endpoint::create(local("server"));
  Endpoint client = Endpoint::create(local("client"));
  Arena sa = hostArena(layout);
  std::memset(sa.data(), 0x5a, sa.bytes());
  std::vector<int64_t> ids{3};
  for (int round = 0; round < 20; ++round) {
    Registration s = server.registerArena(sa);
    RemoteMemory r = client.connect(s.metadata());
    {
      Arena first = hostArena(layout);
      Registration c = client.registerArena(first);
      TransferOptions peer;
      peer.via = TransferVia::Peer;
      ASSERT_EQ(client.read(c, r, ids.data(), ids.data(), 1, peer).wait(20000).state, FetchState::Done);
      client.unregister(c);
      first.free();
    }
    s.revoke();
    Arena second = hostArena(layout);
    std::memset(second.data(), 0, second.bytes());
    Registration c2 = client.registerArena(second);
    FetchStatus st = client.read(c2, r, ids.data(), ids.data(), 1).wait(20000);
    EXPECT_EQ(st.state, FetchState::Failed) << "round " << round;
    EXPECT_NE(st.error.find("capability refused"), std::string::npos) << "round " << round << ": " << st.error;
    EXPECT_EQ(static_cast<unsigned char*>(second.data())[layout.regions[0].offset + 3 * layout.regions[0].blockStride],
              0)
        << "round " << round;
    client.unregister(c2);
    second.free();
    client.disconnect(r);
    server.unregister(s);
    if (HasFailure()) break;
  }
  sa.free();
}

TEST(EndpointPeer, AStoppedHolderMakesABoundedUnregisterNameItAndADeadOneNeverBlocksIt) {
  KvLayout layout = splitKv(2048, 16);
  Endpoint server = Endpoint::create(local("server"));
  Arena sa = hostArena(layout);
  std::memset(sa.data(), 0x41, sa.bytes());
  for (int round = 0; round < 2; ++round) {
    Registration s = server.registerArena(sa);
    const std::string metaPath = tempPath("holder");
    writeFile(metaPath, s.metadata());
    Gate mapped;
    pid_t holder = spawn([&] {
      Endpoint ep = Endpoint::create(local("holder"));
      Arena ca = hostArena(layout);
      Registration c = ep.registerArena(ca);
      std::vector<int64_t> ids{0};
      Transfer t = ep.read(c, ep.connect(readFile(metaPath)), ids.data(), ids.data(), 1);
      const bool ok = t.transport() == FetchTransportKind::Peer && t.wait(20000).state == FetchState::Done &&
                      static_cast<uint8_t*>(ca.data())[layout.regions[0].offset] == 0x41;
      mapped.pass();
      std::this_thread::sleep_for(std::chrono::seconds(30));  // holds the mapping until killed or told
      return ok;
    });
    ASSERT_TRUE(mapped.wait(30000));
    if (round == 0) {
      // A holder that cannot answer (stopped): the bounded unregister names it and keeps the arena pinned; once it
      // runs again it lets go and the next unregister returns.
      kill(holder, SIGSTOP);
      // Signals land asynchronously: the notice must find the holder already stopped.
      ASSERT_TRUE(kvtest::arena::waitUntil([&] { return processState(holder) == 'T'; }, 5000));
      const std::string why = thrown([&] { server.unregister(s, 300); });
      EXPECT_NE(why.find(std::to_string(holder)), std::string::npos) << why;
      EXPECT_NE(thrown([&] { sa.free(); }), "");  // still pinned
      kill(holder, SIGCONT);
      const auto t0 = std::chrono::steady_clock::now();
      server.unregister(s, 10000);
      EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
      kill(holder, SIGKILL);
    } else {
      // A holder killed: its lease closes with it; unregister does not wait for anything.
      kill(holder, SIGKILL);
      const auto t0 = std::chrono::steady_clock::now();
      server.unregister(s);
      EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
    }
    EXPECT_EQ(reap(holder), -SIGKILL);
    std::remove(metaPath.c_str());
  }
  sa.free();
}

TEST(EndpointPeer, AnotherUserIsRefusedBeforeAnythingIsDescribed) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a peer as another user";
  KvLayout layout = splitKv(2048, 16);
  Endpoint server = Endpoint::create(local("server"));
  Arena sa = hostArena(layout);
  Registration s = server.registerArena(sa);
  const std::vector<uint8_t> meta = s.metadata();
  pid_t other = spawn([&] {
    if (setgid(65534) != 0 || setuid(65534) != 0) return false;
    Endpoint ep = Endpoint::create(local("nobody"));
    std::vector<uint8_t> mine(extent(layout), 0);
    Registration c = ep.registerMemory(mine.data(), mine.size(), MemoryKind::Host, layout);
    TransferOptions peer;
    peer.via = TransferVia::Peer;
    std::vector<int64_t> ids{0};
    std::string why;
    try {
      why = ep.read(c, ep.connect(meta), ids.data(), ids.data(), 1, peer).wait(20000).error;
    } catch (const std::exception& e) {
      why = e.what();
    }
    const bool ok = why.find("uid 65534") != std::string::npos && mine[layout.regions[0].offset] == 0;
    if (!ok) std::fprintf(stderr, "another user: %s\n", why.c_str());
    return ok;
  });
  EXPECT_EQ(reap(other, 60), 0);
  server.unregister(s);
}

TEST(EndpointPeer, AnOwnerKilledMidReadOrMidWriteFailsTheTransferWithinFiveSecondsNamingItAndTheBlocks) {
  // 256 MiB moved per transfer in 1 MiB blocks: long enough on any machine for the kill to land mid-transfer.
  KvLayout layout = layered(1, 1u << 20, 256);
  for (bool push : {false, true}) {
    const std::string metaPath = tempPath(push ? "peer-kill-write" : "peer-kill-read");
    Gate ready;
    pid_t server = spawn([&] {
      Endpoint ep = Endpoint::create(local("doomed owner"));
      Arena a = hostArena(layout);
      std::memset(a.data(), 0x4f, a.bytes());
      Registration reg = ep.registerArena(a);
      writeFile(metaPath, reg.metadata());
      ready.pass();
      std::this_thread::sleep_for(std::chrono::seconds(60));
      return true;
    });
    ASSERT_TRUE(ready.wait(30000));
    Endpoint ep = Endpoint::create(local("survivor"));
    Arena ca = hostArena(layout);
    Registration c = ep.registerArena(ca);
    RemoteMemory r = ep.connect(readFile(metaPath));
    std::vector<int64_t> ids(256);
    for (int64_t i = 0; i < 256; ++i) ids[static_cast<size_t>(i)] = 255 - i;
    FetchStatus st;
    for (int attempt = 0; attempt < 20; ++attempt) {  // until one transfer is cut by the kill
      Transfer t =
          push ? ep.write(c, r, ids.data(), ids.data(), ids.size()) : ep.read(c, r, ids.data(), ids.data(), ids.size());
      ASSERT_EQ(t.transport(), FetchTransportKind::Peer);
      if (attempt == 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        kill(server, SIGKILL);
      }
      const auto t0 = std::chrono::steady_clock::now();
      st = t.wait(20000);
      EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
      if (st.state == FetchState::Failed) break;
    }
    EXPECT_EQ(reap(server), -SIGKILL);
    ASSERT_EQ(st.state, FetchState::Failed) << "no transfer noticed the owner's death";
    EXPECT_TRUE(st.error.find("doomed owner") != std::string::npos) << st.error;
    EXPECT_FALSE(st.failedBlocks.empty());
    EXPECT_LE(st.failedBlocks.size(), ids.size());
    std::remove(metaPath.c_str());
  }
}

TEST(EndpointPeer, AnUnprivilegedProcessSharesItsArenasFromTheirOwnDescriptors) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to drop to an unprivileged user";
  KvLayout layout = splitKv(2048, 16);
  pid_t child = spawn([&] {
    // Without privilege /proc/self/map_files cannot be opened: an arena is shared from its own pieces, other
    // memfd memory the endpoint did not allocate goes over TCP (Auto) and a demanded peer path says why.
    if (setgid(65534) != 0 || setuid(65534) != 0) return false;
    Endpoint server = Endpoint::create(local("unprivileged server"));
    Endpoint client = Endpoint::create(local("unprivileged client"));
    Arena sa = hostArena(layout), ca = hostArena(layout);
    std::memset(sa.data(), 0x19, sa.bytes());
    Registration s = server.registerArena(sa), c = client.registerArena(ca);
    std::vector<int64_t> ids{2, 3};
    Transfer t = client.read(c, client.connect(s.metadata()), ids.data(), ids.data(), 2);
    const bool mapped =
        t.transport() == FetchTransportKind::Peer && t.wait(20000).state == FetchState::Done &&
        static_cast<uint8_t*>(ca.data())[layout.regions[0].offset + 3 * layout.regions[0].blockStride] == 0x19;
    if (!mapped) std::fprintf(stderr, "unprivileged arena: transport %s\n", fetchTransportName(t.transport()));
    const size_t n = 1u << 20;
    int fd = memfd_create("not-kvcomm", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, static_cast<off_t>(n)) != 0) return false;
    void* mem = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (mem == MAP_FAILED) return false;
    Registration m = server.registerMemory(mem, n, MemoryKind::Host, layout);
    RemoteMemory rm = client.connect(m.metadata());
    Transfer viaAuto = client.read(c, rm, ids.data(), ids.data(), 2);
    const bool tcp = viaAuto.transport() == FetchTransportKind::Tcp && viaAuto.wait(20000).state == FetchState::Done;
    TransferOptions peer;
    peer.via = TransferVia::Peer;
    const std::string why = thrown([&] { client.read(c, rm, ids.data(), ids.data(), 2, peer); });
    if (!tcp || why.find("memfd or shm") == std::string::npos)
      std::fprintf(stderr, "foreign memfd: tcp %d, %s\n", tcp, why.c_str());
    server.unregister(m);
    munmap(mem, n);
    close(fd);
    return mapped && tcp && why.find("memfd or shm") != std::string::npos;
  });
  EXPECT_EQ(reap(child, 60), 0);
}

TEST(EndpointPeer, AServerKilledWhileMappedEndsTheMappingAndLaterTransfersFailNamingIt) {
  KvLayout layout = splitKv(2048, 16);
  const std::string metaPath = tempPath("peer-kill");
  Gate ready;
  pid_t server = spawn([&] {
    Endpoint ep = Endpoint::create(local("victim"));
    Arena a = hostArena(layout);
    Registration reg = ep.registerArena(a);
    writeFile(metaPath, reg.metadata());
    ready.pass();
    std::this_thread::sleep_for(std::chrono::seconds(60));
    return true;
  });
  ASSERT_TRUE(ready.wait(30000));
  Endpoint ep = Endpoint::create(local("survivor"));
  Arena ca = hostArena(layout);
  Registration c = ep.registerArena(ca);
  RemoteMemory r = ep.connect(readFile(metaPath));
  std::vector<int64_t> ids{0, 1};
  const size_t maps0 = mappings();
  ASSERT_EQ(ep.read(c, r, ids.data(), ids.data(), 2).wait(20000).state, FetchState::Done);
  EXPECT_GT(mappings(), maps0);
  kill(server, SIGKILL);
  EXPECT_EQ(reap(server), -SIGKILL);
  EXPECT_TRUE(kvtest::arena::waitUntil([&] { return mappings() == maps0; }, 5000));  // unmapped
  TransferOptions peer;
  peer.via = TransferVia::Peer;
  const auto t0 = std::chrono::steady_clock::now();
  FetchStatus st = ep.read(c, r, ids.data(), ids.data(), 2, peer).wait(20000);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  EXPECT_EQ(st.state, FetchState::Failed);
  EXPECT_NE(st.error.find("victim"), std::string::npos) << st.error;
  EXPECT_EQ(st.failedBlocks, ids);
  std::remove(metaPath.c_str());
}

// ---- CUDA memory (GPU machine) -------------------------------------------------------------------------------------

#ifdef KVCOMM_HAVE_CUDA
// Device memory holding `im` (cudaMalloc, as PyTorch's caching allocator makes it), freed at scope end.
struct DeviceCopy {
  void* p = nullptr;
  size_t n = 0;
  explicit DeviceCopy(const Image& im) : n(im.bytes.size()) {
    if (cudaMalloc(&p, n) != cudaSuccess || cudaMemcpy(p, im.bytes.data(), n, cudaMemcpyHostToDevice) != cudaSuccess)
      throw std::runtime_error("cudaMalloc/cudaMemcpy failed");
  }
  ~DeviceCopy() { cudaFree(p); }
  std::vector<uint8_t> read() const {
    std::vector<uint8_t> v(n);
    if (cudaMemcpy(v.data(), p, n, cudaMemcpyDeviceToHost) != cudaSuccess) throw std::runtime_error("cudaMemcpy");
    return v;
  }
};
#endif

TEST(EndpointCuda, CudaMallocMemoryOnBothSidesAndAHostServerIntoGpuSlots) {
  if (kvtest::arena::gpuCount() == 0) GTEST_SKIP() << kvtest::arena::noGpuReason();
#ifdef KVCOMM_HAVE_CUDA
  // Blocks of 3 MiB: more than one 4 MiB staging slot per request, so slots alternate.
  KvLayout layout = splitKv(3u << 20, 8);
  const size_t bytes = extent(layout);
  const uint64_t seed = testSeed() ^ 0xc0da;
  const std::string metaPath = tempPath("cuda"), hostMetaPath = tempPath("cuda-host");
  Gate ready, done;
  auto serverImage = [&](uint64_t s) {
    Image im(layout, bytes, s + 1);
    for (size_t r = 0; r < 2; ++r)
      for (int64_t b = 0; b < 8; ++b) im.put(r, b, s * 31 + static_cast<uint64_t>(b));
    return im;
  };
  auto clientImage = [&] {
    Image im(layout, bytes, seed + 7);
    for (size_t r = 0; r < 2; ++r) im.put(r, 0, seed * 77);  // block 0 is pushed
    return im;
  };
  pid_t server = spawn([&] {
    if (!kvtest::arena::useDevice(MemoryKind::Cuda, 0)) return false;
    Endpoint ep = Endpoint::create(local("gpu-server"));
    Image im = serverImage(seed);
    DeviceCopy dev(im);
    Registration reg = ep.registerMemory(dev.p, bytes, MemoryKind::Cuda, layout, 0);
    Image hostIm = serverImage(seed + 1000);
    Registration hreg = ep.registerMemory(hostIm.bytes.data(), bytes, MemoryKind::Host, layout);
    writeFile(metaPath, reg.metadata());
    writeFile(hostMetaPath, hreg.metadata());
    ready.pass();
    if (!done.wait(120000)) return false;
    Image want = serverImage(seed);
    want.copyBlock(clientImage(), 0, 7);  // the client pushed its block 0 into block 7
    std::string diff = firstDifference(dev.read(), want.bytes);
    if (!diff.empty()) std::fprintf(stderr, "GPU server after the push: %s\n", diff.c_str());
    return diff.empty();
  });
  pid_t client = spawn([&] {
    if (!ready.wait(60000)) return false;
    const int device = kvtest::arena::gpuCount() > 1 ? 1 : 0;
    if (!kvtest::arena::useDevice(MemoryKind::Cuda, device)) return false;
    Endpoint ep = Endpoint::create(local("gpu-client"));
    Image im = clientImage();
    DeviceCopy dev(im);
    Registration reg = ep.registerMemory(dev.p, bytes, MemoryKind::Cuda, layout, device);
    std::vector<int64_t> src{2, 3, 4, -1, 6}, dst{1, 2, 3, 4, 5};
    // One host: Auto maps the server's cudaMalloc memory (legacy IPC) and the copy runs on the GPU.
    Transfer tr = ep.read(reg, ep.connect(readFile(metaPath)), src.data(), dst.data(), 5);
    FetchStatus s = tr.wait(60000);
    bool ok = s.state == FetchState::Done && tr.transport() == FetchTransportKind::Peer;
    if (!ok) std::fprintf(stderr, "GPU read (%s): %s\n", fetchTransportName(tr.transport()), s.error.c_str());
    Image want = clientImage(), srv = serverImage(seed);
    for (size_t i = 0; i < 5; ++i)
      if (src[i] >= 0) want.copyBlock(srv, src[i], dst[i]);
    std::string diff = firstDifference(dev.read(), want.bytes);
    if (!diff.empty()) std::fprintf(stderr, "GPU client after the read: %s\n", diff.c_str());
    ok = ok && diff.empty();
    // The same pairs over TCP (staged through pinned host memory) land the same bytes.
    TransferOptions tcp;
    tcp.via = TransferVia::Tcp;
    Transfer viaTcp = ep.read(reg, ep.connect(readFile(metaPath)), src.data(), dst.data(), 5, tcp);
    FetchStatus st = viaTcp.wait(60000);
    if (st.state != FetchState::Done || viaTcp.transport() != FetchTransportKind::Tcp)
      std::fprintf(stderr, "GPU read over TCP: %s\n", st.error.c_str());
    ok = ok && st.state == FetchState::Done && firstDifference(dev.read(), want.bytes).empty();
    std::vector<int64_t> from{0}, to{7};
    FetchStatus w = ep.write(reg, ep.connect(readFile(metaPath)), to.data(), from.data(), 1).wait(60000);
    if (w.state != FetchState::Done) std::fprintf(stderr, "GPU write: %s\n", w.error.c_str());
    ok = ok && w.state == FetchState::Done;
    // A host-memory server's blocks into GPU slots.
    std::vector<int64_t> hs{0, 1}, hd{6, 7};
    FetchStatus h = ep.read(reg, ep.connect(readFile(hostMetaPath)), hs.data(), hd.data(), 2).wait(60000);
    ok = ok && h.state == FetchState::Done;
    Image hsrv = serverImage(seed + 1000);
    for (size_t i = 0; i < 2; ++i) want.copyBlock(hsrv, hs[i], hd[i]);
    diff = firstDifference(dev.read(), want.bytes);
    if (!diff.empty()) std::fprintf(stderr, "GPU client after the host read: %s\n", diff.c_str());
    done.pass();
    return ok && diff.empty();
  });
  EXPECT_EQ(reap(client, 180), 0);
  EXPECT_EQ(reap(server, 180), 0);
  std::remove(metaPath.c_str());
  std::remove(hostMetaPath.c_str());
#endif
}

TEST(EndpointCuda, VmmArenaMappedOnOneHostAndDeviceIdsCapturedInAGraphReplayedWithNewIds) {
  if (kvtest::arena::gpuCount() == 0) GTEST_SKIP() << kvtest::arena::noGpuReason();
#ifdef KVCOMM_HAVE_CUDA
  KvLayout layout = splitKv(64u << 10, 32);
  const uint64_t seed = testSeed() ^ 0x96a9;
  const std::string metaPath = tempPath("vmm");
  Gate ready, replayed, unregistered, finished;
  auto serverImage = [&](size_t n) {
    Image im(layout, n, seed + 11);
    for (size_t r = 0; r < 2; ++r)
      for (int64_t b = 0; b < 32; ++b) im.put(r, b, seed * 3 + static_cast<uint64_t>(b));
    return im;
  };
  pid_t server = spawn([&] {
    if (!kvtest::arena::useDevice(MemoryKind::Cuda, 0)) return false;
    Endpoint ep = Endpoint::create(local("vmm-server"));
    ArenaOptions ao;
    ao.kind = MemoryKind::Cuda;
    Arena arena = Arena::create(layout, ao);  // VMM memory, exportable as POSIX fds
    Image im = serverImage(arena.bytes());
    arena.write(0, im.bytes.data(), im.bytes.size());
    Registration reg = ep.registerArena(arena);
    writeFile(metaPath, reg.metadata());
    ready.pass();
    if (!replayed.wait(120000)) return false;
    // The client pushed its block 1 into block 30 (writeDevice).
    Image want = serverImage(arena.bytes());
    Image pushed(layout, arena.bytes(), seed + 12);
    pushed.put(0, 1, seed * 8);
    pushed.put(1, 1, seed * 9);
    want.copyBlock(pushed, 1, 30);
    std::vector<uint8_t> got(arena.bytes());
    arena.read(0, got.data(), got.size());
    std::string diff = firstDifference(got, want.bytes);
    if (!diff.empty()) std::fprintf(stderr, "VMM server after writeDevice: %s\n", diff.c_str());
    ep.unregister(reg);  // returns once the client stopped its runs and unmapped
    unregistered.pass();
    return diff.empty() && finished.wait(120000);
  });
  pid_t client = spawn([&] {
    if (!ready.wait(60000)) return false;
    if (!kvtest::arena::useDevice(MemoryKind::Cuda, 0)) return false;
    Endpoint ep = Endpoint::create(local("vmm-client"));
    const size_t n = extent(layout);
    Image im(layout, n, seed + 12);
    im.put(0, 1, seed * 8);
    im.put(1, 1, seed * 9);
    DeviceCopy dev(im);
    Registration reg = ep.registerMemory(dev.p, n, MemoryKind::Cuda, layout, 0);
    RemoteMemory r = ep.connect(readFile(metaPath));
    int64_t* ids = nullptr;  // [0, 4): remote ids, [4, 8): local ids
    cudaStream_t stream;
    if (cudaMalloc(reinterpret_cast<void**>(&ids), 8 * sizeof(int64_t)) != cudaSuccess ||
        cudaStreamCreate(&stream) != cudaSuccess)
      return false;
    auto setIds = [&](std::vector<int64_t> v) {
      return cudaMemcpy(ids, v.data(), v.size() * sizeof(int64_t), cudaMemcpyHostToDevice) == cudaSuccess;
    };
    // Capture once; replay with the ids the arrays hold at launch.
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    bool ok = setIds({0, 0, 0, 0, -1, -1, -1, -1});
    // The first call maps the peer (not capturable: refused inside a capture); count 0 does only that.
    ok = ok && cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) == cudaSuccess;
    const std::string early = thrown([&] { ep.readDevice(reg, r, {ids, ids + 4, 4}, stream); });
    cudaGraph_t aborted = nullptr;
    cudaStreamEndCapture(stream, &aborted);
    if (aborted) cudaGraphDestroy(aborted);
    cudaGetLastError();
    if (early.find("before capturing") == std::string::npos) std::fprintf(stderr, "capture first: %s\n", early.c_str());
    ok = ok && early.find("before capturing") != std::string::npos;
    ep.readDevice(reg, r, {ids, ids + 4, 0}, stream);
    ok = ok && cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) == cudaSuccess;
    ep.readDevice(reg, r, {ids, ids + 4, 4}, stream);
    ok = ok && cudaStreamEndCapture(stream, &graph) == cudaSuccess &&
         cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess;
    Image want = im;
    const Image srv = serverImage(n);
    for (int round = 0; round < 3 && ok; ++round) {
      std::vector<int64_t> rem = {3 + round, 10 + round, -1, 31 - round}, loc = {5, 6 + round, 7, 20 + round};
      ok = setIds({rem[0], rem[1], rem[2], rem[3], loc[0], loc[1], loc[2], loc[3]}) &&
           cudaGraphLaunch(exec, stream) == cudaSuccess && cudaStreamSynchronize(stream) == cudaSuccess;
      for (size_t i = 0; i < 4; ++i)
        if (rem[i] >= 0) want.copyBlock(srv, rem[i], loc[i]);
      std::string diff = firstDifference(dev.read(), want.bytes);
      if (!diff.empty()) std::fprintf(stderr, "graph replay %d: %s\n", round, diff.c_str());
      ok = ok && diff.empty() && ep.pollError(reg, r).kind == DeviceErrorKind::None;
    }
    // A bad id copies nothing and is recorded.
    ok = ok && setIds({99, -1, -1, -1, 9, -1, -1, -1}) && cudaGraphLaunch(exec, stream) == cudaSuccess &&
         cudaStreamSynchronize(stream) == cudaSuccess;
    DeviceError e = ep.pollError(reg, r);
    ok = ok && e.kind == DeviceErrorKind::BlockOutOfRange && firstDifference(dev.read(), want.bytes).empty();
    if (e.kind != DeviceErrorKind::BlockOutOfRange) std::fprintf(stderr, "bad id not recorded\n");
    // Push block 1 into the server's block 30, stream-ordered; then a polled read through the same mapping.
    ok = ok && setIds({30, -1, -1, -1, 1, -1, -1, -1});
    ep.writeDevice(reg, r, {ids, ids + 4, 1}, stream);
    ok = ok && cudaStreamSynchronize(stream) == cudaSuccess;
    std::vector<int64_t> ps{12}, pd{13};
    Transfer t = ep.read(reg, r, ps.data(), pd.data(), 1);
    ok = ok && t.transport() == FetchTransportKind::Peer && t.wait(60000).state == FetchState::Done;
    want.copyBlock(srv, 12, 13);
    ok = ok && firstDifference(dev.read(), want.bytes).empty();
    replayed.pass();
    // The server unregisters: its unregister returned only after this endpoint stopped and unmapped, so a replay
    // now copies nothing and records the failure.
    ok = ok && unregistered.wait(60000);
    ok = ok && setIds({4, -1, -1, -1, 25, -1, -1, -1}) && cudaGraphLaunch(exec, stream) == cudaSuccess &&
         cudaStreamSynchronize(stream) == cudaSuccess;
    const bool refused = ep.pollError(reg, r).kind == DeviceErrorKind::BlockOutOfRange;
    if (!refused) std::fprintf(stderr, "a replay after the owner's unregister was not refused\n");
    std::string diff = firstDifference(dev.read(), want.bytes);
    if (!diff.empty()) std::fprintf(stderr, "after the owner's unregister: %s\n", diff.c_str());
    finished.pass();
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
    cudaFree(ids);
    return ok && refused && diff.empty();
  });
  EXPECT_EQ(reap(client, 180), 0);
  EXPECT_EQ(reap(server, 180), 0);
  std::remove(metaPath.c_str());
#endif
}

}  // namespace
