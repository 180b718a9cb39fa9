// kvcomm device API: the by-value view of a SymmetricBuffer that kernels take.
#pragma once

#include <stdint.h>

#include <type_traits>

#include "kvcomm/device/macros.hpp"

namespace kvcomm {

/// Members a by-value handle can describe; larger groups pass the device peer table (SymmetricBuffer::peerTable()).
inline constexpr int kMaxHandlePeers = 32;

/// Plain, trivially copyable view of a symmetric buffer for kernels (pass by value). peers[r] is the base address,
/// in this process, of member r's memory (this rank's own at peers[rank]); 0 for members that are not mapped here
/// (other hosts). Addresses never change for the buffer's life, also across grow/commit/release; which bytes are
/// backed is the host's business (validated before launch).
struct SymmDeviceHandle {
  uint64_t peers[kMaxHandlePeers];
  uint64_t capacity;    ///< bytes of address space per member
  uint64_t mappedMask;  ///< bit r: member r is mapped in this process
  int32_t rank;         ///< this process's rank in the buffer's group
  int32_t size;         ///< members in the group

  /// Base of member `r`'s memory (0 when not mapped here).
  KVCOMM_HOST_DEVICE_INLINE char* peer(int r) const { return reinterpret_cast<char*>(peers[r]); }
  /// This rank's own memory.
  KVCOMM_HOST_DEVICE_INLINE char* local() const { return reinterpret_cast<char*>(peers[rank]); }
  KVCOMM_HOST_DEVICE_INLINE bool isMapped(int r) const { return (mappedMask >> r) & 1u; }
};

static_assert(std::is_trivially_copyable<SymmDeviceHandle>::value, "SymmDeviceHandle is passed to kernels by value");
static_assert(sizeof(SymmDeviceHandle) <= 1024, "keep kernel parameters small");

}  // namespace kvcomm
