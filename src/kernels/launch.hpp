// What the ops layer asks of the kernels layer: plain launch descriptions, run by CUDA kernels (kernels/*.cu) or by
// the CPU (kernels/host_ops.cpp) with identical semantics.
#pragma once

#include <cstdint>

#include "kernels/convert_launch.hpp"
#include "kvcomm/device/barrier.hpp"
#include "kvcomm/device/error_record.hpp"
#include "kvcomm/device/fetch.hpp"
#include "kvcomm/device/publish.hpp"
#include "kvcomm/device/symm_device.hpp"
#include "kvcomm/limits.hpp"

namespace kvcomm::detail {

inline constexpr int kMaxPublishTensors = 4;
static_assert(kMaxPublishTensors == static_cast<int>(limits::kMaxPublishTensors), "kvcomm/limits.hpp");

/// n / d by a multiply-high, an add and a shift, for 0 <= n < 2^31 and a divisor fixed per launch (Granlund and
/// Montgomery's round-up method): the lean publish kernel's row of an item, without the ~25-instruction division
/// that sat between the kernel's start and its first loads. Host and device.
struct FastDiv {
  uint32_t d;      // the divisor, >= 1
  uint32_t magic;  // floor(2^32 * (2^shift - d) / d) + 1
  uint32_t shift;  // ceil(log2(d))
};

inline FastDiv fastDivOf(uint32_t d) {
  FastDiv f{d, 0, 0};
  while (f.shift < 32 && (uint64_t(1) << f.shift) < d) ++f.shift;
  f.magic = static_cast<uint32_t>(((uint64_t(1) << 32) * ((uint64_t(1) << f.shift) - d)) / d + 1);
  return f;
}

/// n / f.d for 0 <= n < 2^31 (the sum below stays under 2^32).
KVCOMM_HOST_DEVICE_INLINE uint32_t fastDivide(uint32_t n, const FastDiv& f) {
#if KVCOMM_DEVICE_CODE
  const uint32_t hi = __umulhi(n, f.magic);
#else
  const uint32_t hi = static_cast<uint32_t>((static_cast<uint64_t>(n) * f.magic) >> 32);
#endif
  return (hi + n) >> f.shift;
}

/// One cache tensor of a publish (or insert) launch; all values in bytes.
struct PublishTensorDesc {
  const char* src;        // row (source s, token i) at src + s * sourceStride + i * srcStride
  uint64_t sourceStride;  // bytes between sources' rows (insert: one source per rank); 0 with one source
  uint64_t srcStride;
  uint64_t rowBytes;
  uint64_t offset;  // destination base in the buffer
  uint64_t blockSize;
  uint64_t blockStride;
  uint64_t rowStride;
  uint64_t limit;      // bytes from offset the tensor may address (offset + limit <= capacity, checked on the host)
  uint64_t safeSlots;  // slots below it land inside the limit with no step able to wrap (safeSlotsOf); 0: none
  int32_t vec;         // vector width every row start is aligned to
  int32_t blockShift;  // log2 of blockSize when it is a power of two, else -1
  FastDiv cols;        // vectors of `vec` bytes per row, rounded up (filled by launchPublish for its kernels)
  uint32_t reserved;
};

/// Slots whose rows need no overflow or limit check: every whole block inside the limit. Relies on what the host
/// checks before it fills a descriptor: blockSize >= 1, the rows of a block fit in its stride ((blockSize - 1) *
/// rowStride + rowBytes <= blockStride, so blockStride > 0), and offset + limit <= capacity. Every row of block b ends
/// by (b + 1) * blockStride, so slots of blocks below limit / blockStride are safe; the rest take the checked path.
inline uint64_t safeSlotsOf(const PublishTensorDesc& t) {
  if (t.blockSize == 0 || t.blockStride == 0) return 0;
  uint64_t blocks = t.limit / t.blockStride, slots = 0;
  return __builtin_mul_overflow(blocks, t.blockSize, &slots) ? UINT64_MAX : slots;
}

/// The blockShift field for `blockSize`.
inline int32_t blockShiftOf(uint64_t blockSize) {
  return blockSize != 0 && (blockSize & (blockSize - 1)) == 0 ? __builtin_ctzll(blockSize) : -1;
}

/// Rows of `numSources` x `numTokens` tokens for each tensor, stored at their slots in every replica of `replicas`
/// (publish) or only in this rank's (insert: replicas.mappedMask = this rank's bit). Slots: int64 or int32; a slot
/// below zero is padding; a row that is not wholly inside backed granules (read from the buffer's bitmap when the
/// kernel runs, so captured launches follow growth and release) is not written and is recorded in `error`.
struct PublishLaunch {
  PublishTensorDesc t[kMaxPublishTensors];
  SymmDeviceHandle replicas;
  const void* slots;      // slot of (source s, token i) at slots + s * sourceStride + i * slotBytes
  uint64_t sourceStride;  // bytes between sources' slots (insert: one source per rank); 0 with one source
  int64_t numTokens;
  int32_t numSources;
  int32_t slot64;  // 1: int64 slots, 0: int32
  int32_t numTensors;
  int32_t granShift;             // log2 of the buffer's granularity
  const uint64_t* backed;        // the buffer's backed-granule bitmap (SymmetricBuffer::backedBitmap())
  const uint64_t* backedPrefix;  // the word beside it: bytes backed from offset 0 (loaded once per kernel)
  uint64_t capacity;             // bytes of the buffer
  DeviceErrorRecord* error;
  FastDiv tokens;  // numTokens as a divisor (filled by launchPublish for its kernels)
  uint32_t reserved;
};

/// Whether [dst, dst + bytes) lies wholly in backed granules (host and device). `prefix`: bytes backed from offset 0
/// (*p.backedPrefix, read once by the caller; 0 to always consult the bitmap): rows below it need no bitmap load.
KVCOMM_HOST_DEVICE_INLINE bool rowBacked(const PublishLaunch& p, uint64_t dst, uint64_t bytes, uint64_t prefix = 0) {
  if (bytes == 0 || dst > p.capacity || bytes > p.capacity - dst) return false;
  if (dst + bytes <= prefix) return true;
  for (uint64_t g = dst >> p.granShift, last = (dst + bytes - 1) >> p.granShift; g <= last; ++g)
    if (!((p.backed[g >> 6] >> (g & 63)) & 1u)) return false;
  return true;
}

/// The unchecked destination of a slot below t.safeSlots when its block is found without a 64-bit division (block
/// size a power of two: a shift; slot and block size below 2^32: a 32-bit division). False: not such a slot.
KVCOMM_HOST_DEVICE_INLINE bool safeSlotDestination(const PublishTensorDesc& t, int64_t slot, uint64_t* dst) {
  const uint64_t s = static_cast<uint64_t>(slot);
  if (slot < 0 || s >= t.safeSlots) return false;
  uint64_t block, within;
  if (t.blockShift >= 0) {
    block = s >> t.blockShift;
    within = s & ((uint64_t(1) << t.blockShift) - 1);
  } else if ((s | t.blockSize) >> 32 == 0) {  // 32-bit division: a fraction of the 64-bit one's instructions
    block = static_cast<uint32_t>(s) / static_cast<uint32_t>(t.blockSize);
    within = s - block * t.blockSize;
  } else {
    return false;
  }
  *dst = t.offset + block * t.blockStride + within * t.rowStride;
  return true;
}

/// Where `slot`'s row of tensor `t` lands, checked (host and device): no step of the computation may wrap, the row
/// must end within the tensor's limit and lie in backed granules. False: the row is refused (not written). Slots
/// below t.safeSlots (the usual case) skip the overflow-checked arithmetic, which sits between a row's slot load and
/// its stores (0.1 us of a one-row publish on H200), and divide by shifting when blockSize is a power of two.
KVCOMM_HOST_DEVICE_INLINE bool rowDestination(const PublishLaunch& p, const PublishTensorDesc& t, int64_t slot,
                                              uint64_t* dst, uint64_t prefix = 0) {
  if (slot >= 0 && static_cast<uint64_t>(slot) < t.safeSlots) {
    if (!safeSlotDestination(t, slot, dst)) {  // a 64-bit division
      const uint64_t s = static_cast<uint64_t>(slot), block = s / t.blockSize;
      *dst = t.offset + block * t.blockStride + (s - block * t.blockSize) * t.rowStride;
    }
  } else if (!slotDestinationChecked(slot, t.offset, t.blockSize, t.blockStride, t.rowStride, t.rowBytes, t.limit,
                                     dst)) {
    return false;
  }
  return rowBacked(p, *dst, t.rowBytes, prefix);
}

/// Packs rows and slots into one contiguous per-rank record for the fallback's allgather:
/// [int64 slots x numTokens][tensor 0 rows x numTokens][tensor 1 rows]... (each part 16-byte aligned).
struct PackLaunch {
  const char* src[kMaxPublishTensors];
  uint64_t srcStride[kMaxPublishTensors];
  uint64_t rowBytes[kMaxPublishTensors];
  uint64_t partOffset[kMaxPublishTensors];  // where each tensor's rows start in the record
  int32_t vec[kMaxPublishTensors];          // vector width of each tensor's copy (filled by launchPack)
  const void* slots;
  int64_t numTokens;
  int32_t slot64;
  int32_t numTensors;
  char* out;
};

inline constexpr int kInlineFetchPairs = 32;

/// Block pairs copied by the gather kernel: pair p copies, in every region j, bytes [c * chunkBytes, ...) of
/// source block srcBlocks[p] of member srcRanks[p] (or srcRank) into destination block dstBlocks[p]. A pair with a
/// -1 id is skipped; a pair with an id outside its region, an unmapped source or an unbacked range is not copied and
/// is recorded in `error` (BlockOutOfRange). Small batches travel inside the launch (inlineCount > 0).
struct FetchLaunch {
  FetchDeviceHandle h;
  const int64_t* srcBlocks;
  const int64_t* dstBlocks;
  const int32_t* srcRanks;  // nullptr: srcRank for every pair
  int32_t srcRank;
  int32_t vec;  // vector width dividing every region offset, stride, blockBytes and chunkBytes
  int64_t numPairs;
  uint64_t chunkBytes;     // bytes of a block one warp copies at a time
  int64_t chunksPerBlock;  // ceil(largest blockBytes / chunkBytes)
  DeviceErrorRecord* error;
  int32_t inlineCount;  // > 0: the pairs are the inline arrays below (numPairs == inlineCount)
  int32_t trusted;      // 1: the host validated every pair against the current generation (plans): no checks
  // Unvalidated ids (device ids): one word per destination block, zero between launches. A claim pass leaves the
  // largest (pair + 1) naming each destination block in it, the copy pass copies only that pair's blocks, a release
  // pass zeroes what was claimed: the last pair naming a destination wins it whole (never bytes of two sources).
  // nullptr: no claims (host-validated plans, which refuse duplicates).
  uint32_t* claims;
  int64_t numClaims;
  int64_t inlineSrc[kInlineFetchPairs];
  int64_t inlineDst[kInlineFetchPairs];
  int32_t inlineRank[kInlineFetchPairs];
};

inline constexpr int kMaxCheckedRequests = 16;  // limits::kMaxDeviceCheckedRequests

/// One request of a batch checked on the device: ids readable by the GPU, pairs [base, base + count) of the batch.
struct CheckedRequestView {
  const int64_t* src;
  const int64_t* dst;
  int64_t base;
  int64_t count;
  uint64_t srcLimit;  // blocks of the source's layout
  int32_t rank;
  int32_t pad;
};

/// The refusal words of checked batches, in device memory, all ones between uses. A launch uses index `parity`; its
/// copy pass resets the other index for the next launch (launches of one fetcher are ordered on the device).
/// refused: (pair << 32 | earlier pair, or 0xffffffff for an id out of range), the minimum over bad pairs, so the
/// first bad pair in batch order is reported, as the host planner does; readsWritten: the same for pairs that read a
/// local block the batch writes (checked after every claim landed).
struct CheckWords {
  unsigned long long refused[2];
  unsigned long long readsWritten[2];
};

/// A batch of host-named pairs checked on the device (FetchValidation::Device): the check pass reads every pair,
/// writes it to out* for the copy pass, refuses ids out of range and claims destinations (claims[d] ends as
/// 0xffffffff - the first pair naming d: an earlier claim seen means a duplicate); the reads-written pass (only
/// when a request reads this rank) then refuses a local source that is claimed; the copy pass copies nothing when
/// anything was refused (and records the first refusal), and zeroes the claims either way.
struct CheckLaunch {
  CheckedRequestView req[kMaxCheckedRequests];
  int32_t numRequests;
  int32_t myRank;
  int32_t parity;
  int32_t pad;
  int64_t numPairs;
  uint64_t dstLimit;  // blocks of this rank's layout (<= numClaims)
  uint32_t* claims;
  int64_t numClaims;
  CheckWords* words;
  int64_t* outSrc;
  int64_t* outDst;
  int32_t* outRank;
};

/// One contiguous copy of a converted transfer (kv_conversion.hpp's KvPiece made absolute): both addresses in this
/// process (the source often a peer's memory mapped here), checked against both memories by the host before.
struct PieceCopy {
  const char* src;
  char* dst;
  uint64_t bytes;
};

/// Pieces copied by the conversion kernel, one warp per piece (the host splits long pieces, so warps stay busy
/// alike): `pieces` readable by the GPU, `vec` dividing every address and length.
struct PieceLaunch {
  const PieceCopy* pieces;
  int64_t numPieces;
  int32_t vec;
};

/// Which half (or both) of a barrier a launch runs.
enum class BarrierStep { Signal = 1, Wait = 2, Both = 3 };

// CUDA launches; `stream` is a cudaStream_t. Not compiled without CUDA.
// With fusedBarrier, the kernel's end runs `after` on `lane` (Both: barrierAfterGrid; Signal: the first half only).
void launchPublish(const PublishLaunch& p, void* stream, const BarrierDeviceHandle* fusedBarrier, int lane,
                   BarrierStep after = BarrierStep::Both);
void launchBarrier(const BarrierDeviceHandle& b, int lane, BarrierStep step, void* stream);
void launchPack(const PackLaunch& p, void* stream);
void launchFetch(const FetchLaunch& f, void* stream);
/// The check pass(es) of `c`, then the copy pass `f` over c's out* arrays (f.trusted: the checks ran), dependently.
/// `readsLocal`: some request reads this rank's own blocks (the reads-written pass runs).
void launchCheckedFetch(const CheckLaunch& c, const FetchLaunch& f, bool readsLocal, void* stream);
void launchPieces(const PieceLaunch& p, void* stream);
/// The conversion kernel over every (segment, run, chunk) item of `c` (its arrays readable by the GPU).
void launchConvert(const ConvertLaunch& c, void* stream);

// CPU versions over host memory (synchronous). hostPublish validates every slot before writing any row and throws
// InvalidArgumentError naming the first bad token; hostBarrier throws a Timeout naming rank, peer and lane, or an
// Error with code Aborted once b.health is set (the communicator was aborted or a member died).
void hostPublish(const PublishLaunch& p);
void hostBarrier(const BarrierDeviceHandle& b, int lane, BarrierStep step = BarrierStep::Both);
void hostPack(const PackLaunch& p);
/// hostFetch validates every pair before copying any and throws InvalidArgumentError naming the first bad one.
void hostFetch(const FetchLaunch& f);
/// Every item of `c` with memcpy (host memory; the caller checked the tables and layouts).
void hostConvert(const ConvertLaunch& c);

}  // namespace kvcomm::detail
