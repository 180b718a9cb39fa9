// bulkCopy (common/bulk_copy.hpp): memmove's result for every size around the streaming threshold, every alignment
// of both sides, overlapping ranges both ways; the bytes around the destination untouched.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "common/bulk_copy.hpp"

namespace {

using kvcomm::detail::bulkCopy;
using kvcomm::detail::kBulkCopyBytes;

TEST(BulkCopy, CopiesLikeMemmoveAtEverySizeAndAlignment) {
  std::mt19937_64 rng(std::random_device{}());
  const size_t sizes[] = {0,
                          1,
                          63,
                          64,
                          4096,
                          kBulkCopyBytes - 1,
                          kBulkCopyBytes,
                          kBulkCopyBytes + 1,
                          kBulkCopyBytes + 63,
                          3 * kBulkCopyBytes + 17,
                          2u << 20};
  for (size_t n : sizes)
    for (size_t sa : {0, 1, 8, 17, 63})
      for (size_t da : {0, 1, 16, 33, 63}) {
        std::vector<uint8_t> src(n + 128), dst(n + 128), want;
        for (auto& b : src) b = static_cast<uint8_t>(rng());
        for (auto& b : dst) b = static_cast<uint8_t>(rng());
        want = dst;
        std::memcpy(want.data() + da, src.data() + sa, n);
        bulkCopy(dst.data() + da, src.data() + sa, n);
        ASSERT_EQ(dst, want) << n << " bytes, source at +" << sa << ", destination at +" << da;
      }
}

TEST(BulkCopy, OverlappingRangesMoveLikeMemmove) {
  std::mt19937_64 rng(std::random_device{}());
  for (ptrdiff_t shift : {-4097, -64, -1, 1, 64, 4097}) {
    const size_t n = 2 * kBulkCopyBytes;
    std::vector<uint8_t> buf(n + 16384), want;
    for (auto& b : buf) b = static_cast<uint8_t>(rng());
    want = buf;
    std::memmove(want.data() + 8192 + shift, want.data() + 8192, n);
    bulkCopy(buf.data() + 8192 + shift, buf.data() + 8192, n);
    ASSERT_EQ(buf, want) << "destination shifted by " << shift;
  }
}

}  // namespace
