// _kvcomm: the extension module.
#include <nanobind/stl/string.h>

#include "bindings.hpp"
#include "kvcomm/capabilities.hpp"
#include "kvcomm/version.hpp"

namespace nb = nanobind;

NB_MODULE(_kvcomm, m) {
  m.doc() = "kvcomm's native bindings; use the kvcomm package, which wraps them.";
  m.def("version", &kvcomm::version, "Version of the loaded library: MAJOR * 10000 + MINOR * 100 + PATCH.");
  m.def(
      "capabilities", [] { return kvcomm::capabilities().toString(); },
      "What this machine and build can do, as kvcomm-info prints it.");
  m.def(
      "built_with_cuda", [] { return kvcomm::capabilities().builtWithCuda; },
      "Whether libkvcomm was compiled with its CUDA backend.");
  m.def("use_local_device", &kvcomm::useLocalDevice, nb::arg("local_rank"),
        "Makes CUDA device local_rank % count current on this thread; returns its ordinal, or -1 without a GPU.");
  kvcomm::py::bindErrors(m);
  kvcomm::py::bindArrays(m);
  kvcomm::py::bindLimits(m);
  kvcomm::py::bindComm(m);
  kvcomm::py::bindSymm(m);
  kvcomm::py::bindPublish(m);
  kvcomm::py::bindBarrier(m);
  kvcomm::py::bindFetch(m);
  kvcomm::py::bindArena(m);
  kvcomm::py::bindEndpoint(m);
  kvcomm::py::bindConversion(m);
}
