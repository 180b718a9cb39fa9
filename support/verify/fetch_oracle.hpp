// Fetch scenarios and their oracle: every rank regenerates every rank's layout and block contents from a shared
// seed and computes, block by block on the host, what its buffer must hold after a batch of fetches.
#pragma once

#include <cstdint>
#include <vector>

#include "kvcomm/fetch.hpp"

namespace kvtest {

/// A layout family: `layers` layers of `blockBytes`-byte blocks, K and V in separate regions when `split`.
struct FetchCase {
  size_t blockBytes;
  int layers;
  bool split;
  size_t numBlocks;
};

/// Rank `rank`'s layout: the same regions and blockBytes on every rank; region order, offsets and guard padding
/// between blocks (none on even ranks) and regions differ per rank (from `seed`). `extent` receives the bytes it spans
/// from offset 0.
kvcomm::KvLayout makeFetchLayout(const FetchCase& c, uint64_t seed, int rank, size_t* extent);

/// Bytes of block `block` of region `region` on `rank` before any fetch (deterministic from the seed).
std::vector<uint8_t> blockContent(uint64_t seed, int rank, size_t region, int64_t block, size_t bytes);

/// One region of `blocks` back-to-back blocks of `blockBytes` from offset 0 of `buf` (host memory), each holding
/// its blockContent(seed, rank, 0, b): the source side of the fault and hostile-input tests. Returns the layout.
kvcomm::KvLayout fillOneRegion(kvcomm::SymmetricBuffer& buf, uint64_t seed, int rank, size_t blockBytes, size_t blocks);

/// Rank `rank`'s buffer image [0, extent) before any fetch: kPoison everywhere, then every block's content.
std::vector<uint8_t> initialImage(const kvcomm::KvLayout& layout, uint64_t seed, int rank, size_t extent);

/// A batch of requests from several sources, with ids in host vectors the requests point into. Sources read
/// blocks [0, numBlocks / 2) of their layouts; destinations are distinct blocks in [numBlocks / 2, numBlocks).
struct FetchBatch {
  std::vector<int> ranks;
  std::vector<std::vector<int64_t>> src, dst;
  std::vector<kvcomm::FetchRequest> requests() const;
  size_t pairs() const;
};
/// Up to `maxPairs` pairs from up to `sources` members other than `rank` (and sometimes `rank` itself), about one
/// pair in ten padding (-1), consecutive runs mixed with scattered ids.
FetchBatch makeFetchBatch(uint64_t seed, int rank, int size, size_t numBlocks, size_t maxPairs, int sources);

/// What `image` (rank `rank`'s) holds after `batch`, copying each block from the source's content.
void applyFetchOracle(std::vector<uint8_t>& image, const std::vector<kvcomm::KvLayout>& layouts, int rank,
                      uint64_t seed, const FetchBatch& batch);

/// "" when equal, else where the first difference lies (region and block when it is inside one).
std::string describeMismatch(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want,
                             const kvcomm::KvLayout& layout);

}  // namespace kvtest
