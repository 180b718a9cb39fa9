// Importing arrays for the Python layer: anything nanobind's ndarray caster takes (DLPack producers such as torch,
// JAX and CuPy; the buffer protocol: numpy, bytes, memoryview) is described as plain numbers, which the package
// validates before any pointer reaches the library.
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
        return nb::make_tuple(reinterpret_cast<uintptr_t>(a.data()), nb::tuple(shape), nb::tuple(strides), a.itemsize(),
                              static_cast<int>(dt.code), static_cast<int>(dt.bits), static_cast<int>(dt.lanes),
                              a.device_type(), a.device_id());
      },
      nb::arg("obj"),
      "Internal: (data pointer, shape, byte strides, itemsize, DLPack dtype code, bits, lanes, DLPack device type, "
      "device id) of a DLPack / buffer-protocol object, or None when it is neither.");
}

}  // namespace kvcomm::py
