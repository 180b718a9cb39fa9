// libFuzzer target: an endpoint's decoding of a notification body (a peer's control request, kControlNotify), over
// bytes an attacker controls. Whatever decodes stays inside its bounds and re-encodes to the same notification.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "endpoint/notify_wire.hpp"
#include "fuzz_check.hpp"
#include "kvcomm/endpoint.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvcomm::detail;
  NotifyMessage m;
  if (!decodeNotify(data, size, &m).empty()) return 0;
  FUZZ_CHECK(m.sequence >= 1 && m.message.size() <= kvcomm::kMaxNotificationBytes);
  FUZZ_CHECK(m.senderName.size() <= size && m.message.size() <= size);
  std::vector<uint8_t> again = encodeNotify(m);
  NotifyMessage n;
  FUZZ_CHECK(decodeNotify(again.data(), again.size(), &n).empty());
  FUZZ_CHECK(n.sender == m.sender && n.sequence == m.sequence && n.message == m.message);
  FUZZ_CHECK(n.senderName == m.senderName.substr(0, kMaxNotifyName));
  return 0;
}
