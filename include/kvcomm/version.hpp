// kvcomm: library version.
#pragma once

#define KVCOMM_VERSION_MAJOR 0
#define KVCOMM_VERSION_MINOR 1
#define KVCOMM_VERSION_PATCH 0

#include "kvcomm/api.hpp"

namespace kvcomm {
/// Version of the headers compiled against, as MAJOR * 10000 + MINOR * 100 + PATCH.
inline constexpr int kVersion = KVCOMM_VERSION_MAJOR * 10000 + KVCOMM_VERSION_MINOR * 100 + KVCOMM_VERSION_PATCH;
/// Version of the library loaded at run time (same encoding).
KVCOMM_API int version() noexcept;
}  // namespace kvcomm
