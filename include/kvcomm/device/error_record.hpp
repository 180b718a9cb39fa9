// kvcomm device API: the error record device code fills instead of trapping (a __trap() would leave a sticky error
// in the engine's context). The host reads it with pollError()/checkErrors() of the object that launched the kernel.
#pragma once

#include <stdint.h>

#include "kvcomm/device/macros.hpp"

namespace kvcomm {

/// What went wrong on the device.
enum class DeviceErrorKind : int32_t {
  None = 0,
  SlotOutOfRange = 1,   ///< a slot's row would land outside its tensor's region or the backed part of the buffer (or
                        ///< its destination would wrap); the row was not written
  BarrierTimeout = 2,   ///< a barrier wait expired; the peer never arrived
  BlockOutOfRange = 3,  ///< a fetch named a block id outside its layout; that block pair was not copied
  PeerFailed = 4,       ///< a barrier wait stopped: the communicator was aborted or a member died
  LaneOutOfRange = 5,   ///< a device barrier call named a lane outside [0, lanes); it signalled and waited for nothing
  BatchRefused = 6,     ///< a fetch checked on the device found a bad pair and copied nothing of its batch
};

/// BatchRefused: why (DeviceError::lane).
enum class RefusalReason : int32_t {
  SourceOutOfRange = 0,       ///< the source id is outside the source's layout (or negative other than -1)
  DestinationOutOfRange = 1,  ///< the destination id is outside this rank's layout (or negative other than -1)
  DuplicateDestination = 2,   ///< an earlier pair of the batch names the same destination block
  ReadsWrittenBlock = 3,      ///< a pair reads a block of this rank that a pair of the batch writes
};

/// First error wins; later ones are dropped until the host clears the record.
struct DeviceErrorRecord {
  int32_t flag;   ///< 0 = clear; set with an atomic compare-and-swap
  int32_t kind;   ///< DeviceErrorKind
  int64_t index;  ///< token index (SlotOutOfRange)
  int64_t slot;   ///< offending slot (SlotOutOfRange)
  int32_t tensor;
  int32_t rank;  ///< rank that detected it
  int32_t peer;  ///< peer waited for (BarrierTimeout, PeerFailed)
  int32_t lane;  ///< barrier lane (BarrierTimeout, PeerFailed, LaneOutOfRange)
};

#if KVCOMM_ON_DEVICE_COMPILER
/// Records an error unless one is already recorded. Any thread may call it.
KVCOMM_DEVICE_INLINE void recordDeviceError(DeviceErrorRecord* rec, DeviceErrorKind kind, int64_t index, int64_t slot,
                                            int tensor, int rank, int peer, int lane) {
  if (rec == nullptr) return;
  if (atomicCAS(&rec->flag, 0, -1) != 0) return;  // -1: being written
  rec->kind = static_cast<int32_t>(kind);
  rec->index = index;
  rec->slot = slot;
  rec->tensor = tensor;
  rec->rank = rank;
  rec->peer = peer;
  rec->lane = lane;
  __threadfence_system();
  atomicExch(&rec->flag, 1);
}
#endif

}  // namespace kvcomm
