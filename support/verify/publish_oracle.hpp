// Publish scenarios and their oracle: every rank regenerates every rank's inputs from a shared seed and computes
// gather-then-insert itself, byte by byte, into a poisoned image of the cache region.
#pragma once

#include <cstdint>
#include <vector>

#include "kvcomm/publish.hpp"

namespace kvtest {

enum class CacheLayout { Flat, BlockSplit };

constexpr uint8_t kPoison = 0xA5;

/// Two tensors in one call: Flat = a row of R bytes per slot with 8 guard bytes between rows, plus a 16-byte tensor
/// in its own region; BlockSplit = Indexer-K-like blocks of 16 tokens holding 16 rows of R data bytes, then 16
/// 4-byte scales, then 32 guard bytes.
struct Geometry {
  std::vector<kvcomm::CacheTensor> tensors;  // src and srcStride unset
  size_t slots = 0;                          // slots the region holds
  size_t regionBytes = 0;                    // from the buffer's base
};
Geometry makeGeometry(CacheLayout layout, size_t rowBytes, size_t slots, size_t base = 64);

/// One rank's inputs: rows per tensor (srcStride apart) and slots (distinct across ranks, about 1 in 8 padding).
struct Inputs {
  std::vector<std::vector<uint8_t>> rows;
  std::vector<size_t> srcStride;
  std::vector<int64_t> slots;
};
Inputs makeInputs(uint64_t seed, int rank, int size, size_t tokens, const Geometry& g, uint64_t salt = 0);

/// Inserts `in` into `image` exactly as gather-then-insert would (padding skipped).
void applyOracle(std::vector<uint8_t>& image, const Geometry& g, const Inputs& in);

/// Slots narrowed to int32.
std::vector<int32_t> slots32(const Inputs& in);

}  // namespace kvtest
