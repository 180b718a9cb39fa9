// Conversion plans against an independent oracle: a model-level KV tensor (regions x tokens x heads x bytes, a hash
// of its coordinates) is laid into each rank's cache under that rank's layout -- a block as a row-major array whose
// dimension order is the layout's, at the block id its block table gives -- for every prefill TP rank (the sources)
// and every decode TP rank (poisoned destinations). Each decode rank plans the conversion from all prefill ranks
// and applies it; then every byte of its memory (gaps between blocks, untouched blocks, skipped tokens, guard bytes
// after the last region) must equal the same oracle's image of the tokens that moved over a poisoned buffer.
//
// The matrix: TP 1/2/4/8 -> 1/2/4/8, block sizes 16/32/64/128 both ways, tokens-major <-> heads-major, four models
// (GQA with 8 KV heads, K and V regions of two layers; GQA with 4 KV heads, so TP 8 duplicates heads; MLA's replicated
// latent; FP8 keys with a per-head scale side-buffer), a partial last block, -1 skips in both tables, a first token
// past 0: 4,096 cases, every one in CI (a few seconds).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "endpoint/convert_program.hpp"
#include "kernels/launch.hpp"
#include "kvcomm/error.hpp"
#include "kvcomm/kv_conversion.hpp"
#include "support/kv_model.hpp"

namespace kvcomm {
namespace {

using kvtest::kPoison;
using kvtest::lay;
using kvtest::makeSide;
using kvtest::Model;
using kvtest::modelName;
using kvtest::modelRegions;
using kvtest::Side;

struct Case {
  Model model;
  uint32_t tpSrc, tpDst, bsSrc, bsDst;
  KvOrder oSrc, oDst;
};

std::string caseName(const Case& c) {
  return std::string(modelName(c.model)) + "_tp" + std::to_string(c.tpSrc) + "to" + std::to_string(c.tpDst) + "_bs" +
         std::to_string(c.bsSrc) + "to" + std::to_string(c.bsDst) +
         (c.oSrc == KvOrder::TokensHeadsDim ? "_nhd" : "_hnd") +
         (c.oDst == KvOrder::TokensHeadsDim ? "_to_nhd" : "_to_hnd");
}

// Runs one case; returns the bytes moved (every decode rank together), fails the test on the first wrong byte.
uint64_t runCase(const Case& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const uint64_t tokens = 3 * 128 + 37;                       // a partial last block at every block size
  const uint64_t first = seed % 3 == 0 ? 0 : 1 + rng() % 40;  // a prefix the decode side computed itself
  std::vector<Side> src;
  for (uint32_t r = 0; r < c.tpSrc; ++r) {
    std::mt19937_64 own(seed * 31 + r);
    src.push_back(makeSide(c.model, c.tpSrc, r, c.bsSrc, c.oSrc, (tokens + c.bsSrc - 1) / c.bsSrc, own));
  }
  // The sources share one block table (engines give TP ranks the same block ids): rank 0's.
  if (src[0].table.size() > 2) src[0].table[1] = -1;  // a block the prefill side does not have
  for (Side& s : src) {
    s.table = src[0].table;
    lay(s, 0, tokens);
  }
  std::vector<KvConversionSource> sources;
  for (const Side& s : src) sources.push_back({s.layout, s.desc});
  uint64_t moved = 0;
  for (uint32_t d = 0; d < c.tpDst; ++d) {
    std::mt19937_64 own(seed * 77 + d);
    Side dst = makeSide(c.model, c.tpDst, d, c.bsDst, c.oDst, (tokens + c.bsDst - 1) / c.bsDst, own);
    if (dst.table.size() > 3) dst.table[dst.table.size() - 2] = -1;  // a block the decode side skips
    KvTokenRange range{src[0].table, dst.table, first, tokens - first};
    KvConversionOptions opt;
    opt.preferredSource = static_cast<int32_t>(d % c.tpSrc);
    const KvConversionPlan plan = planConversion(sources, dst.layout, dst.desc, range, opt);
    std::vector<uint8_t> viaRuns = dst.mem;  // the same conversion as runs, below
    for (size_t s = 0; s < src.size(); ++s)
      applyConversion(plan.pieces[s], src[s].mem.data(), src[s].mem.size(), dst.mem.data(), dst.mem.size());
    Side want = dst;
    std::fill(want.mem.begin(), want.mem.end(), kPoison);
    lay(want, first, tokens, &src[0].table, c.bsSrc);
    for (size_t i = 0; i < dst.mem.size(); ++i)
      if (dst.mem[i] != want.mem[i]) {
        ADD_FAILURE() << caseName(c) << " decode rank " << d << ": byte " << i << " is " << int(dst.mem[i])
                      << ", the oracle says " << int(want.mem[i]) << " (" << plan.count() << " pieces)";
        return moved;
      }
    // The runs a converted read executes (the CPU executor here, the conversion kernel on a GPU): the same bytes,
    // work items of 64 KiB or (every other case) 1 KiB, so that runs split into many chunks.
    const detail::KvRunPlan runs = detail::planConversionRuns(sources, dst.layout, dst.desc, range, opt);
    EXPECT_TRUE(runs.segmented);
    EXPECT_EQ(runs.bytes, plan.bytes) << caseName(c);
    std::vector<detail::ConvertSource> views;
    for (const Side& s : src) views.push_back({reinterpret_cast<const char*>(s.mem.data()), &s.layout, 0});
    std::vector<int64_t> tables = src[0].table;
    tables.insert(tables.end(), dst.table.begin(), dst.table.end());
    detail::ConvertProgram prog =
        detail::buildConvert(runs, views, dst.layout, reinterpret_cast<char*>(viaRuns.data()), std::move(tables),
                             src[0].table.size(), first, tokens - first, seed % 2 ? 64u << 10 : 1024);
    prog.bind();
    detail::hostConvert(prog.launch);
    for (size_t i = 0; i < viaRuns.size(); ++i)
      if (viaRuns[i] != want.mem[i]) {
        ADD_FAILURE() << caseName(c) << " decode rank " << d << " through runs: byte " << i << " is " << int(viaRuns[i])
                      << ", the oracle says " << int(want.mem[i]) << " (" << prog.runs.size() << " runs, vector "
                      << prog.launch.vec << ")";
        return moved;
      }
    moved += plan.bytes;
  }
  return moved;
}

std::vector<Case> allCases() {
  std::vector<Case> out;
  const uint32_t tps[] = {1, 2, 4, 8}, bss[] = {16, 32, 64, 128};
  const KvOrder orders[] = {KvOrder::TokensHeadsDim, KvOrder::HeadsTokensDim};
  for (Model m : {Model::Gqa8, Model::Gqa4, Model::Mla, Model::Fp8Scales})
    for (uint32_t a : tps)
      for (uint32_t b : tps)
        for (uint32_t x : bss)
          for (uint32_t y : bss)
            for (KvOrder o1 : orders)
              for (KvOrder o2 : orders) out.push_back({m, a, b, x, y, o1, o2});
  return out;
}

TEST(KvConversion, MatrixAgainstTheModelOracle) {
  const std::vector<Case> cases = allCases();
  uint64_t moved = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    moved += runCase(cases[i], 1000 + i);
    if (HasFailure()) break;
  }
  std::printf("[conversion] %zu cases (the whole matrix), %llu bytes moved and checked\n", cases.size(),
              static_cast<unsigned long long>(moved));
}

// ---- refusals: named, before anything is planned -------------------------------------------------------------------

std::string refusal(const std::vector<KvConversionSource>& sources, const Side& dst, const KvTokenRange& range) {
  try {
    planConversion(sources, dst.layout, dst.desc, range);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidArgument) << e.what();
    return e.what();
  }
  return "(accepted)";
}

TEST(KvConversion, RefusalsNameWhatDiffers) {
  std::mt19937_64 rng(5);
  Side a = makeSide(Model::Gqa8, 2, 0, 16, KvOrder::TokensHeadsDim, 4, rng);
  Side b = makeSide(Model::Gqa8, 2, 1, 16, KvOrder::TokensHeadsDim, 4, rng);
  Side d = makeSide(Model::Gqa8, 1, 0, 32, KvOrder::HeadsTokensDim, 2, rng);
  const std::vector<KvConversionSource> both{{a.layout, a.desc}, {b.layout, b.desc}};
  KvTokenRange ok{a.table, d.table, 0, 60};
  EXPECT_EQ(refusal(both, d, ok), "(accepted)");
  // A destination head no source holds (only TP rank 0's half of the heads).
  EXPECT_NE(refusal({{a.layout, a.desc}}, d, ok).find("head 4 of the destination is held by no source"),
            std::string::npos);
  // Element sizes, head dims, head counts that differ; replicated onto split.
  for (auto [field, text] :
       std::vector<std::pair<int, std::string>>{{0, "elements of 2 bytes on the source, 1 on the destination"},
                                                {1, "head dim 4 on the source, 2 on the destination"},
                                                {2, "the model has 8 heads on the source, 16 on the destination"},
                                                {3, "split on the source, replicated on the destination: no rule"}}) {
    Side x = d;
    KvContents& c = x.desc.regions[2];
    if (field == 0) c.elementBytes = 1, c.headDim = 8;
    if (field == 1) c.headDim = 2, c.numHeads = 16, c.headEnd = 16;
    if (field == 2) c.numHeads = 16, c.headEnd = 8;
    if (field == 3) c.replicated = true, c.numHeads = 8, c.headEnd = 8;
    const std::string why = refusal(both, x, ok);
    EXPECT_NE(why.find("region 2"), std::string::npos) << why;
    EXPECT_NE(why.find(text), std::string::npos) << why;
  }
  // Descriptions that do not describe their layouts.
  Side x = d;
  x.desc.regions[1].tokensPerBlock = 16;
  EXPECT_NE(refusal(both, x, ok).find("region 1: a block holds 16 tokens"), std::string::npos);
  x = d;
  x.desc.regions.pop_back();
  EXPECT_NE(refusal(both, x, ok).find("the description has 3 regions but the layout has 4"), std::string::npos);
  x = d;
  x.desc.regions[0].headBegin = 8;
  EXPECT_NE(refusal(both, x, ok).find("heads [8, 8) are not a non-empty range"), std::string::npos);
  // Block tables: too short, an id out of range, a destination block named twice.
  KvTokenRange bad = ok;
  bad.numTokens = 200;
  EXPECT_NE(refusal(both, d, bad).find("dstBlocks has 2 entries but tokens [0, 200)"), std::string::npos);
  bad = ok;
  bad.srcBlocks[2] = 11;
  EXPECT_NE(refusal(both, d, bad).find("srcBlocks[2] = 11 is outside [0, 11)"), std::string::npos);
  bad = ok;
  bad.dstBlocks[1] = -7;
  EXPECT_NE(refusal(both, d, bad).find("dstBlocks[1] = -7"), std::string::npos);
  bad = ok;
  bad.dstBlocks[1] = bad.dstBlocks[0];
  EXPECT_NE(refusal(both, d, bad).find("dstBlocks[0] and dstBlocks[1] both name block"), std::string::npos);
  {  // Several repeats: the one a scan in table order meets first is named (block 5 at 0 and 2, not block 7 at 1 and 3)
    Side a5 = makeSide(Model::Gqa8, 2, 0, 16, KvOrder::TokensHeadsDim, 5, rng);
    Side b5 = makeSide(Model::Gqa8, 2, 1, 16, KvOrder::TokensHeadsDim, 5, rng);
    Side d5 = makeSide(Model::Gqa8, 1, 0, 16, KvOrder::HeadsTokensDim, 5, rng);
    const std::vector<KvConversionSource> five{{a5.layout, a5.desc}, {b5.layout, b5.desc}};
    KvTokenRange twice{a5.table, {5, 7, 5, 7, 7}, 0, 80};
    EXPECT_NE(refusal(five, d5, twice).find("dstBlocks[0] and dstBlocks[2] both name block 5"), std::string::npos);
    twice.dstBlocks = {9, 7, 3, 7, 9};
    EXPECT_NE(refusal(five, d5, twice).find("dstBlocks[1] and dstBlocks[3] both name block 7"), std::string::npos);
    twice.dstBlocks = {9, 7, 3, 6, 8};
    EXPECT_EQ(refusal(five, d5, twice), "(accepted)");
  }
  // Head counts that do not divide over TP.
  KvContents m = modelRegions(Model::Gqa8)[0];
  EXPECT_THROW(splitForTp(m, 3, 0), Error);
  m.numHeads = 4;
  EXPECT_THROW(splitForTp(m, 6, 0), Error);
  // applyConversion checks every piece before copying any.
  std::vector<uint8_t> s1(64, 1), d1(64, kPoison);
  EXPECT_THROW(applyConversion({{0, 0, 8}, {60, 0, 8}}, s1.data(), s1.size(), d1.data(), d1.size()), Error);
  EXPECT_EQ(d1, std::vector<uint8_t>(64, kPoison));
}

// Same layouts on both sides: one piece per run of consecutive blocks and region (nothing is exploded).
TEST(KvConversion, EqualLayoutsCoalesceIntoBlockRuns) {
  std::mt19937_64 rng(9);
  Side a = makeSide(Model::Gqa8, 1, 0, 16, KvOrder::HeadsTokensDim, 8, rng);
  Side d = a;
  a.table = {0, 1, 2, 3, 7, 8, 9, 10};
  d.table = {4, 5, 6, 7, 0, 1, 2, 3};
  const KvConversionPlan plan = planConversion({{a.layout, a.desc}}, d.layout, d.desc, {a.table, d.table, 0, 128});
  // Regions 0 and 2 have no gap between blocks: 2 runs each; regions 1 and 3 have gaps: 8 pieces each.
  EXPECT_EQ(plan.count(), 2u + 8u + 2u + 8u);
  EXPECT_EQ(plan.bytes, 4u * 128u * 8u * 4u * 2u);
}

}  // namespace
}  // namespace kvcomm
