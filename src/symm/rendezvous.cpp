#include "symm/rendezvous.hpp"

#include <cstring>

#include "comm/health.hpp"
#include "common/check.hpp"
#include "common/env.hpp"
#include "kvcomm/bootstrap.hpp"

namespace kvcomm::detail {

const char* symmOpName(SymmOp op) {
  switch (op) {
    case SymmOp::Create:
      return "create";
    case SymmOp::Grow:
      return "grow";
    case SymmOp::Adopt:
      return "adopt";
    case SymmOp::Commit:
      return "commit";
    case SymmOp::Release:
      return "release";
  }
  return "?";
}

uint64_t hashRanges(const std::vector<Range>& ranges) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xff;
      h *= 1099511628211ull;
    }
  };
  for (const Range& r : ranges) {
    mix(r.offset);
    mix(r.bytes);
  }
  return h;
}

std::vector<SymmRequest> agree(Communicator& comm, const SymmRequest& mine) {
  std::vector<SymmRequest> all(static_cast<size_t>(comm.size()));
  all[static_cast<size_t>(comm.rank())] = mine;
  comm.allgather(all.data(), sizeof(SymmRequest));
  checkRequests(all);
  return all;
}

void checkRequests(std::vector<SymmRequest>& all) {
  // Names travel as fixed-size text from other processes: terminate them before anyone reads them as strings.
  for (SymmRequest& x : all) x.socketName[sizeof(x.socketName) - 1] = '\0';
  if (all.empty()) return;
  const SymmRequest& ref = all[0];
  const char* op = symmOpName(static_cast<SymmOp>(ref.op));
  for (size_t r = 0; r < all.size(); ++r) {
    const SymmRequest& x = all[r];
    std::string call = cat("SymmetricBuffer ", op, " rendezvous");
    auto differs = [&](const char* what, uint64_t got, uint64_t want) {
      KVCOMM_THROW(InvalidArgument, call, "rank ", r, " passed ", what, " ", got, " but rank 0 passed ", want,
                   " (every member must make the same call)");
    };
    if (x.version != ref.version) differs("protocol version", x.version, ref.version);
    if (x.op != ref.op)
      KVCOMM_THROW(InvalidArgument, call, "rank ", r, " is in ", symmOpName(static_cast<SymmOp>(x.op)),
                   " while rank 0 is in ", op, " (collectives called in a different order)");
    // The kind and handle type before the sizes: they decide the granularity (and with it the rounded capacity), so a
    // member on another kind would otherwise be reported as a granularity or capacity mismatch.
    if (x.memKind != ref.memKind)
      KVCOMM_THROW(InvalidArgument, call, "rank ", r, " uses ", memoryKindName(static_cast<MemoryKind>(x.memKind)),
                   " memory but rank 0 uses ", memoryKindName(static_cast<MemoryKind>(ref.memKind)));
    if (x.handleKind != ref.handleKind)
      KVCOMM_THROW(InvalidArgument, call, "rank ", r, " exports ",
                   handleKindName(static_cast<HandleKind>(x.handleKind)), " handles but rank 0 exports ",
                   handleKindName(static_cast<HandleKind>(ref.handleKind)), " (KVCOMM_HANDLE_TYPE differs?)");
    if (x.generation != ref.generation) differs("generation", x.generation, ref.generation);
    if (x.capacity != ref.capacity) differs("capacity", x.capacity, ref.capacity);
    if (x.opBytes != ref.opBytes) {
      const char* what = x.op == static_cast<uint32_t>(SymmOp::Grow)    ? "newBytes"
                         : x.op == static_cast<uint32_t>(SymmOp::Adopt) ? "reservedBytes"
                                                                        : "initialBytes";
      differs(what, x.opBytes, ref.opBytes);
    }
    if (x.numRanges != ref.numRanges) differs("a range count of", x.numRanges, ref.numRanges);
    if (x.rangesHash != ref.rangesHash)
      KVCOMM_THROW(InvalidArgument, call, "rank ", r, " announced different ranges than rank 0");
    if (x.granularity != ref.granularity) differs("granularity", x.granularity, ref.granularity);
  }
}

std::vector<ExportSet> exchange(Communicator& comm, const std::vector<SymmRequest>& reqs,
                                const std::vector<Piece>& mine, const std::vector<bool>& mapped, uint64_t bufferId,
                                uint64_t generation) {
  int n = comm.size(), me = comm.rank();
  FdServer& server = FdServer::instance();
  // Tokens expire when this step ends, however it ends (a peer's failure, a death or an abort in any collective
  // below): the exported fds they hold close with them.
  struct RetireOnExit {
    FdServer& server;
    uint64_t bufferId, generation;
    ~RetireOnExit() { server.retire(bufferId, generation); }
  } retire{server, bufferId, generation};
  Outcome local;
  std::vector<Token> tokens(static_cast<size_t>(n) * static_cast<size_t>(n));
  try {
    auto set = std::make_shared<ExportSet>();
    for (const Piece& p : mine) {
      set->metas.push_back({p.offset, p.bytes, p.chunkOffset, p.chunk->bytes()});
      set->fds.push_back(p.chunk->exportFd());
    }
    for (int q = 0; q < n; ++q)
      if (q != me && mapped[static_cast<size_t>(q)])
        tokens[static_cast<size_t>(me) * n + q] = server.offer(
            bufferId, generation, q, reqs[static_cast<size_t>(q)].pid, reqs[static_cast<size_t>(q)].uid, set);
  } catch (...) {
    local = Outcome::fromCurrentException();
  }
  // Each rank's row of tokens: row p, column q = the token p issued to q.
  comm.allgather(tokens.data(), sizeof(Token) * static_cast<size_t>(n));
  std::vector<ExportSet> got(static_cast<size_t>(n));
  // Fetch failures are voted, so all ranks fail together; the exporter keeps its fds until the vote.
  allSucceed(comm, "SymmetricBuffer handle exchange", [&] {
    local.rethrow();
    for (int p = 0; p < n; ++p) {
      if (p == me || !mapped[static_cast<size_t>(p)]) continue;
      got[static_cast<size_t>(p)] = fetchFds(
          reqs[static_cast<size_t>(p)].socketName, tokens[static_cast<size_t>(p) * n + me], bufferId, generation, me,
          env::bootstrapTimeoutMs(), [&] { checkHealthy(comm, "SymmetricBuffer handle exchange"); });
    }
  });
  return got;
}

}  // namespace kvcomm::detail
