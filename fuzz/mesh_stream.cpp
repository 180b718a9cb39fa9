// An inbound mesh connection as the progress thread decodes it: the hello, then frames (data connections) or
// liveness notices (watch connections), arriving in chunks of any size.
#include <cstdint>
#include <cstring>
#include <vector>

#include "comm/wire.hpp"
#include "fuzz_check.hpp"
#include "kvcomm/error.hpp"

using namespace kvcomm::detail;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < sizeof(Hello)) return 0;
  Hello h;
  std::memcpy(&h, data, sizeof(h));
  int groupSize = 1 + static_cast<int>(static_cast<uint32_t>(h.size) % 64);
  std::string why = meshHelloRefusal(h, h.nonce, groupSize);
  if (why.empty()) FUZZ_CHECK(h.rank >= 0 && h.rank < groupSize && h.size == groupSize);
  const char* rest = reinterpret_cast<const char*>(data) + sizeof(Hello);
  size_t left = size - sizeof(Hello);

  FrameReader frames;
  size_t delivered = 0;
  try {
    for (size_t at = 0; at < left;) {
      size_t chunk = std::min(left - at, static_cast<size_t>(1 + static_cast<uint8_t>(rest[at]) % 61));
      frames.append(rest + at, chunk);
      at += chunk;
      uint64_t tag;
      std::vector<char> payload;
      while (frames.next(&tag, &payload)) {
        delivered += sizeof(FrameHeader) + payload.size();
        FUZZ_CHECK(delivered <= at);
      }
      FUZZ_CHECK(delivered + frames.buffered() == at);
    }
  } catch (const kvcomm::Error&) {
    // an announced frame beyond kMaxFrameBytes: the connection is dropped
  }

  for (size_t off = 0; off + sizeof(WatchMsg) <= left; off += sizeof(WatchMsg)) {
    WatchMsg m;
    if (!decodeWatch(rest + off, groupSize, &m)) continue;
    FUZZ_CHECK(m.magic == kWireMagic);
    FUZZ_CHECK(strnlen(m.reason, sizeof(m.reason)) < sizeof(m.reason));
    if (m.kind == static_cast<uint32_t>(WatchKind::Gone)) FUZZ_CHECK(m.rank >= 0 && m.rank < groupSize);
  }
  return 0;
}
