#include "verify/publish_oracle.hpp"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>

#include "kvcomm/device/publish.hpp"
#include "verify/memory.hpp"

namespace kvtest {

namespace {
size_t alignUp(size_t x, size_t a) {
  return (x + a - 1) / a * a;
}
}  // namespace

Geometry makeGeometry(CacheLayout layout, size_t rowBytes, size_t slots, size_t base) {
  Geometry g;
  g.slots = slots;
  kvcomm::CacheTensor a, b;
  if (layout == CacheLayout::Flat) {
    a.rowBytes = rowBytes;
    a.offset = base;
    a.blockSize = 1;
    a.blockStride = rowBytes + 8;
    b.rowBytes = 16;
    b.offset = alignUp(base + slots * a.blockStride + 64, 16);
    b.blockSize = 1;
    b.blockStride = 24;
    g.regionBytes = b.offset + slots * 24 + 64;
  } else {
    const size_t bs = 16;
    size_t blockStride = bs * rowBytes + bs * 4 + 32;
    a.rowBytes = rowBytes;
    a.offset = base;
    a.blockSize = bs;
    a.rowStride = rowBytes;
    a.blockStride = blockStride;
    b.rowBytes = 4;
    b.offset = base + bs * rowBytes;
    b.blockSize = bs;
    b.rowStride = 4;
    b.blockStride = blockStride;
    g.regionBytes = base + (slots + bs - 1) / bs * blockStride + 64;
  }
  g.tensors = {a, b};
  return g;
}

Inputs makeInputs(uint64_t seed, int rank, int size, size_t tokens, const Geometry& g, uint64_t salt) {
  Inputs in;
  // The same permutation on every rank; rank r owns entries [r * tokens, (r + 1) * tokens).
  std::vector<int64_t> perm(g.slots);
  std::iota(perm.begin(), perm.end(), 0);
  std::mt19937_64 rng(seed ^ (salt * 0x9E3779B97F4A7C15ull));
  std::shuffle(perm.begin(), perm.end(), rng);
  std::mt19937_64 pad(seed + 7 * static_cast<uint64_t>(rank) + salt);
  for (size_t i = 0; i < tokens; ++i) {
    size_t at = static_cast<size_t>(rank) * tokens + i;
    int64_t s = at < perm.size() ? perm[at] : -1;
    in.slots.push_back(pad() % 8 == 0 ? -1 : s);
  }
  (void)size;
  for (size_t k = 0; k < g.tensors.size(); ++k) {
    size_t stride = g.tensors[k].rowBytes + (k == 1 ? 16 : 0);  // the second tensor's source rows are strided
    in.srcStride.push_back(stride);
    in.rows.push_back(pattern(seed + salt, static_cast<uint64_t>(rank) * 64 + k, std::max<size_t>(1, tokens * stride)));
  }
  return in;
}

void applyOracle(std::vector<uint8_t>& image, const Geometry& g, const Inputs& in) {
  for (size_t i = 0; i < in.slots.size(); ++i) {
    if (in.slots[i] < 0) continue;
    for (size_t k = 0; k < g.tensors.size(); ++k) {
      const auto& t = g.tensors[k];
      size_t rowStride = t.rowStride ? t.rowStride : t.rowBytes;
      uint64_t dst = kvcomm::slotDestination(in.slots[i], t.offset, t.blockSize, t.blockStride, rowStride);
      std::memcpy(image.data() + dst, in.rows[k].data() + i * in.srcStride[k], t.rowBytes);
    }
  }
}

std::vector<int32_t> slots32(const Inputs& in) {
  std::vector<int32_t> out;
  for (int64_t s : in.slots) out.push_back(static_cast<int32_t>(s));
  return out;
}

}  // namespace kvtest
