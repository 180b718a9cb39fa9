// A conversion plan as runs instead of pieces: per region, the runs of destination heads that come from one source,
// with where a (token slot, head) lies inside a block on each side. What moves is then computed segment by segment
// where the copy runs (kernels/convert_launch.hpp), so the host's work does not grow with the tokens.
#pragma once

#include <cstdint>
#include <vector>

#include "kvcomm/kv_conversion.hpp"

namespace kvcomm::detail {

/// Destination heads [h0, h0 + heads) of region `region`, all from source `source`. Offsets inside a block.
struct KvRunSpec {
  uint32_t source = 0;
  uint32_t region = 0;
  uint32_t heads = 0;
  int32_t mode = 0;  // ConvertMode: 0 a row per token, 1 a row per head, 2 a row per head and token
  uint64_t srcHead0 = 0, dstHead0 = 0;
  uint64_t srcTok = 0, dstTok = 0;    // bytes between token slots of one head
  uint64_t srcHead = 0, dstHead = 0;  // bytes between heads of one slot
  uint64_t unit = 0;                  // bytes of one head of one token
};

struct KvRunPlan {
  std::vector<KvRunSpec> runs;
  std::vector<std::vector<int32_t>> headSource;  ///< as KvConversionPlan's
  uint64_t sT = 1, dT = 1;                       ///< tokens per block of the sources and of the destination
  bool segmented = false;  ///< one block size divides the other (else runs are empty: use planConversion's pieces)
  uint64_t bytes = 0;      ///< bytes the copy moves
  std::vector<bool> used;  ///< by source: supplies a head (and a token range with both ids set)
};

/// Calls fn(t0, t1, srcBlock, dstBlock) for each span [t0, t1) of tokens [first, end) that lies in one block of
/// each side (sT and dT tokens per block): srcBlock and dstBlock are the entries of the two tables (-1 included).
/// Counters, not a division per span: the host's loops over a read's blocks.
template <typename Fn>
void forEachSegment(const KvTokenRange& tokens, uint64_t sT, uint64_t dT, Fn&& fn) {
  const uint64_t end = tokens.firstToken + tokens.numTokens;
  uint64_t t0 = tokens.firstToken, si = t0 / sT, di = t0 / dT, sEnd = (si + 1) * sT, dEnd = (di + 1) * dT;
  while (t0 < end) {
    const uint64_t t1 = sEnd < dEnd ? (sEnd < end ? sEnd : end) : (dEnd < end ? dEnd : end);
    fn(t0, t1, tokens.srcBlocks[si], tokens.dstBlocks[di]);
    t0 = t1;
    if (t0 == sEnd) ++si, sEnd += sT;
    if (t0 == dEnd) ++di, dEnd += dT;
  }
}

/// Checks exactly what planConversion checks (the same errors) and describes the conversion of `tokens` as runs.
KvRunPlan planConversionRuns(const std::vector<KvConversionSource>& sources, const KvLayout& dstLayout,
                             const KvDescription& dst, const KvTokenRange& tokens, const KvConversionOptions& options);

}  // namespace kvcomm::detail
