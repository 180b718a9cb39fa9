// Argument checks of the native methods the package exposes as they are (bindings.hpp: intArg, strArg, ...).
#include <nanobind/stl/string.h>

#include <string>

#include "bindings.hpp"
#include "kvcomm/error.hpp"

namespace kvcomm::py {

std::string typeNameOf(nb::handle v) {
  return nb::type_name(v.type()).c_str();
}

void argError(const std::string& message) {
  throw InvalidArgumentError(message);
}

void argError(const char* call, const char* what, int rank, const std::string& cause) {
  throw InvalidArgumentError("kvcomm [rank " + std::to_string(rank) + "] " + call + ": " + what + " " + cause);
}

namespace {

// The value as the caller wrote it, cut to a readable length (a repr that raises is not the caller's error here).
std::string shown(nb::handle v) {
  try {
    std::string s = nb::repr(v).c_str();
    return s.size() > 60 ? s.substr(0, 57) + "..." : s;
  } catch (const nb::python_error&) {
    return "<" + typeNameOf(v) + " without a repr>";
  }
}

// `v` as an int (a Python int or anything with __index__ but a bool) into `x` and its decimal text; false for
// another type, and false with `text` set for an int outside int64.
bool indexOf(nb::handle v, long long& x, std::string& text) {
  if (PyBool_Check(v.ptr()) || !PyIndex_Check(v.ptr())) return false;
  PyObject* index = PyNumber_Index(v.ptr());  // numpy's bool has __index__ but refuses it
  if (index == nullptr) {
    PyErr_Clear();
    return false;
  }
  int overflow = 0;
  x = PyLong_AsLongLongAndOverflow(index, &overflow);
  text = nb::str(nb::handle(index)).c_str();
  Py_DECREF(index);
  return overflow == 0;
}

}  // namespace

int64_t intArg(nb::handle v, const char* call, const char* what, int rank, int64_t lo, int64_t hi) {
  std::string range = "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  long long x = 0;
  std::string text;
  if (!indexOf(v, x, text) && text.empty())
    argError(call, what, rank, "must be an int in " + range + ", got " + typeNameOf(v) + " " + shown(v));
  if (!text.empty() && (x < lo || x > hi || std::to_string(x) != text))
    argError(call, what, rank, text + " is outside " + range);
  return x;
}

int64_t enumArg(nb::handle v, const char* call, const char* what, int rank, int64_t count, const char* enumText) {
  long long x = 0;
  std::string text;
  if (!indexOf(v, x, text) && text.empty())
    argError(call, what, rank, std::string("must be ") + enumText + ", got " + typeNameOf(v) + " " + shown(v));
  if (x < 0 || x >= count || std::to_string(x) != text) argError(call, what, rank, text + " is not " + enumText);
  return x;
}

std::string strArg(nb::handle v, const char* call, const char* what, int rank) {
  if (!nb::isinstance<nb::str>(v)) argError(call, what, rank, "must be a str, got " + typeNameOf(v) + " " + shown(v));
  return nb::cast<std::string>(v);
}

nb::bytes bytesArg(nb::handle v, const char* call, const char* what, int rank) {
  if (!nb::isinstance<nb::bytes>(v)) argError(call, what, rank, "must be bytes, got " + typeNameOf(v));
  return nb::borrow<nb::bytes>(v);
}

}  // namespace kvcomm::py
