// Unique ids as text (environment variables, command lines) and as bytes, and socket address text.
#include <cstdint>
#include <cstring>
#include <string>

#include "comm/wire.hpp"
#include "fuzz_check.hpp"
#include "kvcomm/bootstrap.hpp"
#include "kvcomm/error.hpp"

using namespace kvcomm::detail;

namespace {
void decodeId(const kvcomm::UniqueId& id) {
  try {
    IdWire w = decodeUniqueId(id);
    SockAddr a = idAddress(w);
    FUZZ_CHECK(a.valid());
    FUZZ_CHECK(a.port() == w.port);
    (void)a.toString();
  } catch (const kvcomm::InvalidArgumentError&) {
  }
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  try {
    kvcomm::UniqueId id = kvcomm::UniqueId::fromString(text);
    FUZZ_CHECK(kvcomm::UniqueId::fromString(id.toString()).bytes == id.bytes);
    decodeId(id);
  } catch (const kvcomm::InvalidArgumentError&) {
  }
  if (size >= sizeof(kvcomm::UniqueId::bytes)) {
    kvcomm::UniqueId raw;
    std::memcpy(raw.bytes.data(), data, raw.bytes.size());
    decodeId(raw);
  }
  try {
    SockAddr a = SockAddr::parse(text);
    FUZZ_CHECK(a.valid());
    FUZZ_CHECK(SockAddr::parse(a.toString()).toString() == a.toString());
  } catch (const kvcomm::InvalidArgumentError&) {
  }
  return 0;
}
