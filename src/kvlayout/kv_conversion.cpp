// Conversion plans: for a token range, the contiguous copies from each source that rebuild the destination's blocks
// in its own order, block size and head split. Pure (no memory is touched) apart from applyConversion.
//
// Phase 1 checks everything (descriptions, convertibility, block tables, ids, duplicate destinations) and picks the
// source of every destination head. Phase 2 walks the tokens in segments that stay inside one source block and one
// destination block, and emits per region and per run of heads from one source: one copy for the whole segment when
// the run is each side's whole token row (both tokens-major), else one copy per token (both tokens-major: a token's
// heads are contiguous), one per head (a head's tokens contiguous on both sides), or one per head and token; each
// copy merged into the previous one of its source when they continue. The work is in the copies made, not in the
// tokens.
#include "kvcomm/kv_conversion.hpp"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "common/check.hpp"
#include "kvlayout/conversion_runs.hpp"
#include "kvlayout/kv_layout.hpp"

namespace kvcomm {

namespace {

constexpr const char* kCall = "planConversion";

bool holds(const KvContents& c, uint32_t head) {
  return head >= c.headBegin && head < headEndOf(c);
}

// Byte offset, inside a block, of (token slot, head) of a side holding heads from c.headBegin.
uint64_t inBlock(const KvContents& c, uint64_t slot, uint32_t head) {
  const uint64_t held = headEndOf(c) - c.headBegin;
  const uint64_t h = head - c.headBegin;
  const uint64_t unit = uint64_t{c.headDim} * c.elementBytes;
  return c.order == KvOrder::TokensHeadsDim ? (slot * held + h) * unit : (h * c.tokensPerBlock + slot) * unit;
}

// Bytes between token slots t and t + 1 of one head inside a block.
uint64_t tokenStride(const KvContents& c) {
  const uint64_t unit = uint64_t{c.headDim} * c.elementBytes;
  return c.order == KvOrder::TokensHeadsDim ? (headEndOf(c) - c.headBegin) * unit : unit;
}

uint64_t blockBase(const KvRegion& r, int64_t block) {
  return r.offset + static_cast<uint64_t>(block) * (r.blockStride ? r.blockStride : r.blockBytes);
}

void append(std::vector<KvPiece>& out, uint64_t src, uint64_t dst, uint64_t bytes) {
  if (!out.empty()) {
    KvPiece& last = out.back();
    if (last.srcOffset + last.bytes == src && last.dstOffset + last.bytes == dst) {
      last.bytes += bytes;
      return;
    }
  }
  out.push_back({src, dst, bytes});
}

// Throws unless every entry of `table` needed for tokens [first, end) is -1 or a block id of every region.
void checkTable(const std::vector<int64_t>& table, const char* name, uint64_t tpb, uint64_t first, uint64_t end,
                const KvLayout& layout, const std::string& side) {
  const uint64_t need = (end + tpb - 1) / tpb;
  KVCOMM_CHECK_ARG(table.size() >= need, kCall, name, " has ", table.size(), " entries but tokens [", first, ", ", end,
                   ") at ", tpb, " tokens per block need ", need);
  size_t smallest = 0;  // an id must be inside every region: inside the one with the fewest blocks
  for (size_t r = 1; r < layout.regions.size(); ++r)
    if (layout.regions[r].numBlocks < layout.regions[smallest].numBlocks) smallest = r;
  const uint64_t limit = layout.regions.empty() ? 0 : layout.regions[smallest].numBlocks;
  for (uint64_t i = first / tpb; i < need; ++i) {
    const int64_t b = table[i];
    if (b == -1) continue;
    KVCOMM_CHECK_ARG(b >= 0 && static_cast<uint64_t>(b) < limit, kCall, name, "[", i, "] = ", b, " is outside [0, ",
                     limit, ") of ", side, " region ", smallest, " (-1 skips a block)");
  }
}

// Phase 1: every check, and the source of every destination head (none picked when there are no tokens).
void checkAndPick(const std::vector<KvConversionSource>& sources, const KvLayout& dstLayout, const KvDescription& dst,
                  const KvTokenRange& tokens, const KvConversionOptions& options,
                  std::vector<std::vector<int32_t>>& headSource, uint64_t* sTOut, uint64_t* dTOut) {
  KVCOMM_CHECK_ARG(!sources.empty(), kCall, "no sources");
  KVCOMM_CHECK_ARG(options.preferredSource >= 0 && static_cast<size_t>(options.preferredSource) < sources.size(), kCall,
                   "preferredSource ", options.preferredSource, " is not a source index (", sources.size(),
                   " sources)");
  checkDescription(dstLayout, dst, "planConversion (the destination)");
  for (size_t s = 0; s < sources.size(); ++s) {
    checkDescription(sources[s].layout, sources[s].description, detail::cat("planConversion (source ", s, ")").c_str());
    const std::string why = whyNotConvertible(sources[s].description, dst);
    KVCOMM_CHECK_ARG(why.empty(), kCall, "source ", s, " cannot be converted into the destination: ", why);
  }
  KVCOMM_CHECK_ARG(tokens.numTokens <= (uint64_t{1} << 48) && tokens.firstToken <= (uint64_t{1} << 48), kCall,
                   "tokens [", tokens.firstToken, ", +", tokens.numTokens, ") is not a plausible range");
  const uint64_t first = tokens.firstToken, end = first + tokens.numTokens;
  const uint64_t dT = dst.regions.empty() ? 1 : dst.regions[0].tokensPerBlock;
  const uint64_t sT = sources[0].description.regions.empty() ? 1 : sources[0].description.regions[0].tokensPerBlock;
  for (size_t s = 1; s < sources.size(); ++s)
    KVCOMM_CHECK_ARG(sources[s].description.regions.empty() || sources[s].description.regions[0].tokensPerBlock == sT,
                     kCall, "source ", s, " has ", sources[s].description.regions[0].tokensPerBlock,
                     " tokens per block, source 0 has ", sT,
                     ": the sources share one block table (srcBlocks), so their blocks must agree");
  headSource.assign(dst.regions.size(), {});
  *sTOut = sT, *dTOut = dT;
  if (tokens.numTokens == 0) return;
  checkTable(tokens.dstBlocks, "dstBlocks", dT, first, end, dstLayout, "the destination's");
  for (size_t s = 0; s < sources.size(); ++s)
    checkTable(tokens.srcBlocks, "srcBlocks", sT, first, end, sources[s].layout, detail::cat("source ", s, "'s"));
  {
    // Two entries naming one block: sorted (block, index) pairs, the repeat earliest in table order reported (as a
    // scan would find it); no node per block.
    std::vector<std::pair<int64_t, uint64_t>> ids;
    for (uint64_t i = first / dT; i < (end + dT - 1) / dT; ++i)
      if (tokens.dstBlocks[i] >= 0) ids.emplace_back(tokens.dstBlocks[i], i);
    if (!std::is_sorted(ids.begin(), ids.end())) std::sort(ids.begin(), ids.end());
    const std::pair<int64_t, uint64_t>* firstOf = nullptr;
    uint64_t repeat = UINT64_MAX;
    for (size_t k = 1; k < ids.size(); ++k)
      if (ids[k].first == ids[k - 1].first) {  // a block's first repeat: ids[k - 1] is its first entry
        if (ids[k].second < repeat) repeat = ids[k].second, firstOf = &ids[k - 1];
        while (k + 1 < ids.size() && ids[k + 1].first == ids[k].first) ++k;  // its later repeats
      }
    KVCOMM_CHECK_ARG(firstOf == nullptr, kCall, "dstBlocks[", firstOf ? firstOf->second : 0, "] and dstBlocks[", repeat,
                     "] both name block ", firstOf ? firstOf->first : 0, ": two token ranges would land in one block");
  }
  for (size_t r = 0; r < dst.regions.size(); ++r) {
    const KvContents& d = dst.regions[r];
    for (uint32_t h = d.headBegin; h < headEndOf(d); ++h) {
      int32_t pick = -1;
      if (holds(sources[options.preferredSource].description.regions[r], h)) pick = options.preferredSource;
      for (size_t s = 0; pick < 0 && s < sources.size(); ++s)
        if (holds(sources[s].description.regions[r], h)) pick = static_cast<int32_t>(s);
      KVCOMM_CHECK_ARG(pick >= 0, kCall, "region ", r, ": head ", h, " of the destination is held by no source");
      headSource[r].push_back(pick);
    }
  }
}

}  // namespace

KvConversionPlan planConversion(const std::vector<KvConversionSource>& sources, const KvLayout& dstLayout,
                                const KvDescription& dst, const KvTokenRange& tokens,
                                const KvConversionOptions& options) {
  KvConversionPlan plan;
  plan.pieces.resize(sources.size());
  uint64_t sT = 1, dT = 1;
  checkAndPick(sources, dstLayout, dst, tokens, options, plan.headSource, &sT, &dT);
  if (tokens.numTokens == 0) return plan;

  // ---- phase 2: copies, region by region, segment by segment (one source block, one destination block) ----
  for (size_t r = 0; r < dst.regions.size(); ++r) {
    const KvContents& dc = dst.regions[r];
    const std::vector<int32_t>& from = plan.headSource[r];
    const uint64_t unit = uint64_t{dc.headDim} * dc.elementBytes;
    detail::forEachSegment(tokens, sT, dT, [&](uint64_t t0, uint64_t t1, int64_t sb, int64_t db) {
      if (sb < 0 || db < 0) return;
      const uint64_t dBase = blockBase(dstLayout.regions[r], db);
      // Runs of destination heads [h0, h1) that come from one source.
      for (size_t i0 = 0; i0 < from.size();) {
        size_t i1 = i0 + 1;
        while (i1 < from.size() && from[i1] == from[i0]) ++i1;
        const int32_t s = from[i0];
        const KvContents& sc = sources[s].description.regions[r];
        const uint64_t sBase = blockBase(sources[s].layout.regions[r], sb);
        const uint32_t h0 = dc.headBegin + static_cast<uint32_t>(i0), h1 = dc.headBegin + static_cast<uint32_t>(i1);
        std::vector<KvPiece>& out = plan.pieces[s];
        // Bytes between consecutive tokens of one head on each side: `unit` where a head's tokens are contiguous.
        const uint64_t sStep = tokenStride(sc), dStep = tokenStride(dc), run = (h1 - h0) * unit;
        if (sc.order == KvOrder::TokensHeadsDim && dc.order == KvOrder::TokensHeadsDim) {
          if (sStep == run && dStep == run)  // the heads run is each side's whole token row: one copy
            append(out, sBase + inBlock(sc, t0 % sT, h0), dBase + inBlock(dc, t0 % dT, h0), (t1 - t0) * run);
          else
            for (uint64_t t = t0; t < t1; ++t)
              append(out, sBase + inBlock(sc, t % sT, h0), dBase + inBlock(dc, t % dT, h0), run);
        } else if (sStep == unit && dStep == unit) {  // a head's tokens contiguous on both sides: one copy per head
          for (uint32_t h = h0; h < h1; ++h)
            append(out, sBase + inBlock(sc, t0 % sT, h), dBase + inBlock(dc, t0 % dT, h), (t1 - t0) * unit);
        } else {
          for (uint32_t h = h0; h < h1; ++h)
            for (uint64_t t = t0; t < t1; ++t)
              append(out, sBase + inBlock(sc, t % sT, h), dBase + inBlock(dc, t % dT, h), unit);
        }
        plan.bytes += (t1 - t0) * (h1 - h0) * unit;
        i0 = i1;
      }
    });
  }
  return plan;
}

void applyConversion(const std::vector<KvPiece>& pieces, const void* src, uint64_t srcBytes, void* dst,
                     uint64_t dstBytes) {
  for (size_t i = 0; i < pieces.size(); ++i) {
    const KvPiece& p = pieces[i];
    KVCOMM_CHECK_ARG(p.bytes <= srcBytes && p.srcOffset <= srcBytes - p.bytes && p.bytes <= dstBytes &&
                         p.dstOffset <= dstBytes - p.bytes,
                     "applyConversion", "piece ", i, " (", p.bytes, " bytes from ", p.srcOffset, " to ", p.dstOffset,
                     ") does not fit the source (", srcBytes, " bytes) and the destination (", dstBytes, " bytes)");
  }
  for (const KvPiece& p : pieces)
    std::memcpy(static_cast<uint8_t*>(dst) + p.dstOffset, static_cast<const uint8_t*>(src) + p.srcOffset, p.bytes);
}

namespace detail {

KvRunPlan planConversionRuns(const std::vector<KvConversionSource>& sources, const KvLayout& dstLayout,
                             const KvDescription& dst, const KvTokenRange& tokens, const KvConversionOptions& options) {
  KvRunPlan plan;
  checkAndPick(sources, dstLayout, dst, tokens, options, plan.headSource, &plan.sT, &plan.dT);
  plan.used.assign(sources.size(), false);
  if (tokens.numTokens == 0) return plan;
  const uint64_t sT = plan.sT, dT = plan.dT;
  plan.segmented = std::max(sT, dT) % std::min(sT, dT) == 0;
  // Tokens whose blocks both tables name (the rest are skipped), segment by segment.
  uint64_t moved = 0;
  forEachSegment(tokens, sT, dT, [&](uint64_t t0, uint64_t t1, int64_t sb, int64_t db) {
    if (sb >= 0 && db >= 0) moved += t1 - t0;
  });
  for (size_t r = 0; r < dst.regions.size(); ++r) {
    const KvContents& dc = dst.regions[r];
    const std::vector<int32_t>& from = plan.headSource[r];
    const uint64_t unit = uint64_t{dc.headDim} * dc.elementBytes;
    plan.bytes += moved * from.size() * unit;
    for (size_t i0 = 0; i0 < from.size();) {
      size_t i1 = i0 + 1;
      while (i1 < from.size() && from[i1] == from[i0]) ++i1;
      const KvContents& sc = sources[from[i0]].description.regions[r];
      const uint32_t h0 = dc.headBegin + static_cast<uint32_t>(i0);
      KvRunSpec run;
      run.source = static_cast<uint32_t>(from[i0]);
      run.region = static_cast<uint32_t>(r);
      run.heads = static_cast<uint32_t>(i1 - i0);
      run.unit = unit;
      run.srcHead0 = inBlock(sc, 0, h0);
      run.dstHead0 = inBlock(dc, 0, h0);
      run.srcTok = tokenStride(sc);
      run.dstTok = tokenStride(dc);
      run.srcHead = sc.order == KvOrder::TokensHeadsDim ? unit : uint64_t{sc.tokensPerBlock} * unit;
      run.dstHead = dc.order == KvOrder::TokensHeadsDim ? unit : uint64_t{dc.tokensPerBlock} * unit;
      if (sc.order == KvOrder::TokensHeadsDim && dc.order == KvOrder::TokensHeadsDim)
        run.mode = 0;
      else if (run.srcTok == unit && run.dstTok == unit)
        run.mode = 1;
      else
        run.mode = 2;
      if (moved > 0) plan.used[run.source] = true;
      if (plan.segmented) plan.runs.push_back(run);
      i0 = i1;
    }
  }
  return plan;
}

}  // namespace detail

}  // namespace kvcomm
