#include "endpoint/notify_wire.hpp"

#include <cstring>

#include "common/check.hpp"
#include "kvcomm/endpoint.hpp"

namespace kvcomm::detail {

namespace {

struct Head {
  uint64_t sender;
  uint64_t sequence;
  uint16_t nameBytes;
  uint16_t reserved;
  uint32_t messageBytes;
};
static_assert(sizeof(Head) == 24);

}  // namespace

std::vector<uint8_t> encodeNotify(const NotifyMessage& m) {
  KVCOMM_CHECK_ARG(m.message.size() <= kMaxNotificationBytes, "Endpoint notification", "a message of ",
                   m.message.size(), " bytes (at most kMaxNotificationBytes = ", kMaxNotificationBytes, ")");
  const size_t name = std::min(m.senderName.size(), kMaxNotifyName);
  Head h{m.sender, m.sequence, static_cast<uint16_t>(name), 0, static_cast<uint32_t>(m.message.size())};
  std::vector<uint8_t> out(sizeof(h) + name + m.message.size());
  std::memcpy(out.data(), &h, sizeof(h));
  if (name) std::memcpy(out.data() + sizeof(h), m.senderName.data(), name);
  if (!m.message.empty()) std::memcpy(out.data() + sizeof(h) + name, m.message.data(), m.message.size());
  return out;
}

std::string decodeNotify(const void* data, size_t bytes, NotifyMessage* out) {
  Head h;
  if (bytes < sizeof(h)) return cat("a notification of ", bytes, " bytes (at least ", sizeof(h), ")");
  const auto* p = static_cast<const uint8_t*>(data);
  std::memcpy(&h, p, sizeof(h));
  if (h.sequence == 0) return "a notification with sequence number 0";
  if (h.nameBytes > kMaxNotifyName)
    return cat("a notification whose sender name has ", h.nameBytes, " bytes (at most ", kMaxNotifyName, ")");
  if (h.messageBytes > kMaxNotificationBytes)
    return cat("a notification of ", h.messageBytes, " bytes (at most ", kMaxNotificationBytes, ")");
  if (bytes != sizeof(h) + h.nameBytes + h.messageBytes)
    return cat("a notification of ", bytes, " bytes whose lengths add up to ",
               sizeof(h) + h.nameBytes + h.messageBytes);
  out->sender = h.sender;
  out->sequence = h.sequence;
  out->senderName.assign(reinterpret_cast<const char*>(p + sizeof(h)), h.nameBytes);
  out->message.assign(reinterpret_cast<const char*>(p + sizeof(h) + h.nameBytes), h.messageBytes);
  return "";
}

}  // namespace kvcomm::detail
