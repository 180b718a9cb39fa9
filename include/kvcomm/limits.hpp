// kvcomm: the limit table. Every count the API takes (regions, requests, block pairs, tensors, lanes, members,
// ranges) has one documented limit here; the C ABI (kvcomm.h's KVCOMM_MAX_* macros, the same values) and the C++
// checks compare a count with its limit before anything is sized, so a count past it is an InvalidArgumentError
// naming the count and the limit, never an allocation failure. Header-only constants (host and device code).
#pragma once

#include <cstddef>

namespace kvcomm::limits {

/// Members of a communicator (the size a bootstrap is given; a world bootstrapped larger is refused).
inline constexpr int kMaxRanks = 65536;
/// Regions of one fetch layout (KvLayout::regions, kvcommFetcherCreate's numRegions).
inline constexpr size_t kMaxFetchRegions = 4096;
/// Requests of one fetch call (plan, fetch, start, fetchAll; the C ABI's numRequests).
inline constexpr size_t kMaxFetchRequests = 65536;
/// Block pairs of one fetch call: the sum of its requests' counts, or a DeviceFetchBatch's count (2^24).
inline constexpr size_t kMaxFetchPairs = size_t{1} << 24;
/// Requests of one fetch checked on the device (FetchValidation::Device): they travel inside the kernel launch.
inline constexpr size_t kMaxDeviceCheckedRequests = 16;
/// Tensors of one publish call.
inline constexpr size_t kMaxPublishTensors = 4;
/// Lanes of a Barrier, of a Publisher's barrier and of a Fetcher's collective form (BarrierOptions::lanes, ...).
inline constexpr int kMaxBarrierLanes = 8;
/// Members a Barrier, a by-value device handle (SymmDeviceHandle), Direct publishing and fetchAll support.
inline constexpr int kMaxHandlePeers = 32;
/// Ranges of one SymmetricBuffer::commit / release call.
inline constexpr size_t kMaxBufferRanges = 65536;
/// Regions of one arena layout (Arena::kMaxRegions).
inline constexpr size_t kMaxArenaRegions = 1024;

}  // namespace kvcomm::limits
