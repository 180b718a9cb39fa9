// kvcomm's Python extension (_kvcomm): one bind function per concept. The pure-Python package (python/kvcomm) wraps
// these with array validation, stream selection and the torch / mpi4py bootstraps.
#pragma once

#include <nanobind/nanobind.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "kvcomm/device_error.hpp"
#include "kvcomm/kv_contents.hpp"
#include "kvcomm/kv_layout.hpp"
#include "kvcomm/stream.hpp"

namespace kvcomm {
struct FetchStatus;
}

namespace kvcomm::py {

namespace nb = nanobind;

void bindErrors(nb::module_& m);
void bindComm(nb::module_& m);
void bindSymm(nb::module_& m);
void bindPublish(nb::module_& m);
void bindBarrier(nb::module_& m);
void bindFetch(nb::module_& m);
void bindArena(nb::module_& m);
void bindArrays(nb::module_& m);
void bindLimits(nb::module_& m);
void bindEndpoint(nb::module_& m);
void bindConversion(nb::module_& m);

// A layout region as the package passes it (kvcomm/_fetch.py checked it): (offset, blockBytes, blockStride, numBlocks).
using RawRegion = std::tuple<size_t, size_t, size_t, size_t>;

/// The KvLayout of checked regions and the engine's version.
KvLayout toLayout(const std::vector<RawRegion>& regions, uint64_t version);

/// A layout as (regions, version), the form the package reads back.
std::tuple<std::vector<RawRegion>, uint64_t> fromLayout(const KvLayout& l);

// Contents of a region as the package passes them (kvcomm/conversion.py checked them): (elementBytes, headDim,
// tokensPerBlock, numHeads, headBegin, headEnd, order, replicated).
using RawContents = std::tuple<uint32_t, uint32_t, uint32_t, uint32_t, uint32_t, uint32_t, int, bool>;
KvDescription toDescription(const std::vector<RawContents>& raw);
std::vector<RawContents> fromDescription(const KvDescription& d);

/// A polled status as the package's FetchStatus is built from it: (state, bytesDone, bytesTotal, failedBlocks as an
/// int64 numpy array, error).
nb::object statusToPython(FetchStatus&& s);

// Arguments of the native methods the package exposes as they are (Communicator, UniqueId, ParallelGroups) are taken as
// Python objects and checked here, so that a wrong type or a value the C++ signature cannot hold is the library's
// InvalidArgumentError naming the argument and the value ("kvcomm [rank R] call: what ..."), never nanobind's
// TypeError and never a truncation. `rank` is this rank, or -1 where the call has none.

/// Integer argument `what`: a Python int or an object with __index__ (numpy ints, IntEnum members), not a bool,
/// within [lo, hi].
int64_t intArg(nb::handle v, const char* call, const char* what, int rank, int64_t lo, int64_t hi);

/// intArg within a C int's range.
inline int cIntArg(nb::handle v, const char* call, const char* what, int rank) {
  return static_cast<int>(intArg(v, call, what, rank, INT32_MIN, INT32_MAX));
}

/// Enum argument `what` given as an int (an IntEnum member or its value): one of [0, count), else
/// InvalidArgumentError "what V is not <enumText>" (or "must be <enumText>, got T" for another type).
int64_t enumArg(nb::handle v, const char* call, const char* what, int rank, int64_t count, const char* enumText);

/// String argument `what` (a Python str).
std::string strArg(nb::handle v, const char* call, const char* what, int rank);

/// Bytes argument `what` (a Python bytes object).
nb::bytes bytesArg(nb::handle v, const char* call, const char* what, int rank);

/// Throws InvalidArgumentError(message).
[[noreturn]] void argError(const std::string& message);

/// Throws the InvalidArgumentError of argument `what`: "kvcomm [rank R] call: what <cause>".
[[noreturn]] void argError(const char* call, const char* what, int rank, const std::string& cause);

/// Makes `Cls(...)` raise InvalidArgumentError saying where objects of this class come from (`how`), instead of
/// nanobind's TypeError ("no constructor defined").
template <typename T>
void refuseConstruction(nb::class_<T>& cls, const char* name, const char* how) {
  std::string message =
      std::string("kvcomm [rank -1] ") + name + ": " + name + "(...) is not constructed directly: " + how;
  cls.def("__init__", [message](T*, nb::args, nb::kwargs) { argError(message); });
}

/// The Python type name of `v`, for messages.
std::string typeNameOf(nb::handle v);

/// Object argument `what` of bound class T (not None); `typeName` names it for the message.
template <typename T>
T& objArg(nb::handle v, const char* call, const char* what, int rank, const char* typeName) {
  T* p = nullptr;
  if (v.is_none() || !nb::try_cast<T*>(v, p) || p == nullptr)
    argError(call, what, rank, std::string("must be a ") + typeName + ", got " + typeNameOf(v));
  return *p;
}

/// A device error as the dict poll_error() returns ({"kind": "slot_out_of_range" | "barrier_timeout" |
/// "block_out_of_range", "token_index", "slot", "tensor", "rank", "peer", "lane"}), or None when there is none.
nb::object deviceErrorToPython(const DeviceError& e);

/// poll_error() and check_errors() of the classes whose kernels record device errors (Publisher, Barrier, Fetcher):
/// spelt once, the device-error mix-in of the native module (python/kvcomm/_device_errors.py is the package's).
template <typename T, typename... Extra>
void defDeviceErrors(nb::class_<T, Extra...>& c, const char* pollDoc) {
  c.def(
       "poll_error",
       [](T& self) {
         DeviceError e;
         {
           nb::gil_scoped_release nogil;
           e = self.pollError();
         }
         return deviceErrorToPython(e);
       },
       pollDoc)
      .def("check_errors", &T::checkErrors, nb::call_guard<nb::gil_scoped_release>(),
           "Raises the recorded device error, if any.");
}

/// A stream handle the package passed as an int.
inline Stream toStream(uintptr_t s) {
  return reinterpret_cast<Stream>(s);
}

}  // namespace kvcomm::py
