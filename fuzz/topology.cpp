// Member records gathered from every rank when a communicator forms (host identity, GPU, RDMA devices).
#include <cstdint>

#include "comm/topology_build.hpp"
#include "fuzz_check.hpp"

using namespace kvcomm::detail;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  size_t count = size / memberWireBytes();
  auto members = decodeMembers(data, count);
  FUZZ_CHECK(members.size() == count);
  for (size_t r = 0; r < count; ++r) {
    FUZZ_CHECK(members[r].rank == static_cast<int>(r));
    FUZZ_CHECK(members[r].hostname.size() <= 64 && members[r].bootId.size() <= 40);
    FUZZ_CHECK(members[r].gpu.uuid.size() <= 48 && members[r].gpu.pciBusId.size() <= 24);
    FUZZ_CHECK(members[r].rdmaDevices.size() <= 8);
  }
  return 0;
}
