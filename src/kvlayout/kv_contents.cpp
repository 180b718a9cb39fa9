// KV contents: the checks that a description describes its layout, and that two descriptions can be converted into
// each other (what a conversion plan and a transfer between differently laid-out caches rely on).
#include "kvcomm/kv_contents.hpp"

#include "common/check.hpp"

namespace kvcomm {

namespace {

// tokens x heads x dim x bytes, or 0 when it does not fit 64 bits (never a region's blockBytes).
uint64_t blockBytesOf(const KvContents& c, uint32_t heads) {
  uint64_t v = c.tokensPerBlock;
  for (uint64_t f : {uint64_t{heads}, uint64_t{c.headDim}, uint64_t{c.elementBytes}})
    if (__builtin_mul_overflow(v, f, &v)) return 0;
  return v;
}

}  // namespace

void checkDescription(const KvLayout& layout, const KvDescription& description, const char* call) {
  KVCOMM_CHECK_ARG(description.regions.size() == layout.regions.size(), call, "the description has ",
                   description.regions.size(), " regions but the layout has ", layout.regions.size(),
                   ": one KvContents per region");
  for (size_t i = 0; i < layout.regions.size(); ++i) {
    const KvContents& c = description.regions[i];
    KVCOMM_CHECK_ENUM(c.order, KvOrder::HeadsTokensDim, call, detail::cat("region ", i, ": order").c_str());
    KVCOMM_CHECK_ARG(c.elementBytes > 0 && c.headDim > 0 && c.tokensPerBlock > 0 && c.numHeads > 0, call, "region ", i,
                     ": elementBytes (", c.elementBytes, "), headDim (", c.headDim, "), tokensPerBlock (",
                     c.tokensPerBlock, ") and numHeads (", c.numHeads, ") must all be at least 1");
    const uint32_t end = headEndOf(c);
    KVCOMM_CHECK_ARG(c.headBegin < end && end <= c.numHeads, call, "region ", i, ": heads [", c.headBegin, ", ", end,
                     ") are not a non-empty range of the model's ", c.numHeads);
    KVCOMM_CHECK_ARG(!c.replicated || (c.headBegin == 0 && end == c.numHeads), call, "region ", i,
                     ": replicated, but it holds heads [", c.headBegin, ", ", end, ") of ", c.numHeads,
                     " (a replicated region holds every head)");
    const uint64_t want = blockBytesOf(c, end - c.headBegin);
    KVCOMM_CHECK_ARG(want == layout.regions[i].blockBytes, call, "region ", i, ": a block holds ", c.tokensPerBlock,
                     " tokens x ", end - c.headBegin, " heads x ", c.headDim, " x ", c.elementBytes, " bytes = ", want,
                     " bytes, but the region's blockBytes is ", layout.regions[i].blockBytes);
    KVCOMM_CHECK_ARG(c.tokensPerBlock == description.regions[0].tokensPerBlock, call, "region ", i, " has ",
                     c.tokensPerBlock, " tokens per block, region 0 has ", description.regions[0].tokensPerBlock,
                     ": one block table indexes every region, so they must agree");
  }
}

KvContents splitForTp(const KvContents& model, uint32_t tpSize, uint32_t tpRank) {
  constexpr const char* call = "splitForTp";
  KVCOMM_CHECK_ARG(tpSize > 0 && tpRank < tpSize, call, "TP rank ", tpRank, " of ", tpSize, " is not a rank");
  KVCOMM_CHECK_ARG(model.numHeads > 0, call, "numHeads must be at least 1");
  if (model.replicated) return model;
  KvContents c = model;
  const uint32_t h = model.numHeads;
  if (tpSize <= h) {
    KVCOMM_CHECK_ARG(h % tpSize == 0, call, h, " heads do not divide over TP ", tpSize);
    c.headBegin = tpRank * (h / tpSize);
    c.headEnd = c.headBegin + h / tpSize;
  } else {
    KVCOMM_CHECK_ARG(tpSize % h == 0, call, "TP ", tpSize, " is not a multiple of the ", h,
                     " heads (with more ranks than heads, each head is held by the same number of ranks)");
    c.headBegin = tpRank / (tpSize / h);
    c.headEnd = c.headBegin + 1;
  }
  return c;
}

std::string whyNotConvertible(const KvDescription& src, const KvDescription& dst) {
  if (src.regions.size() != dst.regions.size())
    return detail::cat("the source has ", src.regions.size(), " regions and the destination ", dst.regions.size(),
                       ": a conversion maps region i onto region i");
  for (size_t i = 0; i < src.regions.size(); ++i) {
    const KvContents& s = src.regions[i];
    const KvContents& d = dst.regions[i];
    if (s.elementBytes != d.elementBytes)
      return detail::cat("region ", i, ": elements of ", s.elementBytes, " bytes on the source, ", d.elementBytes,
                         " on the destination (a conversion moves bytes, it does not change a dtype)");
    if (s.headDim != d.headDim)
      return detail::cat("region ", i, ": head dim ", s.headDim, " on the source, ", d.headDim, " on the destination");
    if (s.numHeads != d.numHeads)
      return detail::cat("region ", i, ": the model has ", s.numHeads, " heads on the source, ", d.numHeads,
                         " on the destination");
    if (s.replicated != d.replicated)
      return detail::cat("region ", i, ": ", s.replicated ? "replicated" : "split", " on the source, ",
                         d.replicated ? "replicated" : "split",
                         " on the destination: no rule maps one onto the other (describe both as replicated, or "
                         "both as split with the heads each holds)");
  }
  return "";
}

}  // namespace kvcomm
