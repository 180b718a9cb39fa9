// Converted reads between endpoints that meet through metadata: prefill "ranks" (one endpoint each, their caches
// laid out as that TP rank's) and decode ranks with another TP size, block size and order. Every byte of each decode
// rank's memory (gaps, untouched blocks, skipped tokens, guard bytes) against the model oracle of
// support/kv_model.hpp, over TCP (plain memory) and the same-host peer path (arenas); a source that fails leaves
// the decode memory as it was; bad descriptions are refused before anything moves.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#ifdef KVCOMM_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#include "arena/harness.hpp"
#include "kvcomm/arena.hpp"
#include "kvcomm/converted_read.hpp"
#include "kvcomm/endpoint.hpp"
#include "kvcomm/error.hpp"
#include "support/kv_model.hpp"

namespace {

using namespace kvcomm;
using kvtest::kPoison;
using kvtest::Model;
using kvtest::Side;

constexpr uint64_t kTokens = 3 * 64 + 21;

// A prefill rank: its endpoint and its cache, registered as plain memory (TCP) or as an arena (memfd: peer path).
struct Prefill {  // destroyed in reverse: the endpoint (it unregisters) before the arena and the memory
  Side side;
  Arena arena;
  Endpoint ep;
  Registration reg;
};

// An endpoint listening on the loopback, named as peers' errors will name it.
Endpoint loopbackEndpoint(const std::string& name) {
  EndpointOptions o;
  o.name = name;
  o.tcpAddress = "127.0.0.1:0";
  return Endpoint::create(o);
}

std::unique_ptr<Prefill> prefill(Model m, uint32_t tp, uint32_t rank, uint32_t tpb, KvOrder order, bool arena,
                                 uint64_t seed) {
  auto p = std::make_unique<Prefill>();
  std::mt19937_64 rng(seed);
  p->side = kvtest::makeSide(m, tp, rank, tpb, order, (kTokens + tpb - 1) / tpb, rng);
  p->ep = loopbackEndpoint("prefill-" + std::to_string(rank));
  if (arena) {
    ArenaOptions ao;
    ao.kind = MemoryKind::Host;
    p->arena = Arena::create(p->side.layout, ao);
    p->reg = p->ep.registerArena(p->arena);
  } else {
    p->reg = p->ep.registerMemory(p->side.mem.data(), p->side.mem.size(), MemoryKind::Host, p->side.layout);
  }
  return p;
}

// Lays the model's tokens into every prefill cache (the arena's memory when there is one), one block table for all.
void fill(std::vector<std::unique_ptr<Prefill>>& ranks, const std::vector<int64_t>& table) {
  for (auto& p : ranks) {
    p->side.table = table;
    kvtest::lay(p->side, 0, kTokens);
    if (p->arena.valid())  // the arena holds the layout's extent (rounded up); the guard bytes past it stay here
      std::memcpy(p->arena.data(), p->side.mem.data(), std::min(p->arena.bytes(), p->side.mem.size()));
  }
}

struct Decode {
  Side side;
  Endpoint ep;
  Registration reg;
};

std::unique_ptr<Decode> decode(Model m, uint32_t tp, uint32_t rank, uint32_t tpb, KvOrder order, uint64_t seed) {
  auto d = std::make_unique<Decode>();
  std::mt19937_64 rng(seed);
  d->side = kvtest::makeSide(m, tp, rank, tpb, order, (kTokens + tpb - 1) / tpb, rng);
  d->ep = loopbackEndpoint("decode-" + std::to_string(rank));
  d->reg = d->ep.registerMemory(d->side.mem.data(), d->side.mem.size(), MemoryKind::Host, d->side.layout);
  return d;
}

std::vector<ConvertedSource> sourcesOf(Decode& d, const std::vector<std::unique_ptr<Prefill>>& ranks) {
  std::vector<ConvertedSource> out;
  for (const auto& p : ranks) out.push_back({d.ep.connect(p->reg.metadata()), p->side.desc});
  return out;
}

struct Conv {
  Model model;
  uint32_t tpSrc, tpDst, bsSrc, bsDst;
  KvOrder oSrc, oDst;
  bool arenas;
  TransferVia via;
};

void run(const Conv& c, uint64_t seed) {
  std::vector<std::unique_ptr<Prefill>> ranks;
  for (uint32_t r = 0; r < c.tpSrc; ++r) ranks.push_back(prefill(c.model, c.tpSrc, r, c.bsSrc, c.oSrc, c.arenas, seed));
  std::vector<int64_t> table = ranks[0]->side.table;
  table[1] = -1;  // a block the prefill side does not have
  fill(ranks, table);
  for (uint32_t d = 0; d < c.tpDst; ++d) {
    auto dec = decode(c.model, c.tpDst, d, c.bsDst, c.oDst, seed * 7 + d);
    dec->side.table[dec->side.table.size() - 2] = -1;  // a block the decode side skips
    const uint64_t first = 5;
    ConvertedReadOptions o;
    o.via = c.via;
    o.conversion.preferredSource = static_cast<int32_t>(d % c.tpSrc);
    o.timeoutMs = 60000;
    ConvertedReadResult r = readConverted(dec->ep, dec->reg, dec->side.desc, sourcesOf(*dec, ranks),
                                          {table, dec->side.table, first, kTokens - first}, o);
    ASSERT_EQ(r.status.state, FetchState::Done) << r.status.error;
    EXPECT_GT(r.bytesConverted, 0u);
    if (c.arenas && c.via != TransferVia::Tcp) {  // same host, shareable: straight out of the mappings
      EXPECT_EQ(r.sourcesMapped, r.sourcesRead);
      EXPECT_EQ(r.bytesLanded, 0u);
    } else {
      EXPECT_TRUE(r.sourcesMapped.empty());
      EXPECT_GE(r.bytesLanded, r.bytesConverted);
    }
    Side want = dec->side;
    std::fill(want.mem.begin(), want.mem.end(), kPoison);
    kvtest::lay(want, first, kTokens, &table, c.bsSrc);
    for (size_t i = 0; i < want.mem.size(); ++i)
      ASSERT_EQ(dec->side.mem[i], want.mem[i])
          << "decode rank " << d << ", byte " << i << " (" << r.pieces << " pieces from sources "
          << ::testing::PrintToString(r.sourcesRead) << ")";
    if (c.model == Model::Mla) {
      EXPECT_EQ(r.sourcesRead, std::vector<int32_t>{static_cast<int32_t>(d % c.tpSrc)});
    }
  }
}

TEST(ConvertedRead, Tp2ToTp1OverTcpBlockSizeAndOrderConverted) {
  run({Model::Gqa8, 2, 1, 16, 64, KvOrder::TokensHeadsDim, KvOrder::HeadsTokensDim, false, TransferVia::Tcp}, 1);
}

TEST(ConvertedRead, Tp1ToTp2OverThePeerPath) {
  run({Model::Gqa8, 1, 2, 64, 16, KvOrder::HeadsTokensDim, KvOrder::TokensHeadsDim, true, TransferVia::Peer}, 2);
}

TEST(ConvertedRead, Tp8WithFourHeadsToTp2Auto) {
  run({Model::Gqa4, 8, 2, 32, 32, KvOrder::TokensHeadsDim, KvOrder::TokensHeadsDim, true, TransferVia::Auto}, 3);
}

TEST(ConvertedRead, ReplicatedMlaIsReadFromThePreferredSourceOnly) {
  run({Model::Mla, 2, 2, 64, 16, KvOrder::TokensHeadsDim, KvOrder::TokensHeadsDim, false, TransferVia::Tcp}, 4);
}

// Block sizes neither of which divides the other (48 and 32 tokens): planned and copied as pieces, not runs.
TEST(ConvertedRead, BlockSizesThatDoNotDivideEachOther) {
  run({Model::Gqa8, 2, 1, 48, 32, KvOrder::TokensHeadsDim, KvOrder::HeadsTokensDim, true, TransferVia::Auto}, 7);
  run({Model::Gqa8, 2, 1, 48, 32, KvOrder::TokensHeadsDim, KvOrder::HeadsTokensDim, false, TransferVia::Tcp}, 8);
}

TEST(ConvertedRead, Fp8WithScalesTp4ToTp1) {
  run({Model::Fp8Scales, 4, 1, 16, 32, KvOrder::HeadsTokensDim, KvOrder::HeadsTokensDim, false, TransferVia::Tcp}, 5);
}

// A source whose registration was revoked: the read fails naming it, and the decode memory is as it was.
TEST(ConvertedRead, AFailingSourceLeavesTheLocalMemoryUntouched) {
  std::vector<std::unique_ptr<Prefill>> ranks;
  for (uint32_t r = 0; r < 2; ++r)
    ranks.push_back(prefill(Model::Gqa8, 2, r, 16, KvOrder::TokensHeadsDim, false, 10 + r));
  fill(ranks, ranks[0]->side.table);
  auto dec = decode(Model::Gqa8, 1, 0, 32, KvOrder::TokensHeadsDim, 12);
  auto sources = sourcesOf(*dec, ranks);
  ranks[1]->reg.revoke();
  const std::vector<uint8_t> before = dec->side.mem;
  ConvertedReadOptions o;
  o.timeoutMs = 30000;
  ConvertedReadResult r =
      readConverted(dec->ep, dec->reg, dec->side.desc, sources, {ranks[0]->side.table, dec->side.table, 0, 100}, o);
  EXPECT_EQ(r.status.state, FetchState::Failed);
  EXPECT_NE(r.status.error.find("source 1 (prefill-1)"), std::string::npos) << r.status.error;
  EXPECT_FALSE(r.status.failedBlocks.empty());
  EXPECT_EQ(dec->side.mem, before);
}

// What the plan refuses is refused before anything moves; an empty handle too.
TEST(ConvertedRead, RefusalsBeforeAnythingMoves) {
  std::vector<std::unique_ptr<Prefill>> ranks;
  ranks.push_back(prefill(Model::Gqa8, 1, 0, 16, KvOrder::TokensHeadsDim, false, 20));
  fill(ranks, ranks[0]->side.table);
  auto dec = decode(Model::Gqa8, 1, 0, 16, KvOrder::TokensHeadsDim, 21);
  const std::vector<uint8_t> before = dec->side.mem;
  auto sources = sourcesOf(*dec, ranks);
  sources[0].contents.regions[0].elementBytes = 1;  // does not describe the remote layout any more
  sources[0].contents.regions[0].headDim = 8;
  try {
    readConverted(dec->ep, dec->reg, dec->side.desc, sources, {ranks[0]->side.table, dec->side.table, 0, 64});
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidArgument);
    EXPECT_NE(std::string(e.what()).find("elements of 1 bytes on the source, 2 on the destination"), std::string::npos)
        << e.what();
  }
  sources = sourcesOf(*dec, ranks);
  std::vector<int64_t> shortTable(2, 0);
  EXPECT_THROW(readConverted(dec->ep, dec->reg, dec->side.desc, sources, {shortTable, dec->side.table, 0, 64}), Error);
  EXPECT_THROW(readConverted(dec->ep, Registration(), dec->side.desc, sources, {shortTable, dec->side.table, 0, 64}),
               Error);
  EXPECT_EQ(dec->side.mem, before);
}

// Contents registered with the memory travel in its metadata: a converted read needs none passed, a registration whose
// contents do not describe its layout is refused, contents given that differ from the registered ones are refused,
// and a side described nowhere is named. Metadata without contents still reads as version 1; with them it needs 2.
TEST(ConvertedRead, ContentsRegisteredTravelInTheMetadata) {
  std::vector<std::unique_ptr<Prefill>> ranks;
  for (uint32_t r = 0; r < 2; ++r)
    ranks.push_back(prefill(Model::Gqa8, 2, r, 16, KvOrder::TokensHeadsDim, false, 50 + r));
  fill(ranks, ranks[0]->side.table);
  auto minVersion = [](const std::vector<uint8_t>& m) { return m[6] | (m[7] << 8); };  // the head's minVersion
  EXPECT_EQ(minVersion(ranks[0]->reg.metadata()), 1);
  // Re-register each source with its contents.
  for (auto& p : ranks) {
    p->ep.unregister(p->reg);
    RegisterOptions o;
    o.contents = p->side.desc;
    p->reg = p->ep.registerMemory(p->side.mem.data(), p->side.mem.size(), MemoryKind::Host, p->side.layout, -1, o);
    EXPECT_EQ(minVersion(p->reg.metadata()), 2);
  }
  auto dec = decode(Model::Gqa8, 1, 0, 32, KvOrder::HeadsTokensDim, 53);
  {
    RegisterOptions o;
    o.contents = dec->side.desc;
    dec->ep.unregister(dec->reg);
    dec->reg =
        dec->ep.registerMemory(dec->side.mem.data(), dec->side.mem.size(), MemoryKind::Host, dec->side.layout, -1, o);
  }
  std::vector<ConvertedSource> bare;
  for (const auto& p : ranks) {
    RemoteMemory r = dec->ep.connect(p->reg.metadata());
    ASSERT_EQ(r.contents().regions.size(), p->side.desc.regions.size());
    EXPECT_EQ(r.contents().regions[0].headBegin, p->side.desc.regions[0].headBegin);
    bare.push_back({r, KvDescription{}});
  }
  const std::vector<int64_t>& table = ranks[0]->side.table;
  ConvertedReadResult r = readConverted(dec->ep, dec->reg, KvDescription{}, bare, {table, dec->side.table, 0, kTokens});
  ASSERT_EQ(r.status.state, FetchState::Done) << r.status.error;
  Side want = dec->side;
  std::fill(want.mem.begin(), want.mem.end(), kPoison);
  kvtest::lay(want, 0, kTokens, &table, 16);
  EXPECT_EQ(dec->side.mem, want.mem);
  // Given contents that differ from the registered ones: refused, naming the source.
  std::vector<ConvertedSource> wrong = bare;
  wrong[1].contents = ranks[0]->side.desc;  // rank 0's heads for rank 1
  try {
    (void)readConverted(dec->ep, dec->reg, KvDescription{}, wrong, {table, dec->side.table, 0, kTokens});
    ADD_FAILURE() << "differing contents were not refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("source 1 (prefill-1): the contents given differ"), std::string::npos)
        << e.what();
  }
  // Contents that do not describe the layout: the registration is refused.
  RegisterOptions bad;
  bad.contents = ranks[0]->side.desc;
  bad.contents.regions[0].headDim *= 2;
  std::vector<uint8_t> spare(ranks[0]->side.mem.size());
  try {
    (void)ranks[0]->ep.registerMemory(spare.data(), spare.size(), MemoryKind::Host, ranks[0]->side.layout, -1, bad);
    ADD_FAILURE() << "contents that do not describe the layout were registered";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("region 0"), std::string::npos) << e.what();
  }
  // A side described nowhere.
  auto plain = decode(Model::Gqa8, 1, 0, 32, KvOrder::HeadsTokensDim, 54);
  std::vector<ConvertedSource> fromPlain;
  for (const auto& p : ranks) fromPlain.push_back({plain->ep.connect(p->reg.metadata()), KvDescription{}});
  try {
    (void)readConverted(plain->ep, plain->reg, KvDescription{}, fromPlain, {table, plain->side.table, 0, 16});
    ADD_FAILURE() << "an undescribed local registration was not refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the local registration: no contents given"), std::string::npos) << e.what();
  }
}

}  // namespace

namespace {

// A reader keeps its landing areas between reads (over TCP: the sources land): the second read of the same shape
// allocates nothing more, a read needing more blocks grows them, and every read is byte-exact. Read over Auto, the
// same-host sources are mapped and nothing lands.
TEST(ConvertedRead, AReaderKeepsItsLandingAreasBetweenReads) {
  std::vector<std::unique_ptr<Prefill>> ranks;
  for (uint32_t r = 0; r < 2; ++r)
    ranks.push_back(prefill(Model::Gqa8, 2, r, 16, KvOrder::TokensHeadsDim, true, 30 + r));
  fill(ranks, ranks[0]->side.table);
  const std::vector<int64_t> table = ranks[0]->side.table;
  auto dec = decode(Model::Gqa8, 1, 0, 32, KvOrder::HeadsTokensDim, 33);
  ConvertedReader reader(dec->ep);
  EXPECT_EQ(reader.landingBytes(), 0u);
  uint64_t held = 0;
  ConvertedReadOptions tcp;
  tcp.via = TransferVia::Tcp;
  for (auto [first, count] : std::vector<std::pair<uint64_t, uint64_t>>{{0, 64}, {64, 64}, {0, kTokens}}) {
    std::fill(dec->side.mem.begin(), dec->side.mem.end(), kPoison);
    ConvertedReadResult r =
        reader.read(dec->reg, dec->side.desc, sourcesOf(*dec, ranks), {table, dec->side.table, first, count}, tcp);
    ASSERT_EQ(r.status.state, FetchState::Done) << r.status.error;
    Side want = dec->side;
    std::fill(want.mem.begin(), want.mem.end(), kPoison);
    kvtest::lay(want, first, first + count, &table, 16);
    ASSERT_EQ(dec->side.mem, want.mem) << "tokens [" << first << ", +" << count << ")";
    if (first == 64) {
      EXPECT_EQ(reader.landingBytes(), held);  // the same shape: nothing allocated
    }
    EXPECT_GE(reader.landingBytes(), held);
    held = reader.landingBytes();
    EXPECT_GT(held, 0u);
  }
  {
    std::fill(dec->side.mem.begin(), dec->side.mem.end(), kPoison);
    ConvertedReadResult r =
        reader.read(dec->reg, dec->side.desc, sourcesOf(*dec, ranks), {table, dec->side.table, 0, kTokens});
    ASSERT_EQ(r.status.state, FetchState::Done) << r.status.error;
    EXPECT_EQ(r.sourcesMapped, (std::vector<int32_t>{0, 1}));
    EXPECT_EQ(r.bytesLanded, 0u);
    EXPECT_EQ(reader.landingBytes(), held);
    Side want = dec->side;
    std::fill(want.mem.begin(), want.mem.end(), kPoison);
    kvtest::lay(want, 0, kTokens, &table, 16);
    ASSERT_EQ(dec->side.mem, want.mem) << "read through the mappings";
  }
  // A replicated region read from source 1 over a few tokens, then from source 0 over all of them: source 1's
  // landing area from the first read (fewer blocks) plays no part in the second.
  std::vector<std::unique_ptr<Prefill>> mla;
  for (uint32_t r = 0; r < 2; ++r) mla.push_back(prefill(Model::Mla, 2, r, 16, KvOrder::TokensHeadsDim, false, 40 + r));
  fill(mla, mla[0]->side.table);
  auto mdec = decode(Model::Mla, 1, 0, 32, KvOrder::TokensHeadsDim, 43);
  ConvertedReader mreader(mdec->ep);
  for (auto [preferred, count] : std::vector<std::pair<int32_t, uint64_t>>{{1, 40}, {0, kTokens}}) {
    std::fill(mdec->side.mem.begin(), mdec->side.mem.end(), kPoison);
    ConvertedReadOptions o;
    o.conversion.preferredSource = preferred;
    ConvertedReadResult r = mreader.read(mdec->reg, mdec->side.desc, sourcesOf(*mdec, mla),
                                         {mla[0]->side.table, mdec->side.table, 0, count}, o);
    ASSERT_EQ(r.status.state, FetchState::Done) << r.status.error;
    EXPECT_EQ(r.sourcesRead, std::vector<int32_t>{preferred});
    Side want = mdec->side;
    std::fill(want.mem.begin(), want.mem.end(), kPoison);
    kvtest::lay(want, 0, count, &mla[0]->side.table, 16);
    ASSERT_EQ(mdec->side.mem, want.mem) << "preferred source " << preferred;
  }
  ConvertedReader moved = std::move(reader);
  EXPECT_EQ(moved.landingBytes(), held);
  EXPECT_THROW((void)reader.landingBytes(), Error);  // NOLINT(bugprone-use-after-move): refused, not undefined
}

}  // namespace

namespace {

// Prefill and decode as separate process sets that meet only through metadata files: 8 prefill processes (TP 8,
// 16-token NHD blocks, each one KV head; caches registered described, as host arenas) and 2 decode processes (TP 2,
// 64-token HND blocks, four heads each) that pass no contents (the metadata carries them). Decode rank 0 reads through
// the same-host mappings, rank 1 over TCP; every byte of both decode caches against the oracle.
TEST(ConvertedRead, Tp8PrefillProcessesIntoTp2DecodeProcesses) {
  constexpr uint32_t kPrefill = 8, kDecode = 2;
  const uint64_t seed = 91, first = 3;
  std::vector<std::string> meta;
  for (uint32_t r = 0; r < kPrefill; ++r) meta.push_back(kvtest::arena::tempPath("tp8-prefill"));
  auto prefillSide = [&](uint32_t r) {
    std::mt19937_64 rng(seed + r);
    return kvtest::makeSide(Model::Gqa8, kPrefill, r, 16, KvOrder::TokensHeadsDim, (kTokens + 15) / 16, rng);
  };
  std::vector<int64_t> table = prefillSide(0).table;
  table[2] = -1;  // a block the prefill side does not have
  std::vector<kvtest::arena::Gate> ready(kPrefill), done(kPrefill);
  std::vector<pid_t> pids;
  for (uint32_t r = 0; r < kPrefill; ++r)
    pids.push_back(kvtest::arena::spawn([&, r] {
      Side side = prefillSide(r);
      side.table = table;
      kvtest::lay(side, 0, kTokens);
      Endpoint ep = loopbackEndpoint("prefill-" + std::to_string(r));
      ArenaOptions ao;
      ao.kind = MemoryKind::Host;
      Arena arena = Arena::create(side.layout, ao);
      arena.write(0, side.mem.data(), std::min(arena.bytes(), side.mem.size()));
      RegisterOptions o;
      o.contents = side.desc;
      Registration reg = ep.registerArena(arena, o);
      kvtest::arena::writeFile(meta[r], reg.metadata());
      for (uint32_t d = 0; d < kDecode; ++d) ready[r].pass();  // one pass lets one waiter through
      const bool ok = done[r].wait(120000);
      ep.close();
      return ok;
    }));
  for (uint32_t d = 0; d < kDecode; ++d)
    pids.push_back(kvtest::arena::spawn([&, d] {
      for (auto& g : ready)
        if (!g.wait(60000)) return false;
      std::mt19937_64 rng(seed * 7 + d);
      Side side = kvtest::makeSide(Model::Gqa8, kDecode, d, 64, KvOrder::HeadsTokensDim, (kTokens + 63) / 64, rng);
      Endpoint ep = loopbackEndpoint("decode-" + std::to_string(d));
      RegisterOptions o;
      o.contents = side.desc;
      Registration reg = ep.registerMemory(side.mem.data(), side.mem.size(), MemoryKind::Host, side.layout, -1, o);
      std::vector<ConvertedSource> sources;
      for (const std::string& m : meta) sources.push_back({ep.connect(kvtest::arena::readFile(m)), KvDescription{}});
      ConvertedReadOptions ro;
      ro.via = d == 0 ? TransferVia::Auto : TransferVia::Tcp;
      ro.timeoutMs = 60000;
      ConvertedReadResult r =
          readConverted(ep, reg, KvDescription{}, sources, {table, side.table, first, kTokens - first}, ro);
      Side want = side;
      std::fill(want.mem.begin(), want.mem.end(), kPoison);
      kvtest::lay(want, first, kTokens, &table, 16);
      size_t bad = 0;
      for (size_t i = 0; i < want.mem.size(); ++i) bad += side.mem[i] != want.mem[i];
      const std::vector<int32_t> four = d == 0 ? std::vector<int32_t>{0, 1, 2, 3} : std::vector<int32_t>{4, 5, 6, 7};
      const bool ok = r.status.state == FetchState::Done && bad == 0 && r.sourcesRead == four &&
                      r.sourcesMapped == (d == 0 ? four : std::vector<int32_t>{});
      if (!ok)
        std::fprintf(stderr, "decode %u: state %d (%s), %zu bytes differ, %zu sources read, %zu mapped\n", d,
                     static_cast<int>(r.status.state), r.status.error.c_str(), bad, r.sourcesRead.size(),
                     r.sourcesMapped.size());
      ep.close();
      return ok;
    }));
  for (uint32_t d = 0; d < kDecode; ++d) EXPECT_EQ(kvtest::arena::reap(pids[kPrefill + d], 180), 0) << "decode " << d;
  for (auto& g : done) g.pass();
  for (uint32_t r = 0; r < kPrefill; ++r) EXPECT_EQ(kvtest::arena::reap(pids[r], 60), 0) << "prefill " << r;
  for (const std::string& m : meta) std::remove(m.c_str());
}

}  // namespace

namespace {

// ---- CUDA: in processes (the test process stays free of CUDA) -------------------------------------------------------

// Prefill TP 2 (NHD, 16-token blocks) into decode TP 1 (HND, 64-token blocks) in GPU memory. Source 0 holds cudaMalloc
// memory (one host, one kind: read through its mapping, converted by the kernel as it copies), source 1 host memory
// (another kind: its blocks land in device memory over TCP first, then the same kernel). Every byte of the decode
// memory (guard bytes, untouched and skipped blocks) against the oracle; then every source over TCP through a reader,
// twice; then source 0 revoked: the read fails naming it and the GPU memory is as it was.
TEST(ConvertedReadCuda, PrefillTp2IntoDecodeGpuMemoryThroughAMappingAndALandingArea) {
  if (kvtest::arena::gpuCount() == 0) GTEST_SKIP() << kvtest::arena::noGpuReason();
#ifdef KVCOMM_HAVE_CUDA
  using kvtest::arena::Gate;
  const uint64_t seed = 61, first = 5;
  const std::string meta[2] = {kvtest::arena::tempPath("conv-src0"), kvtest::arena::tempPath("conv-src1")};
  Gate ready[2], revoke, revoked, done[2];
  auto prefillSide = [&](uint32_t r) {
    std::mt19937_64 rng(seed + r);
    return kvtest::makeSide(Model::Gqa8, 2, r, 16, KvOrder::TokensHeadsDim, (kTokens + 15) / 16, rng);
  };
  std::vector<int64_t> table = prefillSide(0).table;  // one block table for both sources
  table[1] = -1;                                      // a block the prefill side does not have
  std::vector<pid_t> pids;
  for (uint32_t r = 0; r < 2; ++r)
    pids.push_back(kvtest::arena::spawn([&, r] {
      const MemoryKind kind = r == 0 ? MemoryKind::Cuda : MemoryKind::Host;
      if (!kvtest::arena::useDevice(kind, 0)) return false;
      Side side = prefillSide(r);
      side.table = table;
      kvtest::lay(side, 0, kTokens);
      Endpoint ep = loopbackEndpoint("prefill-" + std::to_string(r));
      void* dev = nullptr;
      Registration reg;
      if (kind == MemoryKind::Cuda) {
        if (cudaMalloc(&dev, side.mem.size()) != cudaSuccess ||
            cudaMemcpy(dev, side.mem.data(), side.mem.size(), cudaMemcpyHostToDevice) != cudaSuccess)
          return false;
        reg = ep.registerMemory(dev, side.mem.size(), kind, side.layout, 0);
      } else {
        reg = ep.registerMemory(side.mem.data(), side.mem.size(), kind, side.layout);
      }
      kvtest::arena::writeFile(meta[r], reg.metadata());
      ready[r].pass();
      if (r == 0) {
        if (!revoke.wait(120000)) return false;
        reg.revoke();  // returns once the decode side unmapped it
        revoked.pass();
      }
      const bool ok = done[r].wait(120000);
      ep.close();
      if (dev) cudaFree(dev);
      return ok;
    }));
  pids.push_back(kvtest::arena::spawn([&] {
    if (!ready[0].wait(60000) || !ready[1].wait(60000)) return false;
    if (!kvtest::arena::useDevice(MemoryKind::Cuda, 0)) return false;
    std::mt19937_64 rng(seed + 10);
    Side d = kvtest::makeSide(Model::Gqa8, 1, 0, 64, KvOrder::HeadsTokensDim, (kTokens + 63) / 64, rng);
    d.table[d.table.size() - 2] = -1;  // a block the decode side skips
    const size_t n = d.mem.size();
    void* dev = nullptr;
    if (cudaMalloc(&dev, n) != cudaSuccess) return false;
    auto poison = [&] { return cudaMemset(dev, kPoison, n) == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess; };
    auto readBack = [&] {
      std::vector<uint8_t> v(n);
      if (cudaMemcpy(v.data(), dev, n, cudaMemcpyDeviceToHost) != cudaSuccess) v.clear();
      return v;
    };
    Endpoint ep = loopbackEndpoint("decode");
    Registration reg = ep.registerMemory(dev, n, MemoryKind::Cuda, d.layout, 0);
    std::vector<ConvertedSource> sources;
    for (uint32_t r = 0; r < 2; ++r)
      sources.push_back({ep.connect(kvtest::arena::readFile(meta[r])), prefillSide(r).desc});
    Side want = d;
    std::fill(want.mem.begin(), want.mem.end(), kPoison);
    kvtest::lay(want, first, kTokens, &table, 16);
    const KvTokenRange tokens{table, d.table, first, kTokens - first};
    bool ok = true;
    auto check = [&](const char* what, const ConvertedReadResult& r, const std::vector<int32_t>& mapped) {
      bool good = r.status.state == FetchState::Done && r.sourcesRead == std::vector<int32_t>{0, 1} &&
                  r.sourcesMapped == mapped && (r.bytesLanded > 0) == (mapped.size() < 2);
      if (!good)
        std::fprintf(stderr, "%s: state %d (%s), %zu mapped, %llu bytes landed\n", what,
                     static_cast<int>(r.status.state), r.status.error.c_str(), r.sourcesMapped.size(),
                     static_cast<unsigned long long>(r.bytesLanded));
      std::vector<uint8_t> got = readBack();
      size_t bad = 0;
      for (size_t i = 0; i < n && i < got.size(); ++i) bad += got[i] != want.mem[i];
      if (bad || got.size() != n) std::fprintf(stderr, "%s: %zu bytes differ from the oracle\n", what, bad);
      ok = ok && good && bad == 0 && got.size() == n;
    };
    ConvertedReadOptions o;
    o.timeoutMs = 60000;
    if (!poison()) return false;
    check("auto (source 0 mapped, source 1 landed)", readConverted(ep, reg, d.desc, sources, tokens, o), {0});
    ConvertedReader reader(ep);
    ConvertedReadOptions tcp = o;
    tcp.via = TransferVia::Tcp;
    for (int round = 0; round < 2; ++round) {
      if (!poison()) return false;
      check("tcp through a reader (both landed)", reader.read(reg, d.desc, sources, tokens, tcp), {});
    }
    revoke.pass();
    if (!revoked.wait(60000)) return false;
    const std::vector<uint8_t> before = readBack();
    ConvertedReadResult r = readConverted(ep, reg, d.desc, sources, tokens, o);
    const bool named =
        r.status.state == FetchState::Failed && r.status.error.find("source 0 (prefill-0)") != std::string::npos;
    if (!named)
      std::fprintf(stderr, "after the revoke: state %d (%s)\n", static_cast<int>(r.status.state),
                   r.status.error.c_str());
    const bool untouched = readBack() == before;
    if (!untouched) std::fprintf(stderr, "after the revoke: the GPU memory changed\n");
    done[0].pass();
    done[1].pass();
    ep.close();
    cudaFree(dev);
    return ok && named && untouched;
  }));
  for (pid_t p : pids) EXPECT_EQ(kvtest::arena::reap(p, 180), 0);
  for (const std::string& m : meta) std::remove(m.c_str());
#endif
}

}  // namespace
