// Notifications between endpoints on the wire: the body of a control request (kControlNotify) that the sender's
// endpoint sends over a TCP connection to one of the receiver's registrations (the hello checked its capability).
// Pure encode/decode (unit-tested and fuzzed): decoding trusts no length of the input.
//
// Body: {sender endpoint id u64, sequence u64, name length u16, reserved u16, message length u32, name, message}.
// The sequence numbers one sender's notifications to one receiving endpoint from 1 upwards: a receiver delivers
// each once (a resend after a lost reply carries the same number) and in order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kvcomm::detail {

/// Longest sender name a notification carries (the metadata's bound).
inline constexpr size_t kMaxNotifyName = 63;

struct NotifyMessage {
  uint64_t sender = 0;  ///< the sending endpoint's id
  uint64_t sequence = 0;
  std::string senderName;
  std::string message;
};

/// Throws InvalidArgument when the message exceeds kMaxNotificationBytes (the name is cut to kMaxNotifyName).
std::vector<uint8_t> encodeNotify(const NotifyMessage& m);
/// "" when `bytes` at `data` are a well-formed notification (sequence >= 1, lengths that add up, a message of at
/// most kMaxNotificationBytes), else why not.
std::string decodeNotify(const void* data, size_t bytes, NotifyMessage* out);

}  // namespace kvcomm::detail
