// kvcomm: what a KV layout's regions hold -- tokens, heads, head dim, element size and order -- beside their bytes
// (kv_layout.hpp). Two caches described this way can be converted into each other in flight (kv_conversion.hpp):
// different TP splits, block sizes, token/head order.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kvcomm/api.hpp"
#include "kvcomm/kv_layout.hpp"

namespace kvcomm {

/// How a block orders its elements: tokens x heads x headDim ("NHD", FlashAttention's) or heads x tokens x headDim
/// ("HND", FlashInfer's and TensorRT-LLM's).
enum class KvOrder { TokensHeadsDim = 0, HeadsTokensDim = 1 };

/// What one region's blocks hold. A block holds `tokensPerBlock` tokens; for each token, the heads
/// [headBegin, headEnd) of the model's `numHeads` (of this region: K heads, V heads, MLA's one latent "head", a
/// scale buffer's one scale per token), each `headDim` elements of `elementBytes` bytes, in `order`. The region's
/// blockBytes must be tokensPerBlock * (headEnd - headBegin) * headDim * elementBytes.
///  - A split region (GQA K or V under TP) holds a range of heads; several ranks may hold the same head (TP 8 with 4
///    KV heads: two ranks per head).
///  - A replicated region (`replicated`: MLA's latent cache, an indexer's keys) holds every head on every rank; a
///    conversion reads it from one source (the caller's preferred one).
///  - Side-buffers (FP8 scales, indexer keys) are regions of their own with their own contents.
/// Element bytes are opaque: a conversion moves them, it never changes a dtype.
struct KvContents {
  uint32_t elementBytes = 0;
  uint32_t headDim = 0;
  uint32_t tokensPerBlock = 0;
  uint32_t numHeads = 1;
  uint32_t headBegin = 0;
  uint32_t headEnd = 0;  ///< 0: numHeads
  KvOrder order = KvOrder::TokensHeadsDim;
  bool replicated = false;
};

/// The end of the heads `c` holds: headEnd, or numHeads when headEnd is 0.
inline uint32_t headEndOf(const KvContents& c) {
  return c.headEnd ? c.headEnd : c.numHeads;
}

/// A layout's contents: one KvContents per region of its KvLayout, in the same order. Every region of one side
/// must have the same tokensPerBlock (one block table indexes them all).
struct KvDescription {
  std::vector<KvContents> regions;
};

/// Throws InvalidArgumentError naming the region and the field unless `description` describes `layout`: one entry
/// per region, every field in range (elementBytes, headDim, tokensPerBlock, numHeads > 0; headBegin < headEnd <=
/// numHeads; a replicated region holds [0, numHeads)), blockBytes equal to what the contents take, one
/// tokensPerBlock for every region.
KVCOMM_API void checkDescription(const KvLayout& layout, const KvDescription& description, const char* call);

/// `model` (the whole model's region: numHeads heads, headBegin/headEnd unset) as TP rank `tpRank` of `tpSize`
/// holds it, the way engines split KV heads: with tpSize <= numHeads, heads [r * n, (r + 1) * n) for n =
/// numHeads / tpSize; with more ranks than heads, head r / (tpSize / numHeads) (each head on tpSize / numHeads
/// ranks). A replicated region is returned as it is. Throws InvalidArgumentError when the counts do not divide.
KVCOMM_API KvContents splitForTp(const KvContents& model, uint32_t tpSize, uint32_t tpRank);

/// Empty when a cache described by `src` can be converted into one described by `dst` (region by region: the same
/// element size, head dim and number of model heads, both replicated or both split; order and tokens per block may
/// differ, and so may the heads each side holds), else one sentence naming the region and what differs.
KVCOMM_API std::string whyNotConvertible(const KvDescription& src, const KvDescription& dst);

}  // namespace kvcomm
