// The model-level oracle of KV conversions: a model's KV tensor (regions x tokens x heads x bytes, a hash of the
// coordinates) laid into a rank's cache under that rank's layout -- a block as a row-major array whose dimension order
// is the layout's, at the block id its table gives -- independently of the planner. Used by the conversion plan
// tests and the converted-read tests.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "kvcomm/kv_contents.hpp"
#include "kvcomm/kv_layout.hpp"

namespace kvtest {

using kvcomm::KvContents;
using kvcomm::KvDescription;
using kvcomm::KvLayout;
using kvcomm::KvOrder;
using kvcomm::KvRegion;
using kvcomm::splitForTp;

inline constexpr uint8_t kPoison = 0xEE;
inline constexpr uint64_t kGuard = 64;

enum class Model { Gqa8, Gqa4, Mla, Fp8Scales };

inline const char* modelName(Model m) {
  switch (m) {
    case Model::Gqa8:
      return "gqa8";
    case Model::Gqa4:
      return "gqa4";
    case Model::Mla:
      return "mla";
    default:
      return "fp8scales";
  }
}

// The model's regions (heads unsplit), tokensPerBlock and order filled in per side.
inline std::vector<KvContents> modelRegions(Model m) {
  auto gqa = [](uint32_t heads, uint32_t dim, uint32_t bytes) {
    KvContents c;
    c.numHeads = heads;
    c.headDim = dim;
    c.elementBytes = bytes;
    return c;
  };
  switch (m) {
    case Model::Gqa8:
      return {gqa(8, 4, 2), gqa(8, 4, 2), gqa(8, 4, 2), gqa(8, 4, 2)};  // 2 layers x K, V
    case Model::Gqa4:
      return {gqa(4, 6, 2), gqa(4, 6, 2)};
    case Model::Mla: {
      KvContents c = gqa(1, 18, 2);  // latent + rope, one "head"
      c.replicated = true;
      return {c, c};
    }
    default:
      return {gqa(8, 8, 1), gqa(8, 1, 4)};  // FP8 keys, one float scale per token and head
  }
}

// One side's cache: layout, description, block table, memory.
struct Side {
  KvLayout layout;
  KvDescription desc;
  std::vector<int64_t> table;
  std::vector<uint8_t> mem;
};

inline uint8_t modelByte(size_t region, uint64_t token, uint32_t head, uint64_t byte) {
  uint64_t x = (region + 1) * 0x9E3779B97F4A7C15ull ^ (token + 7) * 0xC2B2AE3D27D4EB4Full ^
               (head + 3) * 0x165667B19E3779F9ull ^ (byte + 11) * 0x27D4EB2F165667C5ull;
  x ^= x >> 29;
  return static_cast<uint8_t>(x * 0xBF58476D1CE4E5B9ull >> 56);
}

// A side of TP rank `rank` of `tp` with `tpb` tokens per block in `order`; its block table holds `blocks` distinct
// random ids out of 2 * blocks + 3 (some never used), regions one after another, some with a gap after each block.
inline Side makeSide(Model m, uint32_t tp, uint32_t rank, uint32_t tpb, KvOrder order, size_t blocks,
                     std::mt19937_64& rng) {
  Side s;
  const size_t numBlocks = 2 * blocks + 3;
  uint64_t at = 0;
  size_t r = 0;
  for (KvContents c : modelRegions(m)) {
    c.tokensPerBlock = tpb;
    c.order = order;
    c = splitForTp(c, tp, rank);
    const uint32_t held = (c.headEnd ? c.headEnd : c.numHeads) - c.headBegin;
    KvRegion reg;
    reg.offset = at;
    reg.blockBytes = uint64_t{tpb} * held * c.headDim * c.elementBytes;
    reg.blockStride = reg.blockBytes + (r % 2 ? 32 : 0);
    reg.numBlocks = numBlocks;
    at += reg.blockStride * numBlocks + 16;
    s.layout.regions.push_back(reg);
    s.desc.regions.push_back(c);
    ++r;
  }
  std::vector<int64_t> ids(numBlocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  s.table.assign(ids.begin(), ids.begin() + blocks);
  s.mem.assign(at + kGuard, kPoison);
  return s;
}

// The oracle: writes the model's bytes of tokens [from, to) into `s` (those whose block table entry is not -1 and,
// when `also` is given, whose entry in that other table is not -1 either). A block is a row-major array of shape
// (tokens, heads, bytes) or (heads, tokens, bytes) as the order says.
inline void lay(Side& s, uint64_t from, uint64_t to, const std::vector<int64_t>* also = nullptr, uint32_t alsoTpb = 1) {
  for (size_t r = 0; r < s.layout.regions.size(); ++r) {
    const KvContents& c = s.desc.regions[r];
    const KvRegion& reg = s.layout.regions[r];
    const uint64_t held = (c.headEnd ? c.headEnd : c.numHeads) - c.headBegin,
                   unit = uint64_t{c.headDim} * c.elementBytes;
    uint64_t shape[3] = {c.tokensPerBlock, held, unit};
    if (c.order == KvOrder::HeadsTokensDim) std::swap(shape[0], shape[1]);
    for (uint64_t t = from; t < to; ++t) {
      const int64_t b = s.table[t / c.tokensPerBlock];
      if (b < 0 || (also && (*also)[t / alsoTpb] < 0)) continue;
      for (uint64_t h = 0; h < held; ++h)
        for (uint64_t k = 0; k < unit; ++k) {
          uint64_t coord[3] = {t % c.tokensPerBlock, h, k};
          if (c.order == KvOrder::HeadsTokensDim) std::swap(coord[0], coord[1]);
          const uint64_t flat = (coord[0] * shape[1] + coord[1]) * shape[2] + coord[2];
          s.mem[reg.offset + static_cast<uint64_t>(b) * reg.blockStride + flat] =
              modelByte(r, t, static_cast<uint32_t>(c.headBegin + h), k);
        }
    }
  }
}

}  // namespace kvtest
