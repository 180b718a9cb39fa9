#include "support/fake_verbs.hpp"

#if KVCOMM_HAVE_VERBS

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

namespace kvtest::fakeverbs {

namespace {

struct FakeCq;

struct FakeMr {
  ibv_mr mr{};
  int access = 0;
};

struct PendingRead {
  uint64_t wrId;
  bool write = false;  // RDMA WRITE: local SGEs -> remote
  uint64_t remoteAddr;
  uint32_t rkey;
  std::vector<ibv_sge> sges;
  bool forced = false;
  ibv_wc_status status = IBV_WC_SUCCESS;
};

struct FakeQp {
  ibv_qp qp{};
  FakeCq* cq = nullptr;
  uint32_t maxSge = 1;
  int depth = 0;         // max_rd_atomic set at RTS
  int access = 0;        // qp_access_flags set at INIT: what it accepts as responder
  uint32_t destQpn = 0;  // set at RTR
  int inFlight = 0;      // posted, completion not reaped
  std::deque<PendingRead> pending;
};

struct FakeCq {
  ibv_cq cq{};
  int capacity = 0;
  bool overrun = false;
  std::deque<ibv_wc> queue;
  std::vector<FakeQp*> qps;
};

struct State {
  std::mutex mu;
  Config cfg;
  Counts counts;
  Violations violations;
  ibv_device device{};
  uint32_t nextKey = 0x100;
  uint32_t nextQpn = 0x40;
  uint64_t readsPosted = 0;
  std::map<uint32_t, FakeMr*> byRkey, byLkey;
  std::map<uint32_t, FakeQp*> qps;
};

State& st() {
  static State* s = [] {
    auto* x = new State();
    std::snprintf(x->device.name, sizeof(x->device.name), "fake_mlx5_0");
    return x;
  }();
  return *s;
}

void violation(State& s, int& counter, const std::string& what) {
  ++counter;
  if (s.violations.first.empty()) s.violations.first = what;
}

ibv_device** getDeviceList(int* num) {
  auto** list = new ibv_device*[2];
  list[0] = &st().device;
  list[1] = nullptr;
  *num = 1;
  return list;
}
void freeDeviceList(ibv_device** list) {
  delete[] list;
}
const char* getDeviceName(ibv_device* d) {
  return d->name;
}
ibv_context* openDevice(ibv_device* d) {
  State& s = st();
  std::lock_guard<std::mutex> lock(s.mu);
  auto* c = new ibv_context{};
  c->device = d;
  s.counts.contexts++;
  return c;
}
int closeDevice(ibv_context* c) {
  State& s = st();
  std::lock_guard<std::mutex> lock(s.mu);
  delete c;
  s.counts.contexts--;
  return 0;
}
int queryDevice(ibv_context*, ibv_device_attr* a) {
  State& s = st();
  std::memset(a, 0, sizeof(*a));
  a->max_qp_rd_atom = a->max_qp_init_rd_atom = s.cfg.maxRdAtom;
  a->max_sge = s.cfg.maxSge;
  a->max_qp_wr = 1024;
  a->max_cqe = 4096;
  return 0;
}
int queryPort(ibv_context*, uint8_t port, ibv_port_attr* a) {
  std::memset(a, 0, sizeof(*a));
  if (port != 1) return EINVAL;
  a->state = IBV_PORT_ACTIVE;
  a->active_mtu = IBV_MTU_4096;
  a->max_msg_sz = st().cfg.maxMsg;
  a->lid = 7;
  a->link_layer = IBV_LINK_LAYER_INFINIBAND;
  return 0;
}
int queryGid(ibv_context*, uint8_t, int, ibv_gid* g) {
  std::memset(g, 0, sizeof(*g));
  return 0;
}
ibv_pd* allocPd(ibv_context* c) {
  State& s = st();
  std::lock_guard<std::mutex> lock(s.mu);
  auto* pd = new ibv_pd{};
  pd->context = c;
  s.counts.pds++;
  return pd;
}
int deallocPd(ibv_pd* pd) {
  State& s = st();
  std::lock_guard<std::mutex> lock(s.mu);
  delete pd;
  s.counts.pds--;
  return 0;
}
ibv_mr* regMr(ibv_pd* pd, void* addr, size_t len, int access) {
  State& s = st();
  std::lock_guard<std::mutex> lock(s.mu);
  auto* m = new FakeMr();
  m->mr.pd = pd;
  m->mr.addr = addr;
  m->mr.length = len;
  m->mr.lkey = s.nextKey++;
  m->mr.rkey = s.nextKey++;
  m->access = access;
  s.byRkey[m->mr.rkey] = m;
  s.byLkey[m->mr.lkey] = m;
  s.counts.mrs++;
  return &m->mr;
}
ibv_mr* regDmabufMr(ibv_pd* pd, uint64_t, size_t len, uint64_t iova, int, int access) {
  return regMr(pd, reinterpret_cast<void*>(iova), len, access);
}
int deregMr(ibv_mr* mr) {
  State& s = st();
  std::lock_guard<std::mutex> lock(s.mu);
  auto* m = reinterpret_cast<FakeMr*>(mr);
  s.byRkey.erase(mr->rkey);
  s.byLkey.erase(mr->lkey);
  delete m;
  s.counts.mrs--;
  return 0;
}
ibv_cq* createCq(ibv_context* c, int cqe, void*, ibv_comp_channel*, int) {
  State& s = st();
  std::lock_guard<std::mutex> lock(s.mu);
  auto* q = new FakeCq();
  q->cq.context = c;
  q->cq.cqe = cqe;
  q->capacity = s.cfg.cqCapacity ? s.cfg.cqCapacity : cqe;
  s.counts.cqs++;
  return &q->cq;
}
int destroyCq(ibv_cq* cq) {
  State& s = st();
  std::lock_guard<std::mutex> lock(s.mu);
  auto* q = reinterpret_cast<FakeCq*>(cq);
  if (!q->queue.empty() && !q->overrun)
    violation(s, s.violations.cqNotEmpty, std::to_string(q->queue.size()) + " completions left in a destroyed CQ");
  delete q;
  s.counts.cqs--;
  return 0;
}
ibv_qp* createQp(ibv_pd* pd, ibv_qp_init_attr* init) {
  State& s = st();
  std::lock_guard<std::mutex> lock(s.mu);
  auto* q = new FakeQp();
  q->qp.pd = pd;
  q->qp.context = pd->context;
  q->qp.qp_num = s.nextQpn++;
  q->qp.state = IBV_QPS_RESET;
  q->qp.qp_type = IBV_QPT_RC;
  q->cq = reinterpret_cast<FakeCq*>(init->send_cq);
  q->maxSge = init->cap.max_send_sge;
  q->cq->qps.push_back(q);
  s.qps[q->qp.qp_num] = q;
  s.counts.qps++;
  return &q->qp;
}
int modifyQp(ibv_qp* qp, ibv_qp_attr* a, int mask) {
  State& s = st();
  std::lock_guard<std::mutex> lock(s.mu);
  auto* q = reinterpret_cast<FakeQp*>(qp);
  if (!(mask & IBV_QP_STATE)) return EINVAL;
  const ibv_qp_state from = qp->state, to = a->qp_state;
  bool ok = to == IBV_QPS_ERR || to == IBV_QPS_RESET || (from == IBV_QPS_RESET && to == IBV_QPS_INIT) ||
            (from == IBV_QPS_INIT && to == IBV_QPS_RTR) || (from == IBV_QPS_RTR && to == IBV_QPS_RTS);
  if (!ok) return EINVAL;
  if (to == IBV_QPS_RTS) {
    if (!(mask & IBV_QP_MAX_QP_RD_ATOMIC) || a->max_rd_atomic < 1 || a->max_rd_atomic > s.cfg.maxRdAtom) return EINVAL;
    q->depth = a->max_rd_atomic;
  }
  if (to == IBV_QPS_RTR && (!(mask & IBV_QP_DEST_QPN) || !s.qps.count(a->dest_qp_num))) return EINVAL;
  if (to == IBV_QPS_INIT && (mask & IBV_QP_ACCESS_FLAGS)) q->access = static_cast<int>(a->qp_access_flags);
  if (to == IBV_QPS_RTR) q->destQpn = a->dest_qp_num;
  qp->state = to;
  return 0;
}
int destroyQp(ibv_qp* qp) {
  State& s = st();
  std::lock_guard<std::mutex> lock(s.mu);
  auto* q = reinterpret_cast<FakeQp*>(qp);
  if (q->inFlight > 0 && !q->cq->overrun)  // after an overrun nobody can reap them: destroying is the only way
    violation(s, s.violations.unreapedAtDestroy,
              "queue pair " + std::to_string(qp->qp_num) + " destroyed with " + std::to_string(q->inFlight) +
                  " READs whose completions were not reaped");
  auto& list = q->cq->qps;
  list.erase(std::remove(list.begin(), list.end(), q), list.end());
  // Completions of a destroyed queue pair that are still queued are dropped with it.
  std::erase_if(q->cq->queue, [&](const ibv_wc& w) { return w.qp_num == qp->qp_num; });
  s.qps.erase(qp->qp_num);
  delete q;
  s.counts.qps--;
  return 0;
}
int postSend(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad) {
  State& s = st();
  std::lock_guard<std::mutex> lock(s.mu);
  auto* q = reinterpret_cast<FakeQp*>(qp);
  for (; wr; wr = wr->next) {
    const bool write = wr->opcode == IBV_WR_RDMA_WRITE;
    if (qp->state != IBV_QPS_RTS || (wr->opcode != IBV_WR_RDMA_READ && !write) || wr->num_sge < 1 ||
        static_cast<uint32_t>(wr->num_sge) > q->maxSge) {
      violation(s, s.violations.badPost, "a post the queue pair cannot take");
      *bad = wr;
      return EINVAL;
    }
    if (q->inFlight + 1 > q->depth)
      violation(s, s.violations.overDepth,
                "queue pair " + std::to_string(qp->qp_num) + ": READ beyond its depth " + std::to_string(q->depth));
    PendingRead p;
    p.wrId = wr->wr_id;
    p.write = write;
    p.remoteAddr = wr->wr.rdma.remote_addr;
    p.rkey = wr->wr.rdma.rkey;
    p.sges.assign(wr->sg_list, wr->sg_list + wr->num_sge);
    if (++s.readsPosted == s.cfg.failNth) {
      p.forced = true;
      p.status = s.cfg.failStatus;
    }
    q->pending.push_back(std::move(p));
    q->inFlight++;
  }
  return 0;
}

ibv_wc_status execute(State& s, FakeQp* q, const PendingRead& p, uint32_t* bytes) {
  *bytes = 0;
  if (q->qp.state == IBV_QPS_ERR) return IBV_WC_WR_FLUSH_ERR;
  if (p.forced) return p.status;
  // The responder: its queue pair must still be there and connected (else the requester retries until it gives up),
  // accept the operation, and own the region the rkey names (one protection domain).
  auto peer = s.qps.find(q->destQpn);
  if (peer == s.qps.end() || peer->second->qp.state == IBV_QPS_RESET || peer->second->qp.state == IBV_QPS_INIT)
    return IBV_WC_RETRY_EXC_ERR;
  const int need = p.write ? IBV_ACCESS_REMOTE_WRITE : IBV_ACCESS_REMOTE_READ;
  if (peer->second->qp.state == IBV_QPS_ERR || !(peer->second->access & need)) return IBV_WC_REM_ACCESS_ERR;
  auto r = s.byRkey.find(p.rkey);
  uint64_t total = 0;
  for (const ibv_sge& g : p.sges) total += g.length;
  if (r == s.byRkey.end() || !(r->second->access & need) || r->second->mr.pd != peer->second->qp.pd)
    return IBV_WC_REM_ACCESS_ERR;
  const ibv_mr& rm = r->second->mr;
  const uint64_t rbase = reinterpret_cast<uint64_t>(rm.addr);
  if (p.remoteAddr < rbase || p.remoteAddr + total > rbase + rm.length) return IBV_WC_REM_ACCESS_ERR;
  for (const ibv_sge& g : p.sges) {
    auto l = s.byLkey.find(g.lkey);
    // A READ's SGEs are written (local write access); a WRITE's are only read.
    if (l == s.byLkey.end() || (!p.write && !(l->second->access & IBV_ACCESS_LOCAL_WRITE)) ||
        l->second->mr.pd != q->qp.pd)
      return IBV_WC_LOC_PROT_ERR;
    const uint64_t lbase = reinterpret_cast<uint64_t>(l->second->mr.addr);
    if (g.addr < lbase || g.addr + g.length > lbase + l->second->mr.length) return IBV_WC_LOC_PROT_ERR;
  }
  uint64_t at = p.remoteAddr;
  for (const ibv_sge& g : p.sges) {
    if (p.write)
      std::memcpy(reinterpret_cast<void*>(at), reinterpret_cast<const void*>(g.addr), g.length);
    else
      std::memcpy(reinterpret_cast<void*>(g.addr), reinterpret_cast<const void*>(at), g.length);
    at += g.length;
  }
  *bytes = p.write ? 0 : static_cast<uint32_t>(total);  // as hardware: byte_len is defined for READs only
  return IBV_WC_SUCCESS;
}

int pollCq(ibv_cq* cq, int n, ibv_wc* out) {
  State& s = st();
  std::lock_guard<std::mutex> lock(s.mu);
  auto* q = reinterpret_cast<FakeCq*>(cq);
  if (q->overrun) return -1;
  // Progress: a few READs per queue pair (all of them once the queue pair is in ERR: flushing is immediate).
  for (FakeQp* qp : q->qps) {
    if (s.cfg.stall && qp->qp.state != IBV_QPS_ERR) continue;
    int budget = qp->qp.state == IBV_QPS_ERR ? static_cast<int>(qp->pending.size()) : s.cfg.progressPerPoll;
    for (; budget > 0 && !qp->pending.empty(); --budget) {
      PendingRead p = std::move(qp->pending.front());
      qp->pending.pop_front();
      ibv_wc w{};
      w.wr_id = p.wrId;
      w.qp_num = qp->qp.qp_num;
      w.opcode = p.write ? IBV_WC_RDMA_WRITE : IBV_WC_RDMA_READ;
      w.status = execute(s, qp, p, &w.byte_len);
      if (w.status != IBV_WC_SUCCESS && w.status != IBV_WC_WR_FLUSH_ERR) qp->qp.state = IBV_QPS_ERR;  // as hardware
      q->queue.push_back(w);
      if (static_cast<int>(q->queue.size()) > q->capacity) {
        q->overrun = true;  // completions are lost; the queue pairs on it fail
        for (FakeQp* x : q->qps) x->qp.state = IBV_QPS_ERR;
        return -1;
      }
    }
  }
  int k = 0;
  for (; k < n && !q->queue.empty(); ++k) {
    out[k] = q->queue.front();
    q->queue.pop_front();
    auto it = s.qps.find(out[k].qp_num);
    if (it != s.qps.end()) it->second->inFlight--;
  }
  return k;
}
const char* wcStatusStr(ibv_wc_status status) {
  switch (status) {
    case IBV_WC_SUCCESS:
      return "success";
    case IBV_WC_REM_ACCESS_ERR:
      return "remote access error";
    case IBV_WC_RETRY_EXC_ERR:
      return "transport retry counter exceeded";
    case IBV_WC_WR_FLUSH_ERR:
      return "Work Request Flushed Error";
    case IBV_WC_LOC_PROT_ERR:
      return "local protection error";
    default:
      return "other error";
  }
}

const kvcomm::detail::VerbsApi kApi = {
    getDeviceList, freeDeviceList, getDeviceName, openDevice, closeDevice, queryDevice, queryPort,
    queryGid,      allocPd,        deallocPd,     regMr,      regDmabufMr, deregMr,     createCq,
    destroyCq,     createQp,       modifyQp,      destroyQp,  postSend,    pollCq,      wcStatusStr};

}  // namespace

const kvcomm::detail::VerbsApi* api() {
  return &kApi;
}

void reset(const Config& c) {
  State& s = st();
  std::lock_guard<std::mutex> lock(s.mu);
  s.cfg = c;
  s.violations = {};
  s.readsPosted = 0;
}

void setStall(bool stall) {
  State& s = st();
  std::lock_guard<std::mutex> lock(s.mu);
  s.cfg.stall = stall;
}

Config& config() {
  return st().cfg;
}

Counts counts() {
  State& s = st();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.counts;
}

Violations violations() {
  State& s = st();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.violations;
}

int inFlight() {
  State& s = st();
  std::lock_guard<std::mutex> lock(s.mu);
  int n = 0;
  for (auto& [qpn, q] : s.qps) n += q->inFlight;
  return n;
}

}  // namespace kvtest::fakeverbs

#endif
