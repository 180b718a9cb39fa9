// kvcomm device API, generic pieces under every feature's device header: checked 64-bit arithmetic, the vector type
// of a width, and the widest vector that divides a set of offsets. Host and device.
#pragma once

#include <stdint.h>

#include "kvcomm/device/macros.hpp"

namespace kvcomm {

/// a * b into *out; true when the product does not fit in 64 bits.
KVCOMM_HOST_DEVICE_INLINE bool mulOverflows(uint64_t a, uint64_t b, uint64_t* out) {
#if KVCOMM_DEVICE_CODE
  *out = a * b;
  return __umul64hi(a, b) != 0;
#else
  return __builtin_mul_overflow(a, b, out);
#endif
}

/// a + b into *out; true when the sum does not fit in 64 bits.
KVCOMM_HOST_DEVICE_INLINE bool addOverflows(uint64_t a, uint64_t b, uint64_t* out) {
  *out = a + b;
  return *out < a;
}

/// The widest vector (16, 8, 4, 2 or 1 bytes) that divides every value.
KVCOMM_HOST_DEVICE_INLINE int commonAlignment(uint64_t a, uint64_t b = 0, uint64_t c = 0, uint64_t d = 0,
                                              uint64_t e = 0) {
  uint64_t x = a | b | c | d | e;
  return (x & 15) == 0 ? 16 : (x & 7) == 0 ? 8 : (x & 3) == 0 ? 4 : (x & 1) == 0 ? 2 : 1;
}

#if KVCOMM_ON_DEVICE_COMPILER
namespace detail {
template <int VEC>
struct VecType;
template <>
struct VecType<16> {
  using type = uint4;
};
template <>
struct VecType<8> {
  using type = uint2;
};
template <>
struct VecType<4> {
  using type = uint32_t;
};
template <>
struct VecType<2> {
  using type = uint16_t;
};
template <>
struct VecType<1> {
  using type = uint8_t;
};
}  // namespace detail
#endif  // KVCOMM_ON_DEVICE_COMPILER

}  // namespace kvcomm
