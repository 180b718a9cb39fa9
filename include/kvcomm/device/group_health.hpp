// kvcomm device API: the layout of a group's health area (one private page per communicator group, mapped for
// device code), written by the communicator's liveness on the host and read by every wait on the device.
#pragma once

namespace kvcomm {

/// Word index, in the group's health area (BarrierDeviceHandle::health), of member 0's departure word: health[0] is
/// the group's state, health[kHealthDepartedWord + r] becomes non-zero once member r left the group normally
/// (destroyed its communicator or exited). A wait for a member that left stops instead of running into its timeout.
inline constexpr int kHealthDepartedWord = 16;

}  // namespace kvcomm
