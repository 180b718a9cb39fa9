// Compile check (C++17; the C tests compile kvcomm.h as C11): kvcomm.h's KVCOMM_MAX_* macros equal the limit table of
// kvcomm/limits.hpp, and every C enum of kvcomm.h has unsigned int as its fixed underlying type under C++, the type a
// C compiler gives it, so that any integer a C caller passes is a value of the type.
#include <type_traits>

#include "kvcomm/kvcomm.h"
#include "kvcomm/limits.hpp"

namespace lim = kvcomm::limits;
static_assert(KVCOMM_MAX_RANKS == lim::kMaxRanks, "KVCOMM_MAX_RANKS");
static_assert(KVCOMM_MAX_FETCH_REGIONS == lim::kMaxFetchRegions, "KVCOMM_MAX_FETCH_REGIONS");
static_assert(KVCOMM_MAX_FETCH_REQUESTS == lim::kMaxFetchRequests, "KVCOMM_MAX_FETCH_REQUESTS");
static_assert(KVCOMM_MAX_FETCH_PAIRS == lim::kMaxFetchPairs, "KVCOMM_MAX_FETCH_PAIRS");
static_assert(KVCOMM_MAX_PUBLISH_TENSORS == lim::kMaxPublishTensors, "KVCOMM_MAX_PUBLISH_TENSORS");
static_assert(KVCOMM_MAX_BARRIER_LANES == lim::kMaxBarrierLanes, "KVCOMM_MAX_BARRIER_LANES");
static_assert(KVCOMM_MAX_HANDLE_PEERS == lim::kMaxHandlePeers, "KVCOMM_MAX_HANDLE_PEERS");
static_assert(KVCOMM_MAX_BUFFER_RANGES == lim::kMaxBufferRanges, "KVCOMM_MAX_BUFFER_RANGES");
static_assert(KVCOMM_MAX_ARENA_REGIONS == lim::kMaxArenaRegions, "KVCOMM_MAX_ARENA_REGIONS");

template <typename E>
constexpr bool fixedUnsigned() {
  return std::is_same_v<std::underlying_type_t<E>, unsigned int> && sizeof(E) == sizeof(unsigned int);
}
static_assert(fixedUnsigned<kvcommResult_t>() && fixedUnsigned<kvcommAxis_t>() && fixedUnsigned<kvcommMemoryKind_t>() &&
                  fixedUnsigned<kvcommSlotType_t>() && fixedUnsigned<kvcommPublishMode_t>() &&
                  fixedUnsigned<kvcommDeviceErrorKind_t>() && fixedUnsigned<kvcommFetchPath_t>() &&
                  fixedUnsigned<kvcommFetchState_t>() && fixedUnsigned<kvcommArenaOwnerLoss_t>() &&
                  fixedUnsigned<kvcommKvOrder_t>(),
              "every C enum of kvcomm.h has the fixed underlying type unsigned int under C++");
// A value outside the enum is a value of the type (no undefined behaviour to hold or pass it).
static_assert(static_cast<unsigned>(static_cast<kvcommAxis_t>(9u)) == 9u, "kvcommAxis_t holds 9");
static_assert(static_cast<unsigned>(static_cast<kvcommMemoryKind_t>(4294967295u)) == 4294967295u, "and UINT_MAX");
