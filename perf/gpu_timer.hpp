// CUDA-graph timing for benchmarks: capture K operations into one graph, replay it, time each replay with events.
#pragma once

#include <functional>

struct CUstream_st;

namespace kvbench {

/// Median microseconds per operation: `op` enqueues one operation on the stream; `perGraph` of them are captured
/// into one graph, replayed `warmup` times untimed, then in `reps` timed batches of 10 back-to-back replays (events
/// around each batch).
double graphMedianUs(const std::function<void(CUstream_st*)>& op, int perGraph, int reps, int warmup,
                     CUstream_st* stream);

/// An empty kernel (the launch floor).
void launchEmpty(CUstream_st* stream);

CUstream_st* makeStream();
void syncDevice();

}  // namespace kvbench
