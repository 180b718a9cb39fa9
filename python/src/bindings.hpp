// kvcomm's Python extension (_kvcomm): one bind function per concept. The pure-Python package (python/kvcomm) wraps
// these with array validation, stream selection and the torch / mpi4py bootstraps.
#pragma once

#include <nanobind/nanobind.h>

#include <cstdint>

#include "kvcomm/device_error.hpp"
#include "kvcomm/stream.hpp"

namespace kvcomm::py {

namespace nb = nanobind;

void bindErrors(nb::module_& m);
void bindComm(nb::module_& m);
void bindSymm(nb::module_& m);
void bindPublish(nb::module_& m);
void bindBarrier(nb::module_& m);
void bindFetch(nb::module_& m);
void bindArrays(nb::module_& m);

/// A device error as the dict poll_error() returns ({"kind": "slot_out_of_range" | "barrier_timeout" |
/// "block_out_of_range", "token_index", "slot", "tensor", "rank", "peer", "lane"}), or None when there is none.
nb::object deviceErrorToPython(const DeviceError& e);

/// A stream handle the package passed as an int.
inline Stream toStream(uintptr_t s) {
  return reinterpret_cast<Stream>(s);
}

}  // namespace kvcomm::py
