// A converted copy described compactly, its addresses computed where it runs (the conversion kernel, or the CPU
// for host memory), so that the host's work does not grow with the tokens: the block tables, and per region a few
// runs of destination heads that each come from one source. Work items are (segment, run, chunk): a segment is the
// tokens of one block of the smaller block size (the larger is a multiple of it), a chunk a group of rows of a run.
// The address math below is shared by the kernel and the CPU executor (host/device inline).
#pragma once

#include <cstdint>

#include "kvcomm/device/macros.hpp"

namespace kvcomm::detail {

/// How a run's bytes lie in a segment: a row per token (both sides tokens-major: a token's heads of the run are
/// contiguous), a row per head (a head's tokens contiguous on both sides), or a row per head and token.
enum ConvertMode : int32_t { kRowPerToken = 0, kRowPerHead = 1, kRowPerHeadToken = 2 };

/// Destination heads [h0, h0 + heads) of one region, all from one source.
struct ConvertRun {
  const char* src;                // the source's memory as this process reads it (a peer mapping, a landing area)
  uint64_t srcTable;              // where the source's block table starts in ConvertLaunch::tables (-1 skips a block)
  uint64_t srcOffset, srcStride;  // the source region: its first block, bytes between blocks
  uint64_t dstOffset, dstStride;
  uint64_t srcHead0, dstHead0;  // inside a block: bytes to (slot 0, head h0)
  uint64_t srcTok, dstTok;      // bytes between token slots of one head
  uint64_t srcHead, dstHead;    // bytes between heads of one slot
  uint64_t unit;                // bytes of one head of one token
  uint32_t heads;
  int32_t mode;           // ConvertMode
  uint32_t rowsPerChunk;  // rows one work item copies
  uint32_t chunks;        // work items of this run per segment
};

struct ConvertLaunch {
  const ConvertRun* runs;
  const uint32_t* chunkStart;  // [numRuns + 1]: run r's items of a segment are [chunkStart[r], chunkStart[r + 1])
  int32_t numRuns;
  uint32_t itemsPerSegment;  // chunkStart[numRuns]
  const int64_t* tables;     // the block tables, one after another (readable where the copy runs)
  uint64_t dstTable;         // where the destination's starts in `tables` (-1 skips a block)
  char* dst;                 // the destination's memory
  uint64_t first, end;       // tokens [first, end)
  uint64_t sT, dT, seg;      // tokens per block of the sources and the destination; seg = min(sT, dT)
  uint64_t firstSegment;     // first / seg
  int64_t numSegments;
  int32_t vec;  // a vector width dividing every address, stride and length
};

/// The rows of `run` in a segment of `n` tokens, and the bytes of each.
KVCOMM_HOST_DEVICE_INLINE void convertRows(const ConvertRun& run, uint64_t n, uint64_t* rows, uint64_t* rowBytes) {
  switch (run.mode) {
    case kRowPerToken:
      *rows = n, *rowBytes = run.heads * run.unit;
      break;
    case kRowPerHead:
      *rows = run.heads, *rowBytes = n * run.unit;
      break;
    default:
      *rows = run.heads * n, *rowBytes = run.unit;
      break;
  }
}

/// Runs item `item` of `L`: copy(dst, src, bytes) for each contiguous span of it (none when a table skips it).
template <typename Copy>
KVCOMM_HOST_DEVICE_INLINE void convertItem(const ConvertLaunch& L, int64_t item, Copy&& copy) {
  const uint64_t k = L.firstSegment + static_cast<uint64_t>(item) / L.itemsPerSegment;
  const uint32_t w = static_cast<uint32_t>(static_cast<uint64_t>(item) % L.itemsPerSegment);
  int32_t r = 0;
  while (r + 1 < L.numRuns && L.chunkStart[r + 1] <= w) ++r;
  const ConvertRun& run = L.runs[r];
  const uint64_t c = w - L.chunkStart[r];
  const uint64_t t0 = k * L.seg > L.first ? k * L.seg : L.first;
  const uint64_t t1 = (k + 1) * L.seg < L.end ? (k + 1) * L.seg : L.end;
  if (t1 <= t0) return;
  const int64_t sb = L.tables[run.srcTable + t0 / L.sT], db = L.tables[L.dstTable + t0 / L.dT];
  if (sb < 0 || db < 0) return;
  const uint64_t n = t1 - t0;
  uint64_t rows, rowBytes;
  convertRows(run, n, &rows, &rowBytes);
  const uint64_t j0 = c * run.rowsPerChunk;
  if (j0 >= rows) return;
  const uint64_t j1 = j0 + run.rowsPerChunk < rows ? j0 + run.rowsPerChunk : rows;
  const char* s =
      run.src + run.srcOffset + static_cast<uint64_t>(sb) * run.srcStride + run.srcHead0 + (t0 % L.sT) * run.srcTok;
  char* d = L.dst + run.dstOffset + static_cast<uint64_t>(db) * run.dstStride + run.dstHead0 + (t0 % L.dT) * run.dstTok;
  switch (run.mode) {
    case kRowPerToken:
      if (run.srcTok == rowBytes && run.dstTok == rowBytes) {  // the rows continue each other on both sides
        copy(d + j0 * rowBytes, s + j0 * rowBytes, (j1 - j0) * rowBytes);
        return;
      }
      for (uint64_t j = j0; j < j1; ++j) copy(d + j * run.dstTok, s + j * run.srcTok, rowBytes);
      return;
    case kRowPerHead:
      for (uint64_t j = j0; j < j1; ++j) copy(d + j * run.dstHead, s + j * run.srcHead, rowBytes);
      return;
    default:
      for (uint64_t j = j0; j < j1; ++j) {
        const uint64_t h = j / n, t = j % n;
        copy(d + h * run.dstHead + t * run.dstTok, s + h * run.srcHead + t * run.srcTok, rowBytes);
      }
      return;
  }
}

}  // namespace kvcomm::detail
