// libFuzzer target: the fetch server's decoding and re-validation of a request (and the hello, hello reply and
// reply decoders), over bytes an attacker controls. The body and its invariants are in
// tests/support/fetch_wire_fuzz.hpp (the unit tests run it over random inputs in every CI run).
#include <cstddef>
#include <cstdint>

#include "support/fetch_wire_fuzz.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kvcomm::detail::fuzzFetchRequest(data, size);
  return 0;
}
