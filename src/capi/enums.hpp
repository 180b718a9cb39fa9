// The one place where the C ABI's enums are converted, both ways. A C caller may pass any integer where kvcomm.h
// says an enum (C enums are integers): kvcomm.h fixes every enum's underlying type to unsigned int under C++
// (KVCOMM_ENUM_BASE), so a value such as 9 or 4294967295 is read as that integer without undefined behaviour, and
// fromC() compares it with the enum's table before anything converts it. One table per enum lists its enumerators in
// order (the C value is the index), each with its name and the C++ value it stands for.
#pragma once

#include <climits>
#include <cstddef>
#include <iterator>
#include <type_traits>

#include "common/check.hpp"
#include "kvcomm/arena.hpp"
#include "kvcomm/comm.hpp"
#include "kvcomm/device_error.hpp"
#include "kvcomm/endpoint.hpp"
#include "kvcomm/error.hpp"
#include "kvcomm/fetch.hpp"
#include "kvcomm/kv_contents.hpp"
#include "kvcomm/kvcomm.h"
#include "kvcomm/publish.hpp"
#include "kvcomm/symm.hpp"

namespace kvcomm::capi {

/// One enumerator of a C enum: its C value, its name, and what it stands for in C++.
template <typename C, typename Cpp>
struct EnumEntry {
  C c;
  const char* name;
  Cpp cpp;
};

/// The table of C enum `C`: `name` (its C type name) and `entries` (every enumerator, entries[i].c == i).
template <typename C>
struct CEnum;

template <>
struct CEnum<kvcommResult_t> {  // C++ counterpart: the short name kvcommGetErrorString returns
  static constexpr const char* name = "kvcommResult_t";
  static constexpr EnumEntry<kvcommResult_t, const char*> entries[] = {
      {kvcommSuccess, "kvcommSuccess", "Success"},
      {kvcommInvalidArgument, "kvcommInvalidArgument", "InvalidArgument"},
      {kvcommUnsupported, "kvcommUnsupported", "Unsupported"},
      {kvcommSystemError, "kvcommSystemError", "SystemError"},
      {kvcommCudaError, "kvcommCudaError", "CudaError"},
      {kvcommNetworkError, "kvcommNetworkError", "NetworkError"},
      {kvcommRemoteError, "kvcommRemoteError", "RemoteError"},
      {kvcommTimeout, "kvcommTimeout", "Timeout"},
      {kvcommAborted, "kvcommAborted", "Aborted"},
      {kvcommInternalError, "kvcommInternalError", "InternalError"},
      {kvcommBusy, "kvcommBusy", "Busy"}};
};

template <>
struct CEnum<kvcommAxis_t> {
  static constexpr const char* name = "kvcommAxis_t";
  static constexpr EnumEntry<kvcommAxis_t, Axis> entries[] = {{kvcommAxisTP, "kvcommAxisTP", Axis::TP},
                                                              {kvcommAxisPCP, "kvcommAxisPCP", Axis::PCP},
                                                              {kvcommAxisPP, "kvcommAxisPP", Axis::PP},
                                                              {kvcommAxisDP, "kvcommAxisDP", Axis::DP}};
};

template <>
struct CEnum<kvcommMemoryKind_t> {
  static constexpr const char* name = "kvcommMemoryKind_t";
  static constexpr EnumEntry<kvcommMemoryKind_t, MemoryKind> entries[] = {
      {kvcommMemoryAuto, "kvcommMemoryAuto", MemoryKind::Auto},
      {kvcommMemoryCuda, "kvcommMemoryCuda", MemoryKind::Cuda},
      {kvcommMemoryHost, "kvcommMemoryHost", MemoryKind::Host}};
};

template <>
struct CEnum<kvcommSlotType_t> {
  static constexpr const char* name = "kvcommSlotType_t";
  static constexpr EnumEntry<kvcommSlotType_t, SlotType> entries[] = {
      {kvcommSlotInt64, "kvcommSlotInt64", SlotType::Int64}, {kvcommSlotInt32, "kvcommSlotInt32", SlotType::Int32}};
};

template <>
struct CEnum<kvcommPublishThen_t> {
  static constexpr const char* name = "kvcommPublishThen_t";
  static constexpr EnumEntry<kvcommPublishThen_t, PublishThen> entries[] = {
      {kvcommPublishThenNothing, "kvcommPublishThenNothing", PublishThen::Nothing},
      {kvcommPublishThenBarrier, "kvcommPublishThenBarrier", PublishThen::Barrier},
      {kvcommPublishThenSignal, "kvcommPublishThenSignal", PublishThen::Signal}};
};

template <>
struct CEnum<kvcommPublishMode_t> {
  static constexpr const char* name = "kvcommPublishMode_t";
  static constexpr EnumEntry<kvcommPublishMode_t, PublishMode> entries[] = {
      {kvcommPublishDirect, "kvcommPublishDirect", PublishMode::Direct},
      {kvcommPublishFallback, "kvcommPublishFallback", PublishMode::Fallback}};
};

template <>
struct CEnum<kvcommDeviceErrorKind_t> {
  static constexpr const char* name = "kvcommDeviceErrorKind_t";
  static constexpr EnumEntry<kvcommDeviceErrorKind_t, DeviceErrorKind> entries[] = {
      {kvcommDeviceErrorNone, "kvcommDeviceErrorNone", DeviceErrorKind::None},
      {kvcommDeviceErrorSlotOutOfRange, "kvcommDeviceErrorSlotOutOfRange", DeviceErrorKind::SlotOutOfRange},
      {kvcommDeviceErrorBarrierTimeout, "kvcommDeviceErrorBarrierTimeout", DeviceErrorKind::BarrierTimeout},
      {kvcommDeviceErrorBlockOutOfRange, "kvcommDeviceErrorBlockOutOfRange", DeviceErrorKind::BlockOutOfRange},
      {kvcommDeviceErrorPeerFailed, "kvcommDeviceErrorPeerFailed", DeviceErrorKind::PeerFailed},
      {kvcommDeviceErrorLaneOutOfRange, "kvcommDeviceErrorLaneOutOfRange", DeviceErrorKind::LaneOutOfRange},
      {kvcommDeviceErrorBatchRefused, "kvcommDeviceErrorBatchRefused", DeviceErrorKind::BatchRefused}};
};

template <>
struct CEnum<kvcommFetchPath_t> {
  static constexpr const char* name = "kvcommFetchPath_t";
  static constexpr EnumEntry<kvcommFetchPath_t, FetchPath> entries[] = {
      {kvcommFetchPathAuto, "kvcommFetchPathAuto", FetchPath::Auto},
      {kvcommFetchPathKernel, "kvcommFetchPathKernel", FetchPath::Kernel},
      {kvcommFetchPathCopyEngine, "kvcommFetchPathCopyEngine", FetchPath::CopyEngine},
      {kvcommFetchPathHost, "kvcommFetchPathHost", FetchPath::Host},
      {kvcommFetchPathNetwork, "kvcommFetchPathNetwork", FetchPath::Network}};
};

template <>
struct CEnum<kvcommFetchValidation_t> {
  static constexpr const char* name = "kvcommFetchValidation_t";
  static constexpr EnumEntry<kvcommFetchValidation_t, FetchValidation> entries[] = {
      {kvcommFetchValidationHost, "kvcommFetchValidationHost", FetchValidation::Host},
      {kvcommFetchValidationDevice, "kvcommFetchValidationDevice", FetchValidation::Device}};
};

template <>
struct CEnum<kvcommFetchTransport_t> {
  static constexpr const char* name = "kvcommFetchTransport_t";
  static constexpr EnumEntry<kvcommFetchTransport_t, FetchTransportKind> entries[] = {
      {kvcommFetchTransportNone, "kvcommFetchTransportNone", FetchTransportKind::None},
      {kvcommFetchTransportPeer, "kvcommFetchTransportPeer", FetchTransportKind::Peer},
      {kvcommFetchTransportTcp, "kvcommFetchTransportTcp", FetchTransportKind::Tcp},
      {kvcommFetchTransportRdma, "kvcommFetchTransportRdma", FetchTransportKind::Rdma}};
};

template <>
struct CEnum<kvcommFetchState_t> {
  static constexpr const char* name = "kvcommFetchState_t";
  static constexpr EnumEntry<kvcommFetchState_t, FetchState> entries[] = {
      {kvcommFetchInProgress, "kvcommFetchInProgress", FetchState::InProgress},
      {kvcommFetchDone, "kvcommFetchDone", FetchState::Done},
      {kvcommFetchFailed, "kvcommFetchFailed", FetchState::Failed}};
};

template <>
struct CEnum<kvcommArenaOwnerLoss_t> {
  static constexpr const char* name = "kvcommArenaOwnerLoss_t";
  static constexpr EnumEntry<kvcommArenaOwnerLoss_t, OwnerLoss> entries[] = {
      {kvcommArenaOwnerLossKeep, "kvcommArenaOwnerLossKeep", OwnerLoss::Keep},
      {kvcommArenaOwnerLossRelease, "kvcommArenaOwnerLossRelease", OwnerLoss::Release}};
};

template <>
struct CEnum<kvcommAccess_t> {
  static constexpr const char* name = "kvcommAccess_t";
  static constexpr EnumEntry<kvcommAccess_t, Access> entries[] = {
      {kvcommAccessReadWrite, "kvcommAccessReadWrite", Access::ReadWrite},
      {kvcommAccessReadOnly, "kvcommAccessReadOnly", Access::ReadOnly}};
};

template <>
struct CEnum<kvcommTransferVia_t> {
  static constexpr const char* name = "kvcommTransferVia_t";
  static constexpr EnumEntry<kvcommTransferVia_t, TransferVia> entries[] = {
      {kvcommTransferViaAuto, "kvcommTransferViaAuto", TransferVia::Auto},
      {kvcommTransferViaPeer, "kvcommTransferViaPeer", TransferVia::Peer},
      {kvcommTransferViaTcp, "kvcommTransferViaTcp", TransferVia::Tcp},
      {kvcommTransferViaRdma, "kvcommTransferViaRdma", TransferVia::Rdma}};
};

template <>
struct CEnum<kvcommKvOrder_t> {
  static constexpr const char* name = "kvcommKvOrder_t";
  static constexpr EnumEntry<kvcommKvOrder_t, KvOrder> entries[] = {
      {kvcommKvOrderTokensHeadsDim, "kvcommKvOrderTokensHeadsDim", KvOrder::TokensHeadsDim},
      {kvcommKvOrderHeadsTokensDim, "kvcommKvOrderHeadsTokensDim", KvOrder::HeadsTokensDim}};
};

/// Number of enumerators of C enum `C`.
template <typename C>
inline constexpr unsigned kEnumSize = static_cast<unsigned>(std::size(CEnum<C>::entries));

/// Whether a table is well formed: the C type's underlying type is fixed to unsigned int (kvcomm.h) and entry i
/// holds C value i.
template <typename C>
constexpr bool wellFormed() {
  if (!std::is_same_v<std::underlying_type_t<C>, unsigned int>) return false;
  for (unsigned i = 0; i < kEnumSize<C>; ++i)
    if (static_cast<unsigned>(CEnum<C>::entries[i].c) != i) return false;
  return true;
}
static_assert(wellFormed<kvcommResult_t>() && kEnumSize<kvcommResult_t> == kvcommNumResults, "kvcommResult_t");
static_assert(wellFormed<kvcommAxis_t>() && kEnumSize<kvcommAxis_t> == 4, "kvcommAxis_t");
static_assert(wellFormed<kvcommMemoryKind_t>() && kEnumSize<kvcommMemoryKind_t> == 3, "kvcommMemoryKind_t");
static_assert(wellFormed<kvcommSlotType_t>() && kEnumSize<kvcommSlotType_t> == 2, "kvcommSlotType_t");
static_assert(wellFormed<kvcommPublishMode_t>() && kEnumSize<kvcommPublishMode_t> == 2, "kvcommPublishMode_t");
static_assert(wellFormed<kvcommDeviceErrorKind_t>() && kEnumSize<kvcommDeviceErrorKind_t> == 7,
              "kvcommDeviceErrorKind_t");
static_assert(wellFormed<kvcommFetchPath_t>() && kEnumSize<kvcommFetchPath_t> == 5, "kvcommFetchPath_t");
static_assert(wellFormed<kvcommFetchValidation_t>() && kEnumSize<kvcommFetchValidation_t> == 2,
              "kvcommFetchValidation_t");
static_assert(wellFormed<kvcommFetchTransport_t>() && kEnumSize<kvcommFetchTransport_t> == 4, "kvcommFetchTransport_t");
static_assert(wellFormed<kvcommFetchState_t>() && kEnumSize<kvcommFetchState_t> == 3, "kvcommFetchState_t");
static_assert(wellFormed<kvcommArenaOwnerLoss_t>() && kEnumSize<kvcommArenaOwnerLoss_t> == 2, "kvcommArenaOwnerLoss_t");
static_assert(wellFormed<kvcommAccess_t>() && kEnumSize<kvcommAccess_t> == 2, "kvcommAccess_t");
static_assert(wellFormed<kvcommTransferVia_t>() && kEnumSize<kvcommTransferVia_t> == 4, "kvcommTransferVia_t");
static_assert(wellFormed<kvcommKvOrder_t>() && kEnumSize<kvcommKvOrder_t> == 2, "kvcommKvOrder_t");
static_assert(sizeof(kvcommAxis_t) == sizeof(unsigned int), "C enums keep the size of their C compatible type");

/// The integer a C enum value holds (any unsigned int: the type's underlying type is fixed).
template <typename C>
constexpr unsigned int rawOf(C value) noexcept {
  return static_cast<unsigned int>(value);
}

/// Whether `value` is one of C enum `C`'s enumerators.
template <typename C>
constexpr bool isEnumerator(C value) noexcept {
  return rawOf(value) < kEnumSize<C>;
}

/// The table entry of a valid value, or nullptr.
template <typename C>
constexpr const auto* entryOf(C value) noexcept {
  return isEnumerator(value) ? &CEnum<C>::entries[rawOf(value)] : nullptr;
}

/// The C++ value of C enum argument `what` of `call`: InvalidArgumentError naming the argument, the value (also as a
/// signed int when it reads negative) and the enum's range unless it is an enumerator.
template <typename C>
auto fromC(C value, const char* call, const char* what) {
  constexpr unsigned n = kEnumSize<C>;
  const unsigned int v = rawOf(value);
  KVCOMM_CHECK_ARG(v<n, call, what, " ", v, v> static_cast<unsigned>(INT_MAX)
                       ? detail::cat(" (", static_cast<long long>(v) - (1ll << 32), ")")
                       : std::string(),
                   " is not a ", CEnum<C>::name, " (", CEnum<C>::entries[0].name, " = 0 to ",
                   CEnum<C>::entries[n - 1].name, " = ", n - 1, ")");
  return CEnum<C>::entries[v].cpp;
}

/// The C value of a C++ one (InternalError when the table lacks it: a C++ enumerator without a C counterpart).
template <typename C, typename Cpp>
C toC(Cpp value) {
  for (const auto& e : CEnum<C>::entries)
    if (e.cpp == value) return e.c;
  KVCOMM_THROW(InternalError, "kvcomm C ABI", CEnum<C>::name, " has no value for C++ value ",
               static_cast<long long>(value));
}

/// The result code of an error code.
constexpr kvcommResult_t toResult(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::InvalidArgument:
      return kvcommInvalidArgument;
    case ErrorCode::Unsupported:
      return kvcommUnsupported;
    case ErrorCode::SystemError:
      return kvcommSystemError;
    case ErrorCode::CudaError:
      return kvcommCudaError;
    case ErrorCode::NetworkError:
      return kvcommNetworkError;
    case ErrorCode::RemoteError:
      return kvcommRemoteError;
    case ErrorCode::Timeout:
      return kvcommTimeout;
    case ErrorCode::Aborted:
      return kvcommAborted;
    case ErrorCode::InternalError:
      return kvcommInternalError;
    case ErrorCode::Busy:
      return kvcommBusy;
  }
  return kvcommInternalError;
}

}  // namespace kvcomm::capi
