// Where a publish row lands: the fast path for slots below safeSlots (unchecked arithmetic, shift or 32-bit division)
// must agree with an independent 128-bit oracle, and so must the checked path it falls back to, over random layouts
// (block sizes that are and are not powers of two, 32- and 64-bit slots, slots at and around every boundary).
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "kernels/launch.hpp"

namespace {

using kvcomm::detail::PublishLaunch;
using kvcomm::detail::PublishTensorDesc;

// The row's place computed in 128 bits, and whether it ends inside the limit.
bool oracle(const PublishTensorDesc& t, int64_t slot, uint64_t* dst) {
  if (slot < 0) return false;
  unsigned __int128 s = static_cast<uint64_t>(slot);
  unsigned __int128 rel = (s / t.blockSize) * t.blockStride + (s % t.blockSize) * t.rowStride;
  if (rel + t.rowBytes > t.limit) return false;
  *dst = static_cast<uint64_t>(t.offset + rel);
  return true;
}

// A layout the publisher's host checks accept: rows of a block fit in its stride, offset + limit <= capacity.
PublishTensorDesc randomLayout(std::mt19937_64& rng, uint64_t capacity) {
  const uint64_t sizes[] = {1, 2, 3, 7, 16, 64, 100, 1u << 20, (uint64_t(1) << 33) + 5};
  PublishTensorDesc t{};
  t.blockSize = sizes[rng() % (sizeof(sizes) / sizeof(sizes[0]))];
  t.rowBytes = 1 + rng() % 4096;
  t.rowStride = t.rowBytes + (rng() % 3 == 0 ? rng() % 512 : 0);
  if (t.blockSize > (uint64_t(1) << 24)) t.rowStride = t.rowBytes;  // keep a block inside 2^63
  uint64_t need = (t.blockSize - 1) * t.rowStride + t.rowBytes;
  t.blockStride = need + (rng() % 2 ? rng() % 4096 : 0);
  t.offset = rng() % (capacity / 4);
  uint64_t room = capacity - t.offset;
  t.limit = rng() % 4 == 0 ? room : 1 + rng() % room;
  t.safeSlots = kvcomm::detail::safeSlotsOf(t);
  t.blockShift = kvcomm::detail::blockShiftOf(t.blockSize);
  return t;
}

TEST(RowDestination, FastAndCheckedPathsAgreeWithA128BitOracle) {
  std::mt19937_64 rng(0x5eed'1234);
  const uint64_t capacity = uint64_t(1) << 46;
  PublishLaunch p{};
  p.capacity = capacity;
  const uint64_t backedAll = capacity;  // prefix: every granule backed (the bitmap is tested elsewhere)
  int fast = 0, refused = 0, inlinePath = 0;
  for (int layout = 0; layout < 2000; ++layout) {
    PublishTensorDesc t = randomLayout(rng, capacity);
    PublishTensorDesc checkedOnly = t;
    checkedOnly.safeSlots = 0;
    uint64_t blocksInLimit = t.limit / t.blockStride;
    std::vector<int64_t> slots = {
        0, 1, -1, INT64_MIN, INT64_MAX, INT64_MAX - 1, int64_t(1) << 32, (int64_t(1) << 32) - 1};
    for (uint64_t edge : {t.safeSlots, blocksInLimit * t.blockSize, (blocksInLimit + 1) * t.blockSize})
      for (int64_t d = -2; d <= 2; ++d) slots.push_back(static_cast<int64_t>(edge) + d);
    for (int i = 0; i < 40; ++i) {
      uint64_t range = t.safeSlots ? std::min<uint64_t>(t.safeSlots * 2, uint64_t(INT64_MAX)) : uint64_t(1) << 40;
      slots.push_back(static_cast<int64_t>(rng() % range));
    }
    for (int64_t slot : slots) {
      uint64_t want = 0, got = ~uint64_t(0), gotChecked = ~uint64_t(0);
      bool ok = oracle(t, slot, &want);
      bool fastOk = kvcomm::detail::rowDestination(p, t, slot, &got, backedAll);
      bool checkedOk = kvcomm::detail::rowDestination(p, checkedOnly, slot, &gotChecked, backedAll);
      ASSERT_EQ(fastOk, ok) << "layout " << layout << " slot " << slot << " blockSize " << t.blockSize;
      ASSERT_EQ(checkedOk, ok) << "layout " << layout << " slot " << slot;
      if (ok) {
        ASSERT_EQ(got, want) << "layout " << layout << " slot " << slot << " blockSize " << t.blockSize;
        ASSERT_EQ(gotChecked, want) << "layout " << layout << " slot " << slot;
      }
      // The lean kernel's inline path: where it answers, the row is in range and lands where the oracle says.
      uint64_t inlineDst = 0;
      if (kvcomm::detail::safeSlotDestination(t, slot, &inlineDst)) {
        ASSERT_TRUE(ok) << "layout " << layout << " slot " << slot;
        ASSERT_EQ(inlineDst, want) << "layout " << layout << " slot " << slot << " blockSize " << t.blockSize;
        ++inlinePath;
      }
      fast += slot >= 0 && static_cast<uint64_t>(slot) < t.safeSlots;
      refused += !ok;
    }
  }
  // Both paths were exercised, and refusals too (not a test that cannot fail for want of cases).
  EXPECT_GT(fast, 20000);
  EXPECT_GT(inlinePath, 10000);
  EXPECT_GT(refused, 10000);
}

// The lean kernel finds an item's row with fastDivide: equal to n / d for every n < 2^31, checked for divisors of
// every size (1, powers of two and their neighbours, random up to 2^31 - 1) at the quotient boundaries, the top of
// the range and random numerators.
TEST(FastDivide, EqualsIntegerDivisionBelow2To31) {
  std::mt19937_64 rng(0xd1'5eed);
  std::vector<uint32_t> divisors;
  for (uint32_t d = 1; d <= 1000; ++d) divisors.push_back(d);
  for (int k = 1; k < 31; ++k)
    for (int64_t e = -1; e <= 1; ++e) divisors.push_back(static_cast<uint32_t>((int64_t(1) << k) + e));
  divisors.push_back(0x7fffffffu);
  for (int i = 0; i < 2000; ++i) divisors.push_back(1 + static_cast<uint32_t>(rng() % 0x7fffffffu));
  const uint32_t top = 0x7fffffffu;
  uint64_t checked = 0;
  for (uint32_t d : divisors) {
    const kvcomm::detail::FastDiv f = kvcomm::detail::fastDivOf(d);
    std::vector<uint32_t> ns = {0, 1, top, top - 1, top - d + 1, d - 1, d, d + 1};
    for (uint32_t q : {uint32_t(2), uint32_t(3), top / d, top / d - 1})
      for (int64_t e = -1; e <= 1; ++e) {
        int64_t n = static_cast<int64_t>(q) * d + e;
        if (n >= 0 && n <= top) ns.push_back(static_cast<uint32_t>(n));
      }
    for (int i = 0; i < 200; ++i) ns.push_back(static_cast<uint32_t>(rng() % (uint64_t(top) + 1)));
    for (uint32_t n : ns) {
      if (n > top) continue;
      ASSERT_EQ(kvcomm::detail::fastDivide(n, f), n / d) << n << " / " << d;
      ++checked;
    }
  }
  EXPECT_GT(checked, 500000u);
}

TEST(RowDestination, SafeSlotsCoverEveryWholeBlockInsideTheLimit) {
  PublishTensorDesc t{};
  t.blockSize = 16;
  t.rowBytes = 100;
  t.rowStride = 128;
  t.blockStride = 16 * 128;
  t.limit = 10 * t.blockStride + 300;  // ten whole blocks, and three rows of an eleventh
  EXPECT_EQ(kvcomm::detail::safeSlotsOf(t), 160u);
  EXPECT_EQ(kvcomm::detail::blockShiftOf(16), 4);
  EXPECT_EQ(kvcomm::detail::blockShiftOf(12), -1);
  EXPECT_EQ(kvcomm::detail::blockShiftOf(1), 0);
  t.blockStride = 0;  // never accepted by the host; no fast path rather than a division by zero
  EXPECT_EQ(kvcomm::detail::safeSlotsOf(t), 0u);
}

}  // namespace
