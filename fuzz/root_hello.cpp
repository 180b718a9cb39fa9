// The bootstrap root's decoding of a joining rank's hello, and the refusal it answers with.
#include <cstdint>
#include <cstring>
#include <vector>

#include "comm/wire.hpp"
#include "fuzz_check.hpp"

using namespace kvcomm::detail;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < sizeof(Hello) + 2) return 0;
  Hello h;
  std::memcpy(&h, data, sizeof(h));
  int groupSize = 1 + data[sizeof(Hello)] % 64;
  uint8_t bits = data[sizeof(Hello) + 1];
  std::vector<bool> joined(static_cast<size_t>(groupSize));
  for (size_t i = 0; i < joined.size(); ++i) joined[i] = (bits >> (i % 7)) & 1;
  Nonce nonce = (bits & 0x80) ? Nonce{} : h.nonce;  // mostly the right nonce, so the later checks are reached
  std::string why = rootHelloRefusal(h, nonce, groupSize, joined);
  if (why.empty()) {
    FUZZ_CHECK(h.magic == kWireMagic && h.nonce == nonce && h.size == groupSize);
    FUZZ_CHECK(h.rank > 0 && h.rank < groupSize && !joined[static_cast<size_t>(h.rank)]);
    FUZZ_CHECK(h.listenAddr.valid());
    FUZZ_CHECK(!h.listenAddr.toString().empty());
  } else {
    HelloReply r = refusalReply(why);
    FUZZ_CHECK(r.status == 1 && strnlen(r.message, sizeof(r.message)) < sizeof(r.message));
  }
  (void)meshHelloRefusal(h, nonce, groupSize);
  return 0;
}
