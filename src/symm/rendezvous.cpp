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
  checkRequests(all, worldRanksOf(comm));
  return all;
}

void checkRequests(std::vector<SymmRequest>& all, const MemberName& name) {
  // Names travel as fixed-size text from other processes: terminate them before anyone reads them as strings.
  for (SymmRequest& x : all) x.socketName[sizeof(x.socketName) - 1] = '\0';
  if (all.empty()) return;
  const std::string call = cat("SymmetricBuffer ", symmOpName(static_cast<SymmOp>(all[0].op)), " rendezvous");
  const std::string same = "every member must make the same call";
  auto field = [&](const char* what, auto get) { requireSame(all, get, call.c_str(), what, asPrinted, name, same); };
  field("the protocol version", [](const SymmRequest& x) { return x.version; });
  requireSame(
      all, [](const SymmRequest& x) { return x.op; }, call.c_str(), "the collective",
      [](uint32_t op) { return symmOpName(static_cast<SymmOp>(op)); }, name, "collectives called in a different order");
  // The kind and handle type before the sizes: they decide the granularity (and with it the rounded capacity), so a
  // member on another kind would otherwise be reported as a granularity or capacity mismatch.
  requireSame(
      all, [](const SymmRequest& x) { return x.memKind; }, call.c_str(), "the memory kind",
      [](uint32_t k) { return memoryKindName(static_cast<MemoryKind>(k)); }, name);
  requireSame(
      all, [](const SymmRequest& x) { return x.handleKind; }, call.c_str(), "the handle type",
      [](uint32_t k) { return handleKindName(static_cast<HandleKind>(k)); }, name, "KVCOMM_HANDLE_TYPE differs?");
  field("generation", [](const SymmRequest& x) { return x.generation; });
  field("capacity", [](const SymmRequest& x) { return x.capacity; });
  const uint32_t op = all[0].op;  // the same on every member by now
  field(op == static_cast<uint32_t>(SymmOp::Grow)    ? "newBytes"
        : op == static_cast<uint32_t>(SymmOp::Adopt) ? "reservedBytes"
                                                     : "initialBytes",
        [](const SymmRequest& x) { return x.opBytes; });
  field("the range count", [](const SymmRequest& x) { return x.numRanges; });
  requireSame(
      all, [](const SymmRequest& x) { return x.rangesHash; }, call.c_str(), "the announced ranges",
      [](uint64_t h) { return cat("hash ", h); }, name, same);
  field("granularity", [](const SymmRequest& x) { return x.granularity; });
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
