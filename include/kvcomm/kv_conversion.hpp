// kvcomm: converting a KV cache's contents in flight -- which bytes of which source land where in a destination
// described differently (kv_contents.hpp): another TP split, block size or token/head order. A plan is a list of
// contiguous copies per source; transports move them, and the conversion needs no staging pass and no second kernel.
#pragma once

#include <cstdint>
#include <vector>

#include "kvcomm/api.hpp"
#include "kvcomm/kv_contents.hpp"
#include "kvcomm/kv_layout.hpp"

namespace kvcomm {

/// One contiguous copy: `bytes` bytes from `srcOffset` of the source's memory to `dstOffset` of the destination's
/// (offsets from each memory's base, as KvRegion offsets are).
struct KvPiece {
  uint64_t srcOffset = 0;
  uint64_t dstOffset = 0;
  uint64_t bytes = 0;
};

/// A source of a conversion: a member whose cache the destination reads from (a prefill TP rank, a KV server).
struct KvConversionSource {
  KvLayout layout;
  KvDescription description;
};

/// The tokens to move, named by both sides' block tables. Requests are in tokens, not blocks, because the two sides'
/// block sizes may differ (a prefill block of 64 tokens is four decode blocks of 16), so neither side's block ids
/// alone name the tokens, and engines keep one block table per request on each side. Token t (firstToken <= t <
/// firstToken + numTokens) is in block srcBlocks[t / tokensPerBlock] of every source and block
/// dstBlocks[t / tokensPerBlock] of the destination (each side with its own tokensPerBlock), at t % tokensPerBlock.
/// A -1 in either table skips that block's tokens (a prefix the destination already has); a partial last block
/// moves only its tokens.
struct KvTokenRange {
  std::vector<int64_t> srcBlocks;
  std::vector<int64_t> dstBlocks;
  uint64_t firstToken = 0;
  uint64_t numTokens = 0;
};

struct KvConversionOptions {
  /// A head several sources hold (a replicated region; GQA heads duplicated over TP ranks) comes from this source
  /// when it holds it, else from the first source that does: the caller puts the nearest one here.
  int32_t preferredSource = 0;
};

/// What moves where: per source, the copies (coalesced: a copy continuing the previous one on both sides extends
/// it), and which source supplies each head the destination holds.
struct KvConversionPlan {
  std::vector<std::vector<KvPiece>> pieces;      ///< by source, in the order given
  std::vector<std::vector<int32_t>> headSource;  ///< by destination region, by held head (headBegin + i)
  uint64_t bytes = 0;                            ///< all pieces together
  size_t count() const {
    size_t n = 0;
    for (const auto& p : pieces) n += p.size();
    return n;
  }
};

/// Plans the conversion of `tokens` from `sources` into the destination (`dstLayout` described by `dst`). Throws
/// InvalidArgumentError, naming what is wrong, before anything is planned: a description that does not describe its
/// layout (checkDescription), a source that cannot be converted (whyNotConvertible, naming the source), a destination
/// head no source holds, a block table too short for the tokens, a block id outside its region (naming the table,
/// the index and the source), two table entries naming the same destination block.
KVCOMM_API KvConversionPlan planConversion(const std::vector<KvConversionSource>& sources, const KvLayout& dstLayout,
                                           const KvDescription& dst, const KvTokenRange& tokens,
                                           const KvConversionOptions& options = {});

/// Copies `pieces` from `src` (srcBytes long) into `dst` (dstBytes long) in host memory, each piece checked against
/// both sizes first (InvalidArgumentError naming the piece; nothing copied). What a host transport does with a plan.
KVCOMM_API void applyConversion(const std::vector<KvPiece>& pieces, const void* src, uint64_t srcBytes, void* dst,
                                uint64_t dstBytes);

}  // namespace kvcomm
