// kvcomm: errors found by device code (or by its CPU twin), as the host reads them back.
#pragma once

#include <cstdint>

#include "kvcomm/device/error_record.hpp"

namespace kvcomm {

/// A device error read back by pollError() of Publisher, Barrier or Fetcher. Fields that do not apply are -1.
struct DeviceError {
  DeviceErrorKind kind = DeviceErrorKind::None;
  int64_t tokenIndex = -1;  ///< SlotOutOfRange: token index; BlockOutOfRange: index of the block pair; BatchRefused:
                            ///< index of the pair in its request
  int64_t slot = -1;        ///< SlotOutOfRange: the slot; BlockOutOfRange, BatchRefused: the offending block id
  int tensor = -1;  ///< SlotOutOfRange: tensor index; BlockOutOfRange: region index; BatchRefused: request index
  int rank = -1;    ///< rank that detected it
  int peer = -1;    ///< BarrierTimeout, PeerFailed: the peer waited for; BlockOutOfRange, BatchRefused: source rank
  int lane = -1;    ///< BarrierTimeout, PeerFailed, LaneOutOfRange: the lane; BatchRefused: the RefusalReason
  explicit operator bool() const { return kind != DeviceErrorKind::None; }
};

}  // namespace kvcomm
