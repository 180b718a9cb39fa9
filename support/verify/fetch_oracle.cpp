#include "verify/fetch_oracle.hpp"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <sstream>

#include "verify/memory.hpp"
#include "verify/publish_oracle.hpp"

namespace kvtest {

kvcomm::KvLayout makeFetchLayout(const FetchCase& c, uint64_t seed, int rank, size_t* extent) {
  // Seeds differ per run; the layout must be identical on every rank that computes it.
  const size_t regions = static_cast<size_t>(c.layers) * (c.split ? 2 : 1);
  std::mt19937_64 rng(seed * 31 + static_cast<uint64_t>(rank) * 1000003);
  // Even ranks pack blocks back to back (runs between them are contiguous: one copy per run); odd ranks leave
  // guard bytes between blocks, a multiple of 16 or of 8 (narrower vectors) depending on the seed.
  const size_t pad = rank % 2 == 0 ? 0 : ((seed & 1) ? 16 : 8) * (1 + rng() % 4);
  const size_t stride = c.blockBytes + pad;
  std::vector<size_t> order(regions);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);  // regions placed in a rank-specific order
  kvcomm::KvLayout l;
  l.regions.resize(regions);
  size_t at = 64 * (1 + rng() % 4);
  for (size_t k = 0; k < regions; ++k) {
    size_t j = order[k];
    l.regions[j] = {at, c.blockBytes, stride, c.numBlocks};
    at += stride * c.numBlocks + 64;  // 64 guard bytes after each region
  }
  l.version = 7;
  *extent = at;
  return l;
}

std::vector<uint8_t> blockContent(uint64_t seed, int rank, size_t region, int64_t block, size_t bytes) {
  return pattern(seed ^ 0xFE7C4, (static_cast<uint64_t>(rank) << 48) ^ (region << 24) ^ static_cast<uint64_t>(block),
                 bytes);
}

kvcomm::KvLayout fillOneRegion(kvcomm::SymmetricBuffer& buf, uint64_t seed, int rank, size_t blockBytes,
                               size_t blocks) {
  kvcomm::KvLayout layout;
  layout.regions.push_back({0, blockBytes, 0, blocks});
  for (size_t b = 0; b < blocks; ++b) {
    auto v = blockContent(seed, rank, 0, static_cast<int64_t>(b), blockBytes);
    std::memcpy(static_cast<char*>(buf.local()) + b * blockBytes, v.data(), blockBytes);
  }
  return layout;
}

std::vector<uint8_t> initialImage(const kvcomm::KvLayout& layout, uint64_t seed, int rank, size_t extent) {
  std::vector<uint8_t> img(extent, kPoison);
  for (size_t j = 0; j < layout.regions.size(); ++j) {
    const kvcomm::KvRegion& r = layout.regions[j];
    for (size_t b = 0; b < r.numBlocks; ++b) {
      auto v = blockContent(seed, rank, j, static_cast<int64_t>(b), r.blockBytes);
      std::memcpy(img.data() + r.offset + b * r.blockStride, v.data(), v.size());
    }
  }
  return img;
}

std::vector<kvcomm::FetchRequest> FetchBatch::requests() const {
  std::vector<kvcomm::FetchRequest> out;
  for (size_t k = 0; k < ranks.size(); ++k) {
    kvcomm::FetchRequest q;
    q.srcRank = ranks[k];
    q.srcBlocks = src[k].data();
    q.dstBlocks = dst[k].data();
    q.count = src[k].size();
    out.push_back(q);
  }
  return out;
}

size_t FetchBatch::pairs() const {
  size_t n = 0;
  for (auto& s : src) n += s.size();
  return n;
}

FetchBatch makeFetchBatch(uint64_t seed, int rank, int size, size_t numBlocks, size_t maxPairs, int sources) {
  std::mt19937_64 rng(seed * 7919 + static_cast<uint64_t>(rank));
  const int64_t half = static_cast<int64_t>(numBlocks / 2);
  std::vector<int64_t> free(static_cast<size_t>(static_cast<int64_t>(numBlocks) - half));
  std::iota(free.begin(), free.end(), half);
  // Destinations: runs of consecutive free blocks taken from a shuffled list of run starts.
  std::vector<int64_t> dsts;
  size_t want = std::min(maxPairs, free.size());
  for (size_t i = 0; i < free.size() && dsts.size() < want;) {
    size_t len = 1 + rng() % 10;
    for (size_t k = 0; k < len && i < free.size() && dsts.size() < want; ++k, ++i) dsts.push_back(free[i]);
    i += rng() % 3;  // gaps
  }
  FetchBatch b;
  int n = std::max(1, std::min(sources, size));
  for (int k = 0; k < n; ++k) b.ranks.push_back((rank + 1 + k) % size);  // wraps to this rank when n == size
  b.src.resize(static_cast<size_t>(n));
  b.dst.resize(static_cast<size_t>(n));
  int64_t s = 0;
  for (size_t i = 0; i < dsts.size(); ++i) {
    size_t k = (i / 8) % static_cast<size_t>(n);  // chunks of 8 pairs per source in turn
    s = rng() % 5 ? (s + 1) % half : static_cast<int64_t>(rng() % static_cast<uint64_t>(half));
    bool pad = rng() % 10 == 0;
    b.src[k].push_back(pad && rng() % 2 ? -1 : s);
    b.dst[k].push_back(pad && b.src[k].back() != -1 ? -1 : dsts[i]);
  }
  return b;
}

void applyFetchOracle(std::vector<uint8_t>& image, const std::vector<kvcomm::KvLayout>& layouts, int rank,
                      uint64_t seed, const FetchBatch& batch) {
  const kvcomm::KvLayout& mine = layouts[static_cast<size_t>(rank)];
  for (size_t k = 0; k < batch.ranks.size(); ++k)
    for (size_t i = 0; i < batch.src[k].size(); ++i) {
      int64_t s = batch.src[k][i], d = batch.dst[k][i];
      if (s == -1 || d == -1) continue;
      for (size_t j = 0; j < mine.regions.size(); ++j) {
        const kvcomm::KvRegion& r = mine.regions[j];
        auto v = blockContent(seed, batch.ranks[k], j, s, r.blockBytes);
        std::memcpy(image.data() + r.offset + static_cast<size_t>(d) * r.blockStride, v.data(), v.size());
      }
    }
}

std::string describeMismatch(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want,
                             const kvcomm::KvLayout& layout) {
  if (got.size() != want.size()) return "sizes differ";
  auto it = std::mismatch(got.begin(), got.end(), want.begin());
  if (it.first == got.end()) return "";
  size_t off = static_cast<size_t>(it.first - got.begin());
  size_t bad = 0;
  for (size_t i = off; i < got.size(); ++i) bad += got[i] != want[i];
  std::ostringstream os;
  os << bad << " bytes differ; first at offset " << off << " (got " << int(got[off]) << ", want " << int(want[off])
     << ")";
  for (size_t j = 0; j < layout.regions.size(); ++j) {
    const kvcomm::KvRegion& r = layout.regions[j];
    if (off >= r.offset && off < r.offset + r.numBlocks * r.blockStride) {
      size_t b = (off - r.offset) / r.blockStride, in = (off - r.offset) % r.blockStride;
      os << ": region " << j << ", block " << b << (in >= r.blockBytes ? " (guard bytes after it)" : "") << ", byte "
         << in;
    }
  }
  return os.str();
}

}  // namespace kvtest
