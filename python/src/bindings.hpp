// kvcomm's Python extension (_kvcomm): one bind function per concept. The pure-Python package (python/kvcomm) wraps
// these with array validation, stream selection and the torch / mpi4py bootstraps.
#pragma once

#include <nanobind/nanobind.h>

namespace kvcomm::py {

namespace nb = nanobind;

void bindErrors(nb::module_& m);
void bindComm(nb::module_& m);
void bindSymm(nb::module_& m);
void bindPublish(nb::module_& m);
void bindArrays(nb::module_& m);

}  // namespace kvcomm::py
