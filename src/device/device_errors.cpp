#include "device/device_errors.hpp"

#include <cstring>
#include <new>

#include "common/check.hpp"
#include "device/device_memory.hpp"

namespace kvcomm::detail {

ErrorRecordMemory::ErrorRecordMemory(MemoryKind kind) : kind_(kind) {
  if (kind_ == MemoryKind::Cuda) {
    rec_ = static_cast<DeviceErrorRecord*>(deviceAlloc(sizeof(DeviceErrorRecord)));
    try {
      deviceMemset(rec_, 0, sizeof(DeviceErrorRecord));
    } catch (...) {
      deviceFree(rec_);
      throw;
    }
  } else {
    rec_ = new DeviceErrorRecord{};
  }
}

ErrorRecordMemory::~ErrorRecordMemory() {
  if (kind_ == MemoryKind::Cuda)
    deviceFree(rec_);
  else
    delete rec_;
}

DeviceError readDeviceError(MemoryKind kind, DeviceErrorRecord* rec) {
  DeviceErrorRecord r{};
  if (kind == MemoryKind::Cuda)
    deviceToHost(&r, rec, sizeof(r));
  else
    std::memcpy(&r, rec, sizeof(r));
  if (r.flag != 1) return {};
  if (kind == MemoryKind::Cuda)
    deviceMemset(rec, 0, sizeof(r));
  else
    std::memset(static_cast<void*>(rec), 0, sizeof(r));
  DeviceError e;
  e.kind = static_cast<DeviceErrorKind>(r.kind);
  e.tokenIndex = r.index;
  e.slot = r.slot;
  e.tensor = r.tensor;
  e.rank = r.rank;
  e.peer = r.peer;
  e.lane = r.lane;
  return e;
}

void throwDeviceError(const DeviceError& e, uint64_t timeoutMs) {
  switch (e.kind) {
    case DeviceErrorKind::None:
      return;
    case DeviceErrorKind::SlotOutOfRange:
      KVCOMM_THROW(InvalidArgument, "publish (device)", "token ", e.tokenIndex, ": slot ", e.slot, " of tensor ",
                   e.tensor,
                   " lands outside the tensor's region (offset + limitBytes) or the backed part of the buffer; that "
                   "row was not written");
    case DeviceErrorKind::PeerFailed:
      KVCOMM_THROW(Aborted, "barrier (device)", "rank ", e.rank, " stopped waiting for peer ", e.peer, " on lane ",
                   e.lane, ": the communicator was aborted or a member died");
    case DeviceErrorKind::BarrierTimeout:
      KVCOMM_THROW(Timeout, "barrier (device)", "rank ", e.rank, " waited for peer ", e.peer, " on lane ", e.lane,
                   " longer than ", timeoutMs, " ms (the peer never arrived)");
    case DeviceErrorKind::LaneOutOfRange:
      KVCOMM_THROW(InvalidArgument, "barrier (device)", "rank ", e.rank, " called a device barrier function on lane ",
                   e.lane, ", outside the barrier's lanes; it signalled and waited for nothing");
    case DeviceErrorKind::BlockOutOfRange:
      KVCOMM_THROW(InvalidArgument, "fetch (device)", "pair ", e.tokenIndex, ": block id ", e.slot, " (source rank ",
                   e.peer, ", region ", e.tensor,
                   ") is outside the layout; that pair was not copied (other pairs were)");
    case DeviceErrorKind::BatchRefused: {
      std::string what;
      switch (static_cast<RefusalReason>(e.lane)) {
        case RefusalReason::SourceOutOfRange:
          what = cat("source block ", e.slot, " is outside the layout of source rank ", e.peer);
          break;
        case RefusalReason::DestinationOutOfRange:
          what = cat("destination block ", e.slot, " is outside this rank's layout");
          break;
        case RefusalReason::DuplicateDestination:
          what = cat("destination block ", e.slot, " is already written by an earlier pair (duplicate destination)");
          break;
        case RefusalReason::ReadsWrittenBlock:
          what = cat("source block ", e.slot, " of this rank is also written by the batch (a batch must not read a ",
                     "local block it writes)");
          break;
        default:
          what = cat("reason ", e.lane, ", block ", e.slot);
          break;
      }
      KVCOMM_THROW(InvalidArgument, "fetch (checked on the device)", "request ", e.tensor, ", pair ", e.tokenIndex,
                   ": ", what, "; nothing of the batch was copied");
    }
  }
  KVCOMM_THROW(InternalError, "device error", "unknown kind ", static_cast<int>(e.kind));
}

}  // namespace kvcomm::detail
