// kvcomm::Error -> the Python class registered for its code (kvcomm.Error hierarchy, defined in kvcomm/_errors.py),
// with the same message. Before the package registers its classes, errors surface as RuntimeError.
#include <array>

#include "bindings.hpp"
#include "kvcomm/error.hpp"

namespace kvcomm::py {

namespace {
// Borrowed-forever references (never decremented: the translator may run during interpreter shutdown).
std::array<PyObject*, 16> errorClasses{};

void setPythonError(const kvcomm::Error& e) {
  auto i = static_cast<size_t>(e.code());
  PyObject* cls = i < errorClasses.size() && errorClasses[i] ? errorClasses[i] : PyExc_RuntimeError;
  PyErr_SetString(cls, e.what());
}
}  // namespace

nb::object deviceErrorToPython(const DeviceError& e) {
  if (!e) return nb::none();
  nb::dict d;
  switch (e.kind) {
    case DeviceErrorKind::SlotOutOfRange:
      d["kind"] = "slot_out_of_range";
      break;
    case DeviceErrorKind::BarrierTimeout:
      d["kind"] = "barrier_timeout";
      break;
    case DeviceErrorKind::BlockOutOfRange:
      d["kind"] = "block_out_of_range";
      break;
    case DeviceErrorKind::PeerFailed:
      d["kind"] = "peer_failed";
      break;
    case DeviceErrorKind::LaneOutOfRange:
      d["kind"] = "lane_out_of_range";
      break;
    case DeviceErrorKind::BatchRefused:
      d["kind"] = "batch_refused";
      break;
    case DeviceErrorKind::None:
      break;
  }
  d["token_index"] = e.tokenIndex;
  d["slot"] = e.slot;
  d["tensor"] = e.tensor;
  d["rank"] = e.rank;
  d["peer"] = e.peer;
  d["lane"] = e.lane;
  return d;
}

void bindErrors(nb::module_& m) {
  nb::enum_<ErrorCode>(m, "ErrorCode", "What kind of failure an Error reports (kvcomm::ErrorCode).")
      .value("InvalidArgument", ErrorCode::InvalidArgument)
      .value("Unsupported", ErrorCode::Unsupported)
      .value("SystemError", ErrorCode::SystemError)
      .value("CudaError", ErrorCode::CudaError)
      .value("NetworkError", ErrorCode::NetworkError)
      .value("RemoteError", ErrorCode::RemoteError)
      .value("Timeout", ErrorCode::Timeout)
      .value("Aborted", ErrorCode::Aborted)
      .value("InternalError", ErrorCode::InternalError)
      .value("Busy", ErrorCode::Busy);
  m.def(
      "_register_error_class",
      [](ErrorCode code, nb::handle cls) {
        auto i = static_cast<size_t>(code);
        if (i >= errorClasses.size()) throw nb::value_error("error code out of range");
        Py_INCREF(cls.ptr());
        errorClasses[i] = cls.ptr();
      },
      nb::arg("code"), nb::arg("cls"), "Internal: the Python class raised for `code`.");
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const kvcomm::Error& e) {
      setPythonError(e);
    }
  });
}

}  // namespace kvcomm::py
