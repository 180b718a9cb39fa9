// The limit table (kvcomm/limits.hpp) for the Python layer: kvcomm.limits reads it, and the package checks each count
// against it before anything is sized.
#include "kvcomm/limits.hpp"
#include "bindings.hpp"
#include "kvcomm/endpoint.hpp"

namespace kvcomm::py {

void bindLimits(nb::module_& m) {
  m.def(
      "limits",
      [] {
        nb::dict d;
        d["MAX_RANKS"] = limits::kMaxRanks;
        d["MAX_FETCH_REGIONS"] = limits::kMaxFetchRegions;
        d["MAX_FETCH_REQUESTS"] = limits::kMaxFetchRequests;
        d["MAX_FETCH_PAIRS"] = limits::kMaxFetchPairs;
        d["MAX_PUBLISH_TENSORS"] = limits::kMaxPublishTensors;
        d["MAX_BARRIER_LANES"] = limits::kMaxBarrierLanes;
        d["MAX_HANDLE_PEERS"] = limits::kMaxHandlePeers;
        d["MAX_BUFFER_RANGES"] = limits::kMaxBufferRanges;
        d["MAX_ARENA_REGIONS"] = limits::kMaxArenaRegions;
        d["MAX_NOTIFICATION_BYTES"] = kMaxNotificationBytes;
        return d;
      },
      "Internal: the limit table of kvcomm/limits.hpp, {name: value} (kvcomm.limits holds the same values).");
}

}  // namespace kvcomm::py
