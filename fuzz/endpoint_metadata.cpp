// libFuzzer target: an endpoint's decoding of a peer's registration metadata (Endpoint::connect), over bytes an
// attacker controls. Whatever decodes re-encodes to metadata that decodes to the same registration.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "endpoint/metadata.hpp"
#include "fuzz_check.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvcomm::detail;
  EndpointMetadata m;
  if (!decodeMetadata(data, size, &m).empty()) return 0;
  std::vector<uint8_t> again = encodeMetadata(m);
  EndpointMetadata n;
  FUZZ_CHECK(decodeMetadata(again.data(), again.size(), &n).empty());
  FUZZ_CHECK(n.endpointId == m.endpointId && n.regionId == m.regionId && n.generation == m.generation);
  FUZZ_CHECK(std::memcmp(n.capability.bytes, m.capability.bytes, sizeof(m.capability.bytes)) == 0);
  FUZZ_CHECK(n.layoutHash == m.layoutHash && n.layout.regions.size() == m.layout.regions.size());
  FUZZ_CHECK(n.name == m.name && n.name.size() <= kMaxNameBytes);
  FUZZ_CHECK(n.contents.regions.size() == m.contents.regions.size());
  FUZZ_CHECK(m.contents.regions.empty() || m.contents.regions.size() == m.layout.regions.size());
  return 0;
}
