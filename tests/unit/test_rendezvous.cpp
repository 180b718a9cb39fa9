// The symmetric-memory rendezvous's request check (symm/rendezvous.hpp, phase 1): which difference among members'
// requests is reported. Requests are built here as the members of a mixed group would send them.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kvcomm/error.hpp"
#include "kvcomm/symm.hpp"
#include "symm/rendezvous.hpp"

namespace {

using kvcomm::detail::HandleKind;
using kvcomm::detail::SymmOp;
using kvcomm::detail::SymmRequest;

// What a member asks for in create(comm, 64 MiB, 4 KiB, kind): sizes rounded to its backend's granularity.
SymmRequest createRequest(kvcomm::MemoryKind kind, HandleKind handles, uint64_t gran) {
  SymmRequest r{};
  r.version = 1;
  r.op = static_cast<uint32_t>(SymmOp::Create);
  r.bufferId = 42;
  r.generation = 1;
  r.capacity = ((64u << 20) + gran - 1) / gran * gran;
  r.opBytes = (4096 + gran - 1) / gran * gran;
  r.granularity = gran;
  r.memKind = static_cast<uint32_t>(kind);
  r.handleKind = static_cast<uint32_t>(handles);
  return r;
}

std::string refusal(std::vector<SymmRequest> all) {
  try {
    kvcomm::detail::checkRequests(all);
  } catch (const kvcomm::InvalidArgumentError& e) {
    return e.what();
  }
  return "";
}

// Memory kind Auto resolved differently on one member (no CUDA context there): the members' granularities and rounded
// sizes differ too, but the error names the cause, the kind (docs/api/symmetric-memory.md, "Memory kinds").
TEST(Rendezvous, AKindMismatchIsReportedAsSuchNotAsAGranularityMismatch) {
  const SymmRequest cuda = createRequest(kvcomm::MemoryKind::Cuda, HandleKind::CudaPosixFd, 2u << 20);
  const SymmRequest host = createRequest(kvcomm::MemoryKind::Host, HandleKind::MemFd, 4096);
  ASSERT_NE(cuda.opBytes, host.opBytes);
  std::string m = refusal({cuda, cuda, host, cuda});
  EXPECT_NE(
      m.find("SymmetricBuffer create rendezvous: the memory kind must be the same on every member: rank 2 has host, "
             "rank 0 has cuda"),
      std::string::npos)
      << m;
}

// Same kind, another handle type (KVCOMM_HANDLE_TYPE differs): named as such, before the granularity it implies.
TEST(Rendezvous, AHandleTypeMismatchIsReportedBeforeTheSizes) {
  const SymmRequest fd = createRequest(kvcomm::MemoryKind::Cuda, HandleKind::CudaPosixFd, 2u << 20);
  SymmRequest ipc = createRequest(kvcomm::MemoryKind::Cuda, HandleKind::CudaIpc, 2u << 20);
  ipc.capacity += 2u << 20;  // legacy IPC rounds differently: the sizes differ as well
  std::string m = refusal({fd, ipc});
  EXPECT_NE(m.find("the handle type must be the same on every member: rank 1 has cuda_ipc, rank 0 has posix_fd "
                   "(KVCOMM_HANDLE_TYPE differs?)"),
            std::string::npos)
      << m;
}

// The order of the collectives still comes first, and equal kinds still get the size checks.
TEST(Rendezvous, OperationOrderThenSizes) {
  const SymmRequest a = createRequest(kvcomm::MemoryKind::Host, HandleKind::MemFd, 4096);
  SymmRequest grow = createRequest(kvcomm::MemoryKind::Cuda, HandleKind::CudaPosixFd, 2u << 20);
  grow.op = static_cast<uint32_t>(SymmOp::Grow);
  EXPECT_NE(
      refusal({a, grow}).find("the collective must be the same on every member: rank 1 has grow, rank 0 has create"),
      std::string::npos);
  SymmRequest bigger = a;
  bigger.capacity *= 2;
  EXPECT_NE(refusal({a, a, bigger})
                .find("capacity must be the same on every member: rank 2 has 134217728, rank 0 has 67108864"),
            std::string::npos);
  EXPECT_EQ(refusal({a, a, a}), "");
}

}  // namespace
