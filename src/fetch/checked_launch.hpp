// Batches of host-named pairs checked on the device (FetchValidation::Device): the host hands the raw ids over
// (the GPU reads pinned, device and managed ids where they are; pageable ids are copied once into pinned staging)
// and enqueues the check and copy passes. CUDA only (fetch/no_cuda.cpp otherwise).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/launch.hpp"
#include "kvcomm/stream.hpp"

namespace kvcomm::detail {

/// One request's ids as the caller passed them (any memory the host can read or the GPU can), and its source.
struct CheckedIds {
  const int64_t* src;
  const int64_t* dst;
  size_t count;
  int rank;
  uint64_t srcLimit;  // blocks of the source's layout
};

/// What one checked batch enqueued.
struct CheckedLaunchInfo {
  size_t stagedBytes = 0;  ///< pageable ids copied into pinned staging on the host
};

/// The state of one fetcher's checked batches: claim and refusal words, and two staging slots in turn (a slot is
/// rewritten only after the copy pass that read it finished). Batches are ordered on the device: one on another
/// stream than the last waits for it (they share the words). One thread at a time (the fetcher's lock).
class CheckedLauncher {
 public:
  virtual ~CheckedLauncher() = default;
  /// Enqueues the batch on `stream`: `base` is the copy pass's launch (tables, chunking, error record), `dstLimit`
  /// the blocks of this rank's layout. Throws InvalidArgumentError naming the request for ids in another GPU's
  /// memory.
  virtual CheckedLaunchInfo launch(FetchLaunch base, const std::vector<CheckedIds>& requests, int myRank,
                                   uint64_t dstLimit, Stream stream) = 0;
  /// Waits for every batch enqueued (teardown).
  virtual void drain() noexcept = 0;
};

/// For the current CUDA device, with claim words for `numClaims` destination blocks (this rank's largest region).
/// Throws Unsupported in a build without CUDA.
std::unique_ptr<CheckedLauncher> makeCheckedLauncher(size_t numClaims);

}  // namespace kvcomm::detail
