// A fake libibverbs provider (a VerbsApi table) for unit tests of the verbs transport on machines without an RDMA
// device: one device, contexts, protection domains, memory regions, completion queues and RC queue pairs in this
// process. A READ copies memory (memcpy from the remote region named by its rkey into the local SGEs), a WRITE the
// other way, when a poll of its completion queue makes progress, a few work requests per poll, so they stay in
// flight for a while. The responder's queue pair must exist and be connected (else: retry exceeded, as a peer that
// went away), accept the operation (its access flags) and own the remote region (one protection domain).
// Checks as real hardware would: rkey, bounds and access of the remote region; lkeys, bounds and access of the
// local SGEs; queue pair states (a queue pair in ERR flushes what it holds). Injections: the n-th READ completes
// with a given status, work requests that never complete, a completion queue that overruns. Everything is counted, and
// misuse (more work requests in flight on a queue pair than its READ depth, queue pairs or completion queues destroyed
// with completions nobody reaped) is recorded as a violation.
#pragma once

#if KVCOMM_HAVE_VERBS

#include <cstdint>
#include <string>

#include "platform/ibverbs.hpp"

namespace kvtest::fakeverbs {

struct Config {
  int maxRdAtom = 4;           ///< device READ depth (max_qp_rd_atom and max_qp_init_rd_atom)
  int maxSge = 4;              ///< device max_sge
  uint32_t maxMsg = 1u << 20;  ///< port max_msg_sz
  int cqCapacity = 0;          ///< completion queues made from now on hold this many (0: as asked)
  int progressPerPoll = 2;     ///< READs executed per queue pair per poll
  uint64_t failNth = 0;        ///< the n-th work request posted after reset() completes with failStatus (0: none)
  ibv_wc_status failStatus = IBV_WC_REM_ACCESS_ERR;
  bool stall = false;  ///< READs never complete (a peer that went away without a word)
};

struct Counts {
  int contexts = 0, pds = 0, mrs = 0, cqs = 0, qps = 0;
  bool zero() const { return contexts == 0 && pds == 0 && mrs == 0 && cqs == 0 && qps == 0; }
};

struct Violations {
  int overDepth = 0;          ///< a READ posted beyond the queue pair's READ depth (max_rd_atomic)
  int unreapedAtDestroy = 0;  ///< a queue pair destroyed with READs in flight or completions not reaped
  int cqNotEmpty = 0;         ///< a completion queue destroyed with completions in it
  int badPost = 0;            ///< a post to a queue pair that is not ready to send
  std::string first;          ///< the first violation, described
};

/// The fake's table (one process-wide fake fabric).
const kvcomm::detail::VerbsApi* api();
/// Clears injections and counters (objects that exist stay); `c` applies from now on.
void reset(const Config& c = {});
Config& config();
Counts counts();
Violations violations();
/// Work requests stop (true) or resume (false) completing, without touching the other injections.
void setStall(bool stall);
/// READs in flight (posted, completion not reaped) over every queue pair.
int inFlight();

}  // namespace kvtest::fakeverbs

#endif
