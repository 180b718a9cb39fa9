// The publish/insert copy against an independent oracle, for the CPU version (every build) and the CUDA kernels (one
// GPU; skipped elsewhere, with the reason): rows of several sources (the insert of the gather+insert fallback) or one
// (publish), one to three tensors, row tails, mixed vector widths, padding, int32 and int64 slots, and sizes on both
// sides of the lean kernel's limit (one item per thread) so both kernels run. The replica is poisoned first and
// compared whole: rows at their slots, every other byte untouched. Out-of-range slots: the kernels write every other
// row and record one of the bad ones; the CPU version throws naming one and writes nothing. The multi-GPU suites
// cover peers; this covers the copy's arithmetic.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/launch.hpp"
#include "kvcomm/capabilities.hpp"
#include "kvcomm/error.hpp"
#include "verify/memory.hpp"

namespace {

using kvcomm::DeviceErrorRecord;
using kvcomm::detail::PublishLaunch;
using kvcomm::detail::PublishTensorDesc;

struct TensorShape {
  uint64_t rowBytes;
  uint64_t align;  // what src, strides and offset are multiples of (the vector width the kernel may use)
  uint64_t blockSize;
};

struct Scenario {
  int sources;
  int64_t tokens;
  bool slot64;
  std::vector<TensorShape> tensors;
  int badRows;  // rows given a slot past their region (refused, recorded)
};

uint64_t roundUp(uint64_t v, uint64_t a) {
  return (v + a - 1) / a * a;
}

// A copy of `n` host bytes in memory of `kind` (device memory for the kernels).
std::unique_ptr<kvtest::Memory> placed(kvcomm::MemoryKind kind, const void* bytes, size_t n) {
  auto m = std::make_unique<kvtest::Memory>(kind, std::max<size_t>(n, 16));
  kvtest::toMemory(kind, m->data(), bytes, n);
  return m;
}

void runScenario(const Scenario& sc, std::mt19937_64& rng, kvcomm::MemoryKind kind) {
  SCOPED_TRACE("sources " + std::to_string(sc.sources) + ", tokens " + std::to_string(sc.tokens) + ", tensors " +
               std::to_string(sc.tensors.size()) + (sc.slot64 ? ", int64" : ", int32") + " slots, bad rows " +
               std::to_string(sc.badRows));
  const int64_t rows = sc.sources * sc.tokens;
  const uint64_t slotsPerRegion = static_cast<uint64_t>(rows) + 37;  // some slots stay unused
  PublishLaunch p{};
  std::vector<std::vector<char>> srcHost(sc.tensors.size());
  uint64_t at = 256;  // guard before the first region
  for (size_t k = 0; k < sc.tensors.size(); ++k) {
    const TensorShape& s = sc.tensors[k];
    PublishTensorDesc& t = p.t[k];
    t.rowBytes = s.rowBytes;
    t.srcStride = roundUp(s.rowBytes, s.align) + (k % 2 ? s.align : 0);  // padded source rows for odd tensors
    t.sourceStride = t.srcStride * static_cast<uint64_t>(sc.tokens);
    t.blockSize = s.blockSize;
    t.rowStride = roundUp(s.rowBytes, s.align) + s.align;  // a gap after every row
    t.blockStride = t.blockSize * t.rowStride + 2 * s.align;
    t.offset = roundUp(at, s.align);
    // The region ends with the last slot's row: slots of a last partial block are valid but past safeSlots (the
    // checked path), and the slot after it is refused.
    const uint64_t partial = slotsPerRegion % t.blockSize;
    t.limit = slotsPerRegion / t.blockSize * t.blockStride + (partial ? (partial - 1) * t.rowStride + t.rowBytes : 0);
    t.safeSlots = kvcomm::detail::safeSlotsOf(t);
    t.blockShift = kvcomm::detail::blockShiftOf(t.blockSize);
    t.vec = static_cast<int32_t>(s.align);
    at = t.offset + t.limit + 128;  // guard between regions
    srcHost[k].resize(std::max<uint64_t>(t.sourceStride * static_cast<uint64_t>(sc.sources), 16));
    for (char& c : srcHost[k]) c = static_cast<char>(rng());
  }
  const uint64_t capacity = roundUp(at + 256, 4096);
  // Slots: distinct per row (a shuffled prefix of the region's slots), some padding, some past every region.
  std::vector<int64_t> perm(slotsPerRegion);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int64_t> slots(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r)
    slots[static_cast<size_t>(r)] = rng() % 19 == 0 ? -1 : perm[static_cast<size_t>(r)];
  std::vector<int64_t> bad;
  for (int b = 0; b < sc.badRows && rows > 0; ++b) {
    int64_t r = static_cast<int64_t>(rng() % static_cast<uint64_t>(rows));
    // Just past every region's last row, or far past the buffer.
    slots[static_cast<size_t>(r)] = b % 2 ? static_cast<int64_t>(slotsPerRegion + rng() % 3)
                                          : static_cast<int64_t>(capacity) + static_cast<int64_t>(rng() % 1000);
    bad.push_back(r);
  }
  std::vector<char> slotBytes(static_cast<size_t>(rows) * (sc.slot64 ? 8 : 4) + 16);
  for (int64_t r = 0; r < rows; ++r) {
    if (sc.slot64) {
      std::memcpy(slotBytes.data() + r * 8, &slots[static_cast<size_t>(r)], 8);
    } else {
      int32_t v = static_cast<int32_t>(slots[static_cast<size_t>(r)]);
      std::memcpy(slotBytes.data() + r * 4, &v, 4);
    }
  }

  // The oracle: each row copied to offset + (slot / blockSize) * blockStride + (slot % blockSize) * rowStride.
  std::vector<char> expect(capacity);
  for (char& c : expect) c = static_cast<char>(rng());
  std::vector<char> poison = expect;
  for (int64_t r = 0; r < rows; ++r) {
    int64_t slot = slots[static_cast<size_t>(r)];
    if (slot < 0 || std::find(bad.begin(), bad.end(), r) != bad.end()) continue;
    int64_t source = r / sc.tokens, i = r % sc.tokens;
    for (size_t k = 0; k < sc.tensors.size(); ++k) {
      const PublishTensorDesc& t = p.t[k];
      uint64_t s = static_cast<uint64_t>(slot);
      uint64_t dst = t.offset + (s / t.blockSize) * t.blockStride + (s % t.blockSize) * t.rowStride;
      std::memcpy(
          expect.data() + dst,
          srcHost[k].data() + static_cast<uint64_t>(source) * t.sourceStride + static_cast<uint64_t>(i) * t.srcStride,
          t.rowBytes);
    }
  }

  auto replica = placed(kind, poison.data(), capacity);
  std::vector<std::unique_ptr<kvtest::Memory>> sources;
  for (size_t k = 0; k < sc.tensors.size(); ++k) {
    sources.push_back(placed(kind, srcHost[k].data(), srcHost[k].size()));
    p.t[k].src = sources.back()->data();
  }
  auto slotMem = placed(kind, slotBytes.data(), slotBytes.size());
  const int granShift = 16;
  std::vector<uint64_t> bitmap(((capacity >> granShift) + 64) / 64 + 2, ~uint64_t(0));
  bitmap.back() = rng() % 2 ? capacity : 0;  // the prefix word; 0: every row consults the bitmap
  auto bitmapMem = placed(kind, bitmap.data(), bitmap.size() * 8);
  DeviceErrorRecord none{};
  auto errorMem = placed(kind, &none, sizeof(none));

  p.replicas.peers[0] = reinterpret_cast<uint64_t>(replica->data());
  p.replicas.capacity = capacity;
  p.replicas.mappedMask = 1;
  p.replicas.rank = 0;
  p.replicas.size = 1;
  p.slots = slotMem->data();
  p.sourceStride = static_cast<uint64_t>(sc.tokens) * (sc.slot64 ? 8 : 4);
  p.numTokens = sc.tokens;
  p.numSources = sc.sources;
  p.slot64 = sc.slot64 ? 1 : 0;
  p.numTensors = static_cast<int32_t>(sc.tensors.size());
  p.granShift = granShift;
  p.backed = reinterpret_cast<const uint64_t*>(bitmapMem->data());
  p.backedPrefix = p.backed + bitmap.size() - 1;
  p.capacity = capacity;
  p.error = reinterpret_cast<DeviceErrorRecord*>(errorMem->data());

  std::vector<char> got(capacity);
  if (kind == kvcomm::MemoryKind::Host) {
    if (!bad.empty()) {  // validated before anything is written: a throw naming a bad token, the buffer untouched
      try {
        kvcomm::detail::hostPublish(p);
        ADD_FAILURE() << "hostPublish accepted slots past every region";
      } catch (const kvcomm::InvalidArgumentError& e) {
        EXPECT_NE(std::string(e.what()).find("lands outside"), std::string::npos) << e.what();
      }
      kvtest::fromMemory(kind, got.data(), replica->data(), capacity);
      EXPECT_TRUE(got == poison) << "hostPublish wrote although a slot was refused";
      return;
    }
    kvcomm::detail::hostPublish(p);
  } else {
    kvcomm::detail::launchPublish(p, nullptr, nullptr, 0);
    kvtest::synchronize(kind);
  }
  kvtest::fromMemory(kind, got.data(), replica->data(), capacity);
  DeviceErrorRecord rec{};
  kvtest::fromMemory(kind, &rec, errorMem->data(), sizeof(rec));

  size_t firstDiff = 0;
  while (firstDiff < capacity && got[firstDiff] == expect[firstDiff]) ++firstDiff;
  EXPECT_EQ(firstDiff, capacity) << "first differing byte at buffer offset " << firstDiff;
  if (bad.empty()) {
    EXPECT_EQ(rec.flag, 0) << "an error was recorded for token " << rec.index << ", slot " << rec.slot;
  } else {
    ASSERT_EQ(rec.flag, 1);
    EXPECT_EQ(rec.kind, static_cast<int32_t>(kvcomm::DeviceErrorKind::SlotOutOfRange));
    EXPECT_NE(std::find(bad.begin(), bad.end(), rec.index), bad.end()) << "recorded token " << rec.index;
    EXPECT_EQ(rec.slot, slots[static_cast<size_t>(rec.index)]);
  }
}

std::vector<Scenario> scenarios() {
  const std::vector<TensorShape> mla = {{656, 16, 1}};                               // one 16-byte-wide tensor
  const std::vector<TensorShape> kv = {{576, 16, 16}, {64, 16, 16}};                 // two, power-of-two blocks
  const std::vector<TensorShape> tails = {{100, 16, 3}, {656, 16, 5}, {36, 16, 1}};  // rows not a multiple of 16
  const std::vector<TensorShape> mixed = {{656, 16, 16}, {132, 4, 16}};              // two widths
  const std::vector<TensorShape> narrow = {{48, 8, 7}};                              // 8-byte vectors
  const std::vector<TensorShape> words = {{132, 4, 16}, {20, 4, 3}};                 // 4-byte vectors
  std::vector<Scenario> all;
  for (const auto& tensors : {mla, kv, tails, mixed, narrow, words})
    for (int64_t tokens : {int64_t(1), int64_t(5), int64_t(300), int64_t(2500), int64_t(7000)})
      for (int sources : {1, 3}) all.push_back({sources, tokens, (tokens + sources) % 2 == 0, tensors, 0});
  all.push_back({1, 1, true, mla, 1});        // one row, refused
  all.push_back({3, 300, true, kv, 4});       // lean kernel, several sources
  all.push_back({1, 300, false, mixed, 3});   // lean kernel with two widths, refused rows
  all.push_back({3, 7000, false, tails, 4});  // lean kernel, several waves of blocks (1.07M items)
  const std::vector<TensorShape> wide = {{16384, 16, 2}};
  all.push_back({1, 1100, true, wide, 3});  // 1.13M items: past the lean kernel's 8 waves on an H200, general kernel
  all.push_back({1, 0, true, mla, 0});      // nothing to publish
  return all;
}

TEST(PublishCopy, CpuVersionMatchesAnIndependentOracle) {
  std::mt19937_64 rng(0xC0FFEE);
  for (const Scenario& sc : scenarios()) {
    runScenario(sc, rng, kvcomm::MemoryKind::Host);
    if (HasFatalFailure()) return;
  }
}

TEST(PublishKernels, MatchAnIndependentOracleAcrossSourcesTensorsAndSizes) {
  if (!kvtest::haveGpu()) GTEST_SKIP() << "CUDA kernels skipped: " << kvtest::noGpuReason();
  ASSERT_GE(kvcomm::useLocalDevice(0), 0);  // the primary context current, for the test's own allocations
  std::mt19937_64 rng(0xC0FFEE);
  for (const Scenario& sc : scenarios()) {
    runScenario(sc, rng, kvcomm::MemoryKind::Cuda);
    if (HasFatalFailure()) return;
  }
}

// The fallback's pack (the caller's slots widened to int64, then each tensor's rows back to back at its part of the
// record) against a record built by plain loops, for sources whose address, stride or row size gives every vector
// width (16 to 1 bytes); the bytes past the record keep their poison.
std::vector<uint8_t> packOracle(const kvcomm::detail::PackLaunch& p, const std::vector<std::vector<uint8_t>>& rows,
                                const std::vector<int64_t>& slots, size_t recordBytes) {
  std::vector<uint8_t> out(recordBytes + 64, 0xA5);
  for (size_t i = 0; i < slots.size(); ++i) std::memcpy(out.data() + i * 8, &slots[i], 8);
  for (int k = 0; k < p.numTensors; ++k)
    for (int64_t i = 0; i < p.numTokens; ++i)
      for (uint64_t b = 0; b < p.rowBytes[k]; ++b)
        out[p.partOffset[k] + i * p.rowBytes[k] + b] = rows[k][i * p.srcStride[k] + b];
  return out;
}

void runPack(kvcomm::MemoryKind kind, std::mt19937_64& rng) {
  struct Case {
    int64_t tokens;
    std::vector<std::array<uint64_t, 3>> tensors;  // (rowBytes, srcStride, bytes the source starts past 16)
    bool slot64;
  };
  const std::vector<Case> cases = {
      {1, {{656, 656, 0}}, true},                           // 16-byte vectors
      {300, {{656, 672, 0}, {136, 144, 0}}, false},         // strided rows: 16 and 8
      {2500, {{132, 132, 0}, {20, 20, 0}}, true},           // 4
      {77, {{6, 6, 0}, {7, 9, 0}, {656, 1312, 0}}, false},  // 2, 1, and every other source row
      {9000, {{576, 1152, 0}, {64, 1152, 0}}, true},        // K and V halves of one row: many blocks
      {40, {{656, 656, 8}, {656, 656, 4}, {656, 656, 2}, {656, 656, 1}}, true},  // the source address decides
  };
  for (const Case& c : cases) {
    kvcomm::detail::PackLaunch p{};
    p.numTokens = c.tokens;
    p.numTensors = static_cast<int32_t>(c.tensors.size());
    p.slot64 = c.slot64 ? 1 : 0;
    std::vector<std::vector<uint8_t>> rows;
    std::vector<std::unique_ptr<kvtest::Memory>> mem;
    uint64_t at = (static_cast<uint64_t>(c.tokens) * 8 + 15) & ~uint64_t(15);
    for (size_t k = 0; k < c.tensors.size(); ++k) {
      auto [rowBytes, stride, skew] = c.tensors[k];
      std::vector<uint8_t> r(static_cast<size_t>(c.tokens) * stride);
      for (auto& b : r) b = static_cast<uint8_t>(rng());
      rows.push_back(r);
      std::vector<uint8_t> skewed(skew + r.size());
      std::copy(r.begin(), r.end(), skewed.begin() + static_cast<std::ptrdiff_t>(skew));
      mem.push_back(placed(kind, skewed.data(), skewed.size()));
      p.src[k] = mem.back()->data() + skew;
      p.srcStride[k] = stride;
      p.rowBytes[k] = rowBytes;
      p.partOffset[k] = at;
      at += (static_cast<uint64_t>(c.tokens) * rowBytes + 15) & ~uint64_t(15);
    }
    std::vector<int64_t> slots(static_cast<size_t>(c.tokens));
    for (auto& v : slots) v = static_cast<int64_t>(rng() % 100000) - 1000;  // negative ones too: copied as they are
    std::vector<int32_t> slots32(slots.begin(), slots.end());
    auto slotMem =
        c.slot64 ? placed(kind, slots.data(), slots.size() * 8) : placed(kind, slots32.data(), slots.size() * 4);
    p.slots = slotMem->data();
    const std::vector<uint8_t> expect = packOracle(p, rows, slots, at);
    const std::vector<uint8_t> poison(expect.size(), 0xA5);
    auto out = placed(kind, poison.data(), poison.size());
    p.out = out->data();
    if (kind == kvcomm::MemoryKind::Cuda) {
      kvcomm::detail::launchPack(p, nullptr);
      kvtest::synchronize(kind);
    } else {
      kvcomm::detail::hostPack(p);
    }
    std::vector<uint8_t> got(expect.size());
    kvtest::fromMemory(kind, got.data(), out->data(), got.size());
    size_t first = 0;
    while (first < got.size() && got[first] == expect[first]) ++first;
    EXPECT_EQ(first, got.size()) << c.tokens << " tokens, " << c.tensors.size() << " tensors: first differing byte at "
                                 << first << " of a record of " << at;
  }
}

TEST(PackCopy, CpuVersionMatchesAnIndependentOracle) {
  std::mt19937_64 rng(0xFACADE);
  runPack(kvcomm::MemoryKind::Host, rng);
}

TEST(PackKernel, MatchesAnIndependentOracleAcrossVectorWidths) {
  if (!kvtest::haveGpu()) GTEST_SKIP() << "CUDA kernels skipped: " << kvtest::noGpuReason();
  ASSERT_GE(kvcomm::useLocalDevice(0), 0);
  std::mt19937_64 rng(0xFACADE);
  runPack(kvcomm::MemoryKind::Cuda, rng);
}

}  // namespace
