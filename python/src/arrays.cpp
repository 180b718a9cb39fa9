// Importing DLPack arrays for the Python layer (producers such as torch, JAX and CuPy, and DLPack capsules): each is
// described as plain numbers, which the package (kvcomm/_arrays.py) validates before any pointer reaches the library.
// The imported tensor comes back too: it owns the memory when the caller passed a capsule (consumed by the import),
// so the package keeps it alive for as long as it uses the pointer.
#include <nanobind/ndarray.h>

#include "bindings.hpp"

namespace kvcomm::py {

void bindArrays(nb::module_& m) {
  m.def(
      "array_info",
      [](nb::handle obj) -> nb::object {
        nb::ndarray<nb::ro> a;
        if (!nb::try_cast(obj, a)) return nb::none();
        nb::list shape, strides;
        for (size_t i = 0; i < a.ndim(); ++i) {
          shape.append(a.shape(i));
          strides.append(a.stride(i) * static_cast<int64_t>(a.itemsize()));  // bytes
        }
        auto dt = a.dtype();
        // The imported tensor, alive for as long as the owner object is (its deleter runs with the GIL held).
        auto* held = new nb::ndarray<nb::ro>(a);
        nb::capsule owner(held, [](void* p) noexcept { delete static_cast<nb::ndarray<nb::ro>*>(p); });
        return nb::make_tuple(owner, reinterpret_cast<uintptr_t>(a.data()), nb::tuple(shape), nb::tuple(strides),
                              a.itemsize(), static_cast<int>(dt.code), static_cast<int>(dt.bits),
                              static_cast<int>(dt.lanes), a.device_type(), a.device_id());
      },
      nb::arg("obj"),
      "Internal: (owner, data pointer, shape, byte strides, itemsize, DLPack dtype code, bits, lanes, DLPack device "
      "type, "
      "device id) of a DLPack object or capsule, or None when it is not one; `owner` keeps the memory alive.");
}

}  // namespace kvcomm::py
