// The collective steps every symmetric-memory change goes through:
//   phase 1  agree():       allgather a request (version, sizes, granularity, handle type, pid, host, device) and
//                           validate it on every rank, so a mismatch is the same clear error everywhere;
//   phase 2  allSucceed():  after the failure-prone driver calls, allgather a success vote: all go on or all back off
//                           (comm/agreement.hpp);
//   phase 3  exchange():    serve this rank's new pieces through the fd server under one-use tokens, fetch every
//                           same-host member's pieces, then vote again before the tokens expire.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/agreement.hpp"
#include "kvcomm/comm.hpp"
#include "kvcomm/error.hpp"
#include "symm/fd_exchange.hpp"
#include "symm/memory_backend.hpp"

namespace kvcomm::detail {

enum class SymmOp : uint32_t { Create = 1, Grow = 2, Adopt = 3, Commit = 4, Release = 5 };
const char* symmOpName(SymmOp op);

/// What every member must agree on, plus who it is (for tokens and diagnostics).
struct SymmRequest {
  uint32_t version;
  uint32_t op;
  uint64_t bufferId;    // rank 0's choice is the buffer's id
  uint64_t generation;  // generation this step produces
  uint64_t capacity;
  uint64_t opBytes;     // initialBytes / newBytes / reservedBytes; 0 for commit/release
  uint64_t rangesHash;  // commit/release: hash of the ranges
  uint64_t granularity;
  uint32_t memKind;
  uint32_t handleKind;
  uint32_t numRanges;
  int32_t pid;
  uint32_t uid;
  int32_t device;
  int32_t hostIndex;
  int32_t reserved;
  char socketName[48];
};

/// Phase 1 (collective). Returns every member's request; throws InvalidArgumentError naming the first member whose
/// request differs from rank 0's (the same error on every rank).
std::vector<SymmRequest> agree(Communicator& comm, const SymmRequest& mine);
/// agree()'s validation of the gathered requests (bytes from other processes): terminates every socket name, then,
/// field by field (the collective, the memory kind and handle type, then the sizes), requireSame(): throws
/// InvalidArgumentError naming the field, a member whose value differs from the first one's (`name`: world ranks from
/// agree()), and both values.
void checkRequests(std::vector<SymmRequest>& all, const MemberName& name = groupRank);

/// Phase 3 (collective): offers `mine` to every member in `fetchFrom` that maps this rank, fetches each member in
/// `fetchFrom`'s pieces, and returns them (index = rank; empty for others). Tokens are retired before returning,
/// also on failure. Fetch errors are reported through a vote, so all ranks fail together.
std::vector<ExportSet> exchange(Communicator& comm, const std::vector<SymmRequest>& reqs,
                                const std::vector<Piece>& mine, const std::vector<bool>& mapped, uint64_t bufferId,
                                uint64_t generation);

/// FNV-1a over the ranges (validation that members announce the same change).
uint64_t hashRanges(const std::vector<Range>& ranges);

}  // namespace kvcomm::detail
