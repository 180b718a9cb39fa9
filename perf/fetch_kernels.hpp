// Kernels the fetch benchmark's baselines need (not kvcomm's): the pack and unpack of an NCCL block all-to-all,
// and a compute-bound kernel to overlap fetches with.
#pragma once

#include <cstddef>
#include <cstdint>

struct CUstream_st;

namespace kvbench {

/// out[i] = blocks at base + ids[i] * stride (blockBytes each, 16-byte aligned), packed back to back.
void launchPackBlocks(char* out, const char* base, const int64_t* ids, size_t count, size_t blockBytes, size_t stride,
                      CUstream_st* stream);
/// base + ids[i] * stride = in[i] (the inverse).
void launchUnpackBlocks(char* base, const char* in, const int64_t* ids, size_t count, size_t blockBytes, size_t stride,
                        CUstream_st* stream);
/// Every SM busy with FMAs for about `iterations` loop trips per thread (no memory traffic).
void launchCompute(float* sink, int iterations, CUstream_st* stream);

}  // namespace kvbench
