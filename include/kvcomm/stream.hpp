// kvcomm: the stream type of stream-ordered calls.
#pragma once

struct CUstream_st;

namespace kvcomm {

/// A CUDA stream (same type as cudaStream_t and CUstream); nullptr is the legacy default stream. Ignored by host
/// buffers, whose operations are synchronous.
using Stream = CUstream_st*;

}  // namespace kvcomm
