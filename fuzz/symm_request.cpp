// The symmetric-memory rendezvous requests gathered from every member (phase 1): validation and the fd-server names
// the next phase connects to.
#include <cstdint>
#include <cstring>
#include <vector>

#include "fuzz_check.hpp"
#include "kvcomm/error.hpp"
#include "symm/rendezvous.hpp"

using namespace kvcomm::detail;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  size_t count = size / sizeof(SymmRequest);
  if (count == 0) return 0;
  std::vector<SymmRequest> all(count);
  std::memcpy(all.data(), data, count * sizeof(SymmRequest));
  bool accepted = true;
  try {
    checkRequests(all);
  } catch (const kvcomm::InvalidArgumentError&) {
    accepted = false;
  }
  for (const SymmRequest& r : all) FUZZ_CHECK(strnlen(r.socketName, sizeof(r.socketName)) < sizeof(r.socketName));
  if (accepted)
    for (const SymmRequest& r : all)
      FUZZ_CHECK(r.op == all[0].op && r.capacity == all[0].capacity && r.granularity == all[0].granularity);
  return 0;
}
