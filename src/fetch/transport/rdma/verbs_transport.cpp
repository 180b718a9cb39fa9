#include "fetch/transport/rdma/verbs_transport.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>

#include "comm/agreement.hpp"
#include "common/check.hpp"
#include "common/log.hpp"
#include "common/socket.hpp"
#include "fetch/transport/net/run_slices.hpp"
#include "fetch/transport/net/segments.hpp"
#include "fetch/transport/rdma/gpu_direct.hpp"
#include "platform/ibverbs.hpp"

namespace kvcomm::detail {

namespace {

// The registered piece holding byte `offset`, or nullptr.
template <typename Key>
const Key* covering(const Key* keys, size_t n, uint64_t offset) {
  size_t lo = 0, hi = n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (keys[mid].offset <= offset)
      lo = mid + 1;
    else
      hi = mid;
  }
  if (lo == 0) return nullptr;
  const Key* k = &keys[lo - 1];
  return offset - k->offset < k->bytes ? k : nullptr;
}

}  // namespace

std::string buildReads(const ReadPlanInput& in, std::vector<ReadWr>* out) {
  const uint32_t maxSge = std::clamp<uint32_t>(in.maxSge, 1, kMaxReadSges);
  for (size_t s = 0; s < in.numSlices; ++s) {
    SegmentCursor remote(in.srcRegions, in.numRegions, &in.src[s], 1);
    SegmentCursor local(in.dstRegions, in.numRegions, &in.dst[s], 1);
    uint64_t roff = 0, rlen = 0;
    while (remote.take(~0ull, &roff, &rlen)) {  // one contiguous remote run
      while (rlen > 0) {
        const ChunkKey* chunk = covering(in.remote, in.numRemote, roff);
        if (!chunk) return cat("slice ", s, ": source byte ", roff, " lies in no registered piece of the source");
        // One READ: within the chunk (one rkey), the message size and the SGE count.
        const uint64_t inChunk = std::min(rlen, chunk->bytes - (roff - chunk->offset));
        ReadWr wr{};
        wr.remoteAddr = chunk->addr + (roff - chunk->offset);
        wr.rkey = chunk->rkey;
        wr.slice = s;
        const uint64_t want = std::min(inChunk, in.maxBytes);
        while (wr.bytes < want && wr.numSge < maxSge) {
          uint64_t loff = 0, llen = 0;
          if (!local.peek(std::min<uint64_t>(want - wr.bytes, 1u << 31), &loff, &llen))
            return cat("slice ", s, ": the destination has fewer bytes than the source");
          const LocalKey* mr = covering(in.local, in.numLocal, loff);
          if (!mr) return cat("slice ", s, ": destination byte ", loff, " lies in no registered piece of this rank");
          llen = std::min(llen, mr->bytes - (loff - mr->offset));
          wr.sge[wr.numSge++] = {in.localBase + loff, static_cast<uint32_t>(llen), mr->lkey};
          local.advance(llen);
          wr.bytes += llen;
        }
        out->push_back(wr);
        roff += wr.bytes;
        rlen -= wr.bytes;
      }
    }
    uint64_t loff = 0, llen = 0;
    if (local.peek(~0ull, &loff, &llen)) return cat("slice ", s, ": the destination has more bytes than the source");
  }
  return "";
}

namespace {

// Every member's chunk keys (collective; members without a device send none): the part of connectAll/refreshAll
// that needs no device.
std::vector<std::vector<ChunkKey>> exchangeChunks(Communicator& comm, const std::vector<ChunkKey>& mine) {
  const int n = comm.size();
  std::vector<uint64_t> counts(static_cast<size_t>(n));
  counts[static_cast<size_t>(comm.rank())] = mine.size();
  comm.allgather(counts.data(), sizeof(uint64_t));
  uint64_t most = std::max<uint64_t>(1, *std::max_element(counts.begin(), counts.end()));
  std::vector<ChunkKey> all(static_cast<size_t>(n * most));
  std::copy(mine.begin(), mine.end(), all.begin() + static_cast<std::ptrdiff_t>(comm.rank() * most));
  comm.allgather(all.data(), most * sizeof(ChunkKey));
  std::vector<std::vector<ChunkKey>> out(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    auto first = all.begin() + static_cast<std::ptrdiff_t>(r * most);
    out[static_cast<size_t>(r)].assign(first, first + static_cast<std::ptrdiff_t>(counts[static_cast<size_t>(r)]));
    for (ChunkKey& k : out[static_cast<size_t>(r)]) k.lkey = 0;  // another member's local key means nothing here
  }
  return out;
}

}  // namespace

void VerbsFabric::connectAll(Communicator& comm, VerbsFabric* mine, char* base, const std::vector<LocalPiece>& pieces,
                             const std::vector<Route>& routes) {
  const char* call = "Fetcher::create (rdma)";
  const int n = comm.size(), me = comm.rank();
  auto pairs = [&](int r) {  // either member of (me, r) reads the other over RDMA
    return r != me && (routes[static_cast<size_t>(me * n + r)] == Route::Rdma ||
                       routes[static_cast<size_t>(r * n + me)] == Route::Rdma);
  };
  std::vector<ChunkKey> keys;
  std::vector<FabricAddress> addrs(static_cast<size_t>(n));
  std::vector<QpAddress> qps(static_cast<size_t>(n * n * kQpsPerPeer));
  allSucceed(comm, "Fetcher::create (rdma registration)", [&] {
    bool needed = false;
    for (int r = 0; r < n; ++r) needed = needed || pairs(r);
    if (!needed) return;
    if (!mine) KVCOMM_THROW(InternalError, call, "routes name RDMA for a member without an RDMA device");
    keys = mine->registerPieces(base, pieces, false);
    addrs[static_cast<size_t>(me)] = mine->address();
    for (int r = 0; r < n; ++r)
      if (pairs(r)) {
        auto q = mine->createQps(r);
        std::copy(q.begin(), q.end(), qps.begin() + static_cast<std::ptrdiff_t>((me * n + r) * kQpsPerPeer));
      }
  });
  comm.allgather(addrs.data(), sizeof(FabricAddress));
  comm.allgather(qps.data() + static_cast<std::ptrdiff_t>(0), static_cast<size_t>(n) * kQpsPerPeer * sizeof(QpAddress));
  auto chunks = exchangeChunks(comm, keys);
  allSucceed(comm, "Fetcher::create (rdma connect)", [&] {
    for (int r = 0; r < n; ++r) {
      if (!pairs(r)) continue;
      std::vector<QpAddress> theirs(qps.begin() + static_cast<std::ptrdiff_t>((r * n + me) * kQpsPerPeer),
                                    qps.begin() + static_cast<std::ptrdiff_t>((r * n + me + 1) * kQpsPerPeer));
      KVCOMM_CHECK_ARG(addrs[static_cast<size_t>(r)].valid, call, "rank ", r, " sent no RDMA address");
      mine->connectQps(r, addrs[static_cast<size_t>(r)], theirs);
      mine->setRemoteChunks(r, chunks[static_cast<size_t>(r)]);
    }
  });
}

void VerbsFabric::refreshAll(Communicator& comm, VerbsFabric* mine, char* base, const std::vector<LocalPiece>& pieces) {
  std::vector<ChunkKey> keys;
  allSucceed(comm, "Fetcher::refresh (rdma registration)", [&] {
    if (mine) keys = mine->registerPieces(base, pieces, false);
  });
  auto chunks = exchangeChunks(comm, keys);
  if (mine)
    for (int r = 0; r < comm.size(); ++r)
      if (r != comm.rank() && mine->unreachable(r).empty()) mine->setRemoteChunks(r, chunks[static_cast<size_t>(r)]);
}

#if KVCOMM_HAVE_VERBS

namespace {

using Clock = std::chrono::steady_clock;

uint8_t mtuOf(ibv_mtu m) {
  return static_cast<uint8_t>(m);
}

std::string readLine(const std::string& path) {
  std::ifstream f(path);
  std::string s;
  std::getline(f, s);
  return s;
}

// RoCE: the first GID of type "RoCE v2" (routable over IP), else index 0.
int pickGidIndex(const std::string& device, int tableLen) {
  for (int i = 0; i < tableLen && i < 256; ++i)
    if (readLine(cat("/sys/class/infiniband/", device, "/ports/1/gid_attrs/types/", i)) == "RoCE v2") return i;
  return 0;
}

class RealFabric : public VerbsFabric {
 public:
  RealFabric(const VerbsApi& api, MemoryKind kind, int cudaDevice, int64_t timeoutMs)
      : api_(api), kind_(kind), cudaDevice_(cudaDevice), timeoutMs_(timeoutMs) {}

  ~RealFabric() override {
    std::lock_guard<std::mutex> lock(opMu_);  // no read in flight (operations are joined before the fabric goes)
    for (auto& [peer, p] : peers_)
      for (ibv_qp* qp : p.qps)
        if (api_.destroyQp(qp)) KVCOMM_WARN("fetch (rdma): ibv_destroy_qp: ", std::strerror(errno));
    peers_.clear();
    for (Region& r : regions_) deregister(r);
    regions_.clear();
    if (cq_ && api_.destroyCq(cq_)) KVCOMM_WARN("fetch (rdma): ibv_destroy_cq: ", std::strerror(errno));
    if (pd_ && api_.deallocPd(pd_)) KVCOMM_WARN("fetch (rdma): ibv_dealloc_pd: ", std::strerror(errno));
    if (ctx_ && api_.closeDevice(ctx_)) KVCOMM_WARN("fetch (rdma): ibv_close_device: ", std::strerror(errno));
  }

  // Opens the first candidate with an active port 1; "" or why none.
  std::string open(const std::vector<std::pair<ibv_device*, std::string>>& candidates) {
    std::string why;
    for (auto& [dev, name] : candidates) {
      ibv_context* ctx = api_.openDevice(dev);
      if (!ctx) {
        why += cat(why.empty() ? "" : "; ", name, ": ibv_open_device: ", std::strerror(errno));
        continue;
      }
      ibv_port_attr port{};
      ibv_device_attr attr{};
      if (api_.queryPort(ctx, 1, &port) || api_.queryDevice(ctx, &attr) || port.state != IBV_PORT_ACTIVE) {
        why += cat(why.empty() ? "" : "; ", name, ": port 1 is not active");
        api_.closeDevice(ctx);
        continue;
      }
      ctx_ = ctx;
      name_ = name;
      port_ = port;
      attr_ = attr;
      break;
    }
    if (!ctx_) return why.empty() ? "no RDMA device" : why;
    ethernet_ = port_.link_layer == IBV_LINK_LAYER_ETHERNET;
    gidIndex_ = ethernet_ ? pickGidIndex(name_, port_.gid_tbl_len) : 0;
    if (api_.queryGid(ctx_, 1, gidIndex_, &gid_)) return cat(name_, ": ibv_query_gid: ", std::strerror(errno));
    pd_ = api_.allocPd(ctx_);
    if (!pd_) return cat(name_, ": ibv_alloc_pd: ", std::strerror(errno));
    depth_ = static_cast<uint32_t>(std::clamp(std::min(attr_.max_qp_rd_atom, attr_.max_qp_init_rd_atom), 1, 16));
    const int cqe = std::min(attr_.max_cqe, 4096);
    cq_ = api_.createCq(ctx_, cqe, nullptr, nullptr, 0);
    if (!cq_) return cat(name_, ": ibv_create_cq: ", std::strerror(errno));
    if (kind_ == MemoryKind::Cuda) flush_ = gpuDirectNeedsFlush(cudaDevice_);
    return "";
  }

  std::string deviceName() const override { return name_; }
  std::string linkLayer() const override { return ethernet_ ? "Ethernet" : "InfiniBand"; }
  FabricAddress address() const override {
    FabricAddress a{};
    a.valid = 1;
    a.maxMsg = port_.max_msg_sz;
    a.lid = port_.lid;
    a.port = 1;
    a.mtu = mtuOf(port_.active_mtu);
    a.ethernet = ethernet_;
    a.gidIndex = static_cast<uint8_t>(gidIndex_);
    a.readDepth = static_cast<uint16_t>(depth_);
    std::memcpy(a.gid, gid_.raw, 16);
    return a;
  }

  std::vector<ChunkKey> registerPieces(char* base, const std::vector<LocalPiece>& pieces, bool remoteWrite) override {
    std::lock_guard<std::mutex> lock(opMu_);
    std::vector<Region> keep;
    for (const LocalPiece& p : pieces) {
      auto it = std::find_if(regions_.begin(), regions_.end(), [&](const Region& r) {
        return r.mr && r.key.offset == p.offset && r.key.bytes == p.bytes && r.va == p.va &&
               r.remoteWrite == remoteWrite;
      });
      if (it != regions_.end()) {
        keep.push_back(*it);
        it->mr = nullptr;  // moved
        continue;
      }
      keep.push_back(registerOne(base, p, remoteWrite));
    }
    for (Region& r : regions_) deregister(r);  // pieces that are gone
    regions_ = std::move(keep);
    std::vector<ChunkKey> out;
    for (const Region& r : regions_) out.push_back(r.key);
    return out;
  }

  void unback(const std::vector<Range>& ranges) override {
    std::lock_guard<std::mutex> lock(opMu_);  // the read in flight drains first
    std::erase_if(regions_, [&](Region& r) {
      for (const Range& x : ranges)
        if (r.key.offset < x.offset + x.bytes && x.offset < r.key.offset + r.key.bytes) {
          deregister(r);
          return true;
        }
      return false;
    });
  }

  std::vector<QpAddress> createQps(int peer) override {
    std::lock_guard<std::mutex> lock(opMu_);
    Peer& p = peers_[peer];
    std::vector<QpAddress> out;
    for (int k = 0; k < kQpsPerPeer; ++k) {
      ibv_qp_init_attr init{};
      init.send_cq = cq_;
      init.recv_cq = cq_;
      init.qp_type = IBV_QPT_RC;
      init.cap.max_send_wr = std::min<uint32_t>(2 * depth_, static_cast<uint32_t>(attr_.max_qp_wr));
      init.cap.max_recv_wr = 1;
      init.cap.max_send_sge = maxSge();
      init.cap.max_recv_sge = 1;
      ibv_qp* qp = api_.createQp(pd_, &init);
      if (!qp) KVCOMM_THROW(SystemError, "ibv_create_qp", name_, " (peer ", peer, "): ", std::strerror(errno));
      p.qps.push_back(qp);
      ibv_qp_attr a{};
      a.qp_state = IBV_QPS_INIT;
      a.pkey_index = 0;
      a.port_num = 1;
      // What this end accepts as responder; each memory region says what it allows on top.
      a.qp_access_flags = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
      if (api_.modifyQp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
        KVCOMM_THROW(SystemError, "ibv_modify_qp (INIT)", name_, " (peer ", peer, "): ", std::strerror(errno));
      uint32_t psn = 0;
      randomBytes(&psn, sizeof(psn));
      psn &= 0xffffff;
      p.psn.push_back(psn);
      out.push_back({qp->qp_num, psn});
    }
    return out;
  }

  void connectQps(int peer, const FabricAddress& remote, const std::vector<QpAddress>& remoteQps) override {
    std::lock_guard<std::mutex> lock(opMu_);
    Peer& p = peers_.at(peer);
    const char* call = "Fetcher::create (rdma connect)";
    KVCOMM_CHECK_ARG(remoteQps.size() == p.qps.size(), call, "rank ", peer, " has ", remoteQps.size(),
                     " queue pairs for this rank, not ", p.qps.size());
    KVCOMM_CHECK_ARG(static_cast<bool>(remote.ethernet) == ethernet_, call, "rank ", peer,
                     "'s RDMA device is on another fabric (InfiniBand vs Ethernet)");
    p.depth = std::max<uint32_t>(1, std::min<uint32_t>(depth_, remote.readDepth));
    p.maxMsg = std::min<uint32_t>(port_.max_msg_sz, remote.maxMsg);
    for (size_t k = 0; k < p.qps.size(); ++k) {
      ibv_qp_attr a{};
      a.qp_state = IBV_QPS_RTR;
      a.path_mtu = static_cast<ibv_mtu>(std::min<uint8_t>(mtuOf(port_.active_mtu), remote.mtu));
      a.dest_qp_num = remoteQps[k].qpn;
      a.rq_psn = remoteQps[k].psn;
      a.max_dest_rd_atomic = static_cast<uint8_t>(depth_);  // READs this end accepts as responder
      a.min_rnr_timer = 12;
      a.ah_attr.port_num = 1;
      if (remote.ethernet) {
        a.ah_attr.is_global = 1;
        std::memcpy(a.ah_attr.grh.dgid.raw, remote.gid, 16);
        a.ah_attr.grh.sgid_index = static_cast<uint8_t>(gidIndex_);
        a.ah_attr.grh.hop_limit = 64;
      } else {
        a.ah_attr.dlid = remote.lid;
      }
      if (api_.modifyQp(p.qps[k], &a,
                        IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                            IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
        KVCOMM_THROW(SystemError, "ibv_modify_qp (RTR)", name_, " (peer ", peer, "): ", std::strerror(errno));
      ibv_qp_attr b{};
      b.qp_state = IBV_QPS_RTS;
      b.timeout = 14;  // 4.096 us * 2^14 = 67 ms per retry: a dead peer fails a READ within about half a second
      b.retry_cnt = 7;
      b.rnr_retry = 7;
      b.sq_psn = p.psn[k];
      b.max_rd_atomic = static_cast<uint8_t>(p.depth);
      if (api_.modifyQp(p.qps[k], &b,
                        IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                            IBV_QP_MAX_QP_RD_ATOMIC))
        KVCOMM_THROW(SystemError, "ibv_modify_qp (RTS)", name_, " (peer ", peer, "): ", std::strerror(errno));
    }
    p.connected = true;
  }

  void setRemoteChunks(int peer, std::vector<ChunkKey> chunks) override {
    std::lock_guard<std::mutex> lock(opMu_);
    peers_[peer].chunks = std::move(chunks);
  }
  void namePeer(int peer, std::string name) override {
    std::lock_guard<std::mutex> lock(opMu_);
    peers_[peer].name = std::move(name);
  }
  void dropPeer(int peer) override {
    std::lock_guard<std::mutex> lock(opMu_);  // the operation in flight ends first
    auto it = peers_.find(peer);
    if (it == peers_.end()) return;
    for (ibv_qp* qp : it->second.qps)
      if (api_.destroyQp(qp)) KVCOMM_WARN("rdma: ibv_destroy_qp: ", std::strerror(errno));
    peers_.erase(it);
  }

  std::string unreachable(int peer) const override {
    std::lock_guard<std::mutex> lock(opMu_);
    if (!cqLost_.empty()) return cqLost_;
    auto it = peers_.find(peer);
    if (it == peers_.end() || !it->second.connected) return cat("no RDMA connection to ", who(peer));
    if (!it->second.broken.empty())
      return cat("the RDMA connection to ", who(peer), " failed earlier (", it->second.broken,
                 "); recreate the fetcher to reconnect");
    return "";
  }

  std::string failed() const override {
    std::lock_guard<std::mutex> lock(opMu_);
    return cqLost_;
  }

  std::vector<LocalKey> localKeys() const override {
    std::lock_guard<std::mutex> lock(opMu_);
    std::vector<LocalKey> out;
    for (const Region& r : regions_) out.push_back({r.key.offset, r.key.bytes, r.key.lkey});
    return out;
  }
  std::vector<ChunkKey> remoteChunks(int peer) const override {
    std::lock_guard<std::mutex> lock(opMu_);
    auto it = peers_.find(peer);
    return it == peers_.end() ? std::vector<ChunkKey>{} : it->second.chunks;
  }
  uint32_t maxSge() const override {
    return static_cast<uint32_t>(std::clamp<int>(attr_.max_sge, 1, static_cast<int>(kMaxReadSges)));
  }
  FabricStats stats() const override {
    std::lock_guard<std::mutex> lock(statsMu_);
    return stats_;
  }
  bool needsStreamSync() const override { return kind_ == MemoryKind::Cuda; }
  uint64_t maxMessage(int peer) const override {
    std::lock_guard<std::mutex> lock(opMu_);
    auto it = peers_.find(peer);
    return it == peers_.end() ? 1u << 30 : std::max<uint64_t>(1, it->second.maxMsg);
  }

  std::string run(RdmaOp op, const std::vector<ReadWr>& wrs, const std::vector<int>& slicePeers,
                  const std::function<void(size_t)>& landed, const std::atomic<bool>* stop) override;

 private:
  struct Region {
    ibv_mr* mr = nullptr;
    ChunkKey key{};
    char* va = nullptr;
    bool remoteWrite = false;
  };
  struct Peer {
    std::vector<ibv_qp*> qps;
    std::vector<uint32_t> psn;
    std::vector<ChunkKey> chunks;
    uint32_t depth = 1;
    uint32_t maxMsg = 1u << 30;
    bool connected = false;
    std::string broken;  // why its queue pairs are unusable
    std::string name;    // how errors name it ("": "source rank N", a Fetcher's member)
  };

  // Under opMu_.
  std::string who(int peer) const {
    auto it = peers_.find(peer);
    return it != peers_.end() && !it->second.name.empty() ? it->second.name : cat("source rank ", peer);
  }

  Region registerOne(char* base, const LocalPiece& p, bool remoteWrite) {
    const int access =
        IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | (remoteWrite ? int{IBV_ACCESS_REMOTE_WRITE} : 0);
    Region r;
    r.va = p.va;
    r.remoteWrite = remoteWrite;
    if (kind_ == MemoryKind::Cuda) {
      if (!api_.regDmabufMr)
        KVCOMM_THROW(Unsupported, "fetch (rdma)", "rdma-core lacks ibv_reg_dmabuf_mr: GPU memory cannot be registered");
      Fd fd = exportDmabuf(p.va, p.bytes);  // closed once registered: the region keeps its own reference
      r.mr = api_.regDmabufMr(pd_, 0, p.bytes, reinterpret_cast<uint64_t>(p.va), fd.get(), access);
      if (!r.mr)
        KVCOMM_THROW(SystemError, "ibv_reg_dmabuf_mr", name_, ": piece [", p.offset, ", +", p.bytes,
                     ") of GPU memory: ", std::strerror(errno));
    } else {
      r.mr = api_.regMr(pd_, p.va, p.bytes, access);
      if (!r.mr)
        KVCOMM_THROW(SystemError, "ibv_reg_mr", name_, ": piece [", p.offset, ", +", p.bytes,
                     ") of host memory: ", std::strerror(errno));
    }
    (void)base;
    r.key = {p.offset, p.bytes, reinterpret_cast<uint64_t>(p.va), r.mr->rkey, r.mr->lkey};
    return r;
  }
  void deregister(Region& r) noexcept {
    if (r.mr && api_.deregMr(r.mr)) KVCOMM_WARN("fetch (rdma): ibv_dereg_mr: ", std::strerror(errno));
    r.mr = nullptr;
  }

  // Every queue pair of `peers` to ERR, then every outstanding completion reaped (bounded): nothing the operation
  // posted can still write afterwards. Queue pairs whose completions did not all come back are destroyed.
  void drain(const std::vector<int>& peers, std::map<uint32_t, uint32_t>& outstanding, uint64_t op,
             const std::string& why, bool cqLost);

  const VerbsApi& api_;
  MemoryKind kind_;
  int cudaDevice_;
  int64_t timeoutMs_;
  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_cq* cq_ = nullptr;
  std::string name_;
  ibv_port_attr port_{};
  ibv_device_attr attr_{};
  ibv_gid gid_{};
  int gidIndex_ = 0;
  bool ethernet_ = false;
  bool flush_ = false;
  uint32_t depth_ = 1;
  std::vector<Region> regions_;
  std::map<int, Peer> peers_;
  std::string cqLost_;  // the completion queue failed: nothing runs on this fabric again
  uint64_t opSeq_ = 0;
  mutable std::mutex opMu_;  // one read at a time; registration changes wait for it
  mutable std::mutex statsMu_;
  FabricStats stats_;
};

void RealFabric::drain(const std::vector<int>& peers, std::map<uint32_t, uint32_t>& outstanding, uint64_t op,
                       const std::string& why, bool cqLost) {
  for (int peer : peers)
    for (ibv_qp* qp : peers_[peer].qps) {
      ibv_qp_attr a{};
      a.qp_state = IBV_QPS_ERR;
      if (api_.modifyQp(qp, &a, IBV_QP_STATE)) KVCOMM_WARN("fetch (rdma): ibv_modify_qp (ERR): ", std::strerror(errno));
    }
  auto left = [&] {
    uint64_t n = 0;
    for (auto& [qpn, k] : outstanding) n += k;
    return n;
  };
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeoutMs_);
  ibv_wc wc[32];
  while (!cqLost && left() > 0 && Clock::now() < deadline) {
    int n = api_.pollCq(cq_, 32, wc);
    if (n < 0) {
      cqLost = true;
      break;
    }
    for (int i = 0; i < n; ++i) {
      if ((wc[i].wr_id >> 32) != (op & 0xffffffff)) continue;  // a completion of an earlier, given-up operation
      auto it = outstanding.find(wc[i].qp_num);
      if (it != outstanding.end() && it->second > 0) it->second--;
      std::lock_guard<std::mutex> lock(statsMu_);
      stats_.completed++;
    }
    if (n == 0) std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  const bool lost = left() > 0;
  for (int peer : peers) {
    Peer& p = peers_[peer];
    p.broken = why;
    if (lost) {  // destroying the queue pairs is what guarantees no more DMA from them
      for (ibv_qp* qp : p.qps)
        if (api_.destroyQp(qp)) KVCOMM_WARN("fetch (rdma): ibv_destroy_qp: ", std::strerror(errno));
      p.qps.clear();
    }
  }
  if (lost)
    KVCOMM_WARN("fetch (rdma): ", left(), " completions never came back after ", why,
                "; the queue pairs were destroyed before the memory was reported");
}

std::string RealFabric::run(RdmaOp kind, const std::vector<ReadWr>& wrs, const std::vector<int>& slicePeers,
                            const std::function<void(size_t)>& landed, const std::atomic<bool>* stop) {
  std::lock_guard<std::mutex> lock(opMu_);
  const uint64_t op = ++opSeq_ & 0xffffffff;
  const bool write = kind == RdmaOp::Write;
  const char* verb = write ? "RDMA WRITE to " : "RDMA READ from ";
  std::vector<int> peers;
  std::map<int, std::vector<size_t>> queue;  // per peer, WRs not posted yet (in order)
  std::vector<int64_t> remaining(slicePeers.size(), 0);
  for (size_t i = 0; i < wrs.size(); ++i) {
    int peer = slicePeers[wrs[i].slice];
    queue[peer].push_back(i);
    remaining[wrs[i].slice]++;
  }
  for (auto& [peer, q] : queue) {
    auto it = peers_.find(peer);
    if (it == peers_.end() || !it->second.connected || it->second.qps.empty() || !it->second.broken.empty())
      return cat(who(peer), ": ",
                 it == peers_.end() || !it->second.connected
                     ? std::string("no RDMA connection")
                     : cat("its RDMA connection failed earlier (", it->second.broken,
                           "); recreate the fetcher (an endpoint: connect again) to reconnect"));
    peers.push_back(peer);
  }
  std::map<uint32_t, uint32_t> outstanding;  // qp_num -> READs in flight
  std::map<uint32_t, int> peerOfQp;
  for (int peer : peers)
    for (ibv_qp* qp : peers_[peer].qps) {
      outstanding[qp->qp_num] = 0;
      peerOfQp[qp->qp_num] = peer;
    }
  std::vector<uint8_t> state(wrs.size(), 0);  // 0 queued, 1 posted, 2 completed
  std::map<int, size_t> next;                 // per peer: position in its queue
  std::map<int, size_t> rr;                   // per peer: next queue pair to try
  size_t done = 0;
  auto lastProgress = Clock::now();
  std::string error;
  bool cqLost = false;
  std::vector<size_t> finished;
  auto fail = [&](std::string why) {
    if (error.empty()) error = std::move(why);
  };
  while (done < wrs.size() && error.empty()) {
    if (stop && stop->load()) {
      fail("the operation was cancelled before it finished");
      break;
    }
    // Post: round robin over the peer's queue pairs, each within its READ depth.
    for (int peer : peers) {
      Peer& p = peers_[peer];
      auto& q = queue[peer];
      size_t& at = next[peer];
      for (size_t tries = 0; at < q.size() && tries < p.qps.size();) {
        ibv_qp* qp = p.qps[rr[peer] % p.qps.size()];
        uint32_t& out = outstanding[qp->qp_num];
        if (out >= p.depth) {
          ++rr[peer];
          ++tries;
          continue;
        }
        const ReadWr& w = wrs[q[at]];
        ibv_sge sge[kMaxReadSges];
        for (uint32_t s = 0; s < w.numSge; ++s) sge[s] = {w.sge[s].addr, w.sge[s].length, w.sge[s].lkey};
        ibv_send_wr wr{};
        ibv_send_wr* bad = nullptr;
        wr.wr_id = (op << 32) | q[at];
        wr.sg_list = sge;
        wr.num_sge = static_cast<int>(w.numSge);
        wr.opcode = write ? IBV_WR_RDMA_WRITE : IBV_WR_RDMA_READ;
        wr.send_flags = IBV_SEND_SIGNALED;
        wr.wr.rdma.remote_addr = w.remoteAddr;
        wr.wr.rdma.rkey = w.rkey;
        int rc = api_.postSend(qp, &wr, &bad);
        if (rc) {
          fail(cat(who(peer), ": ibv_post_send: ", std::strerror(rc)));
          break;
        }
        state[q[at]] = 1;
        ++out;
        ++at;
        ++rr[peer];
        tries = 0;
        std::lock_guard<std::mutex> s(statsMu_);
        stats_.posted++;
        stats_.maxOutstanding = std::max(stats_.maxOutstanding, out);
        stats_.readDepth = p.depth;
      }
    }
    if (!error.empty()) break;
    ibv_wc wc[32];
    int n = api_.pollCq(cq_, 32, wc);
    if (n < 0) {
      cqLost = true;
      std::string names;
      for (int peer : peers) names += cat(names.empty() ? "" : ", ", who(peer));
      fail(cat("the completion queue failed (overrun?) with work requests to ", names,
               " in flight: completions were lost"));
      cqLost_ = cat("the completion queue of ", name_, " failed earlier (", error, ")");
      break;
    }
    for (int i = 0; i < n; ++i) {
      const ibv_wc& c = wc[i];
      if ((c.wr_id >> 32) != op) continue;  // a late completion of an earlier, given-up operation
      const size_t idx = static_cast<size_t>(c.wr_id & 0xffffffff);
      auto qit = outstanding.find(c.qp_num);
      {
        std::lock_guard<std::mutex> s(statsMu_);
        stats_.completed++;
      }
      if (idx >= wrs.size() || state[idx] != 1 || qit == outstanding.end() || qit->second == 0) {
        fail(cat("an unexpected completion (work request ", idx, ", queue pair ", c.qp_num, ")"));
        continue;
      }
      qit->second--;
      state[idx] = 2;
      const int peer = peerOfQp[c.qp_num];
      if (c.status != IBV_WC_SUCCESS) {
        fail(cat(verb, who(peer), " failed: ", api_.wcStatusStr(c.status), " (status ", static_cast<int>(c.status),
                 ", vendor error 0x", std::hex, c.vendor_err, ")"));
        continue;
      }
      // A WRITE's byte_len is undefined: only a READ's is checked.
      if (c.opcode != (write ? IBV_WC_RDMA_WRITE : IBV_WC_RDMA_READ) ||
          (!write && c.byte_len != 0 && c.byte_len != wrs[idx].bytes)) {
        fail(cat(verb, who(peer), " completed as opcode ", static_cast<int>(c.opcode), " with ", c.byte_len,
                 " bytes, not ", wrs[idx].bytes));
        continue;
      }
      ++done;
      if (--remaining[wrs[idx].slice] == 0) finished.push_back(wrs[idx].slice);
    }
    if (n > 0) lastProgress = Clock::now();
    if (!finished.empty() && error.empty()) {
      // GPU memory whose RDMA writes are not ordered for its kernels: flush before the blocks count as landed.
      if (flush_ && !write) {
        try {
          flushGpuDirectWrites(cudaDevice_);
        } catch (const std::exception& e) {
          fail(e.what());
          break;
        }
      }
      for (size_t s : finished) landed(s);
      finished.clear();
    }
    if (n == 0) {
      if (Clock::now() - lastProgress > std::chrono::milliseconds(timeoutMs_)) {
        std::string names;
        for (int peer : peers) names += cat(names.empty() ? "" : ", ", who(peer));
        fail(cat("no RDMA completion from ", names, " for ", timeoutMs_, " ms (link down, host unreachable or hung?)"));
        break;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(5));
    }
  }
  if (!error.empty()) drain(peers, outstanding, op, error, cqLost);
  return error;
}

}  // namespace

std::unique_ptr<VerbsFabric> VerbsFabric::open(const VerbsApi* api, MemoryKind kind, int cudaDevice,
                                               const std::string& gpuPciBusId, const std::string& handleType,
                                               int64_t timeoutMs, std::string* why) {
  if (!api) api = realVerbs(why);
  if (!api) return nullptr;
  if (kind == MemoryKind::Cuda) {
    if (handleType == "cuda_ipc") {
      *why =
          "legacy CUDA IPC memory cannot be exported as dma-buf for RDMA registration (only VMM memory can: "
          "KVCOMM_HANDLE_TYPE=posix_fd)";
      return nullptr;
    }
    if (!api->regDmabufMr) {
      *why = "this rdma-core has no ibv_reg_dmabuf_mr (GPU memory needs dma-buf registration)";
      return nullptr;
    }
    std::string no = gpuDirectRefusal(cudaDevice);
    if (!no.empty()) {
      *why = no;
      return nullptr;
    }
  }
  int n = 0;
  ibv_device** list = api->getDeviceList(&n);
  if (!list || n == 0) {
    if (list) api->freeDeviceList(list);
    *why = "no RDMA device (ibv_get_device_list found none)";
    return nullptr;
  }
  // Candidates nearest the memory first: the GPU's PCIe switch, else the list's order.
  std::vector<std::pair<ibv_device*, std::string>> devs;
  std::vector<std::string> paths;
  for (int i = 0; i < n; ++i) {
    std::string name = api->getDeviceName(list[i]);
    devs.emplace_back(list[i], name);
    char resolved[4096];
    paths.push_back(realpath(cat("/sys/class/infiniband/", name, "/device").c_str(), resolved) ? resolved : "");
  }
  const std::string gpuPath = kind == MemoryKind::Cuda ? pciSysfsPath(gpuPciBusId) : "";
  std::vector<std::pair<ibv_device*, std::string>> ordered;
  while (!devs.empty()) {
    int k = closestByPciPath(gpuPath, paths);
    ordered.push_back(devs[static_cast<size_t>(k)]);
    devs.erase(devs.begin() + k);
    paths.erase(paths.begin() + k);
  }
  auto fabric = std::make_unique<RealFabric>(*api, kind, cudaDevice, timeoutMs);
  std::string no = fabric->open(ordered);
  api->freeDeviceList(list);
  if (!no.empty()) {
    *why = no;
    return nullptr;
  }
  return fabric;
}

#else  // built without rdma-core headers

std::unique_ptr<VerbsFabric> VerbsFabric::open(const VerbsApi*, MemoryKind, int, const std::string&, const std::string&,
                                               int64_t, std::string* why) {
  *why = "libkvcomm was built without rdma-core headers (libibverbs-dev)";
  return nullptr;
}

#endif

namespace {

constexpr uint64_t kSliceBytes = 8u << 20;  // progress granularity of a READ operation

class VerbsTransport : public FetchTransport {
 public:
  VerbsTransport(NetContext c, VerbsFabric* fabric, std::vector<int> fabricPeers)
      : ctx_(std::move(c)), fabric_(fabric), fabricPeers_(std::move(fabricPeers)) {}
  const char* name() const override { return "rdma"; }
  Route route() const override { return Route::Rdma; }
  size_t FetchPlanInfo::*runCounter() const override { return &FetchPlanInfo::rdmaRuns; }
  std::string unreachable(int rank) const override { return fabric_->unreachable(peerOf(rank)); }
  int peerOf(int rank) const {
    return static_cast<size_t>(rank) < fabricPeers_.size() ? fabricPeers_[static_cast<size_t>(rank)] : rank;
  }
  static RdmaOp opOf(const PlanOutput& plan) { return plan.push ? RdmaOp::Write : RdmaOp::Read; }

  // The READs of `runs`, sliced; "" or why they cannot be built.
  std::string build(const PlanOutput& plan, const std::vector<size_t>& runs, std::vector<RunSlice>* slices,
                    std::vector<ReadWr>* wrs, std::vector<int>* slicePeers) const {
    const MemberLayouts& t = *ctx_.table;
    const int64_t maxBlocks = std::max<int64_t>(1, static_cast<int64_t>(kSliceBytes / t.blockBytesSum));
    *slices = sliceRuns(plan, runs, maxBlocks);
    std::map<int, std::vector<size_t>> bySource;
    for (size_t i = 0; i < slices->size(); ++i) bySource[plan.runs[(*slices)[i].run].rank].push_back(i);
    slicePeers->assign(slices->size(), -1);
    std::vector<LocalKey> local = fabric_->localKeys();
    for (auto& [rank, list] : bySource) {
      std::vector<WireRun> src, dst;
      for (size_t i : list) {
        const RunSlice& s = (*slices)[i];
        const BlockRun& r = plan.runs[s.run];
        src.push_back({r.src + s.offset, s.blocks});
        dst.push_back({r.dst + s.offset, s.blocks});
        (*slicePeers)[i] = peerOf(rank);
      }
      std::vector<ChunkKey> remote = fabric_->remoteChunks(peerOf(rank));
      ReadPlanInput in;
      in.srcRegions = &t.views[static_cast<size_t>(rank) * t.numRegions];
      in.dstRegions = &t.views[static_cast<size_t>(ctx_.rank) * t.numRegions];
      in.numRegions = t.numRegions;
      in.src = src.data();
      in.dst = dst.data();
      in.numSlices = list.size();
      in.remote = remote.data();
      in.numRemote = remote.size();
      in.local = local.data();
      in.numLocal = local.size();
      in.localBase = reinterpret_cast<uint64_t>(ctx_.local);
      in.maxSge = fabric_->maxSge();
      in.maxBytes = fabric_->maxMessage(peerOf(rank));
      std::vector<ReadWr> part;
      std::string why = buildReads(in, &part);
      if (!why.empty()) return cat("source rank ", rank, ": ", why);
      for (ReadWr& w : part) {
        w.slice = list[w.slice];  // slice index within this source -> within the operation
        wrs->push_back(w);
      }
    }
    return "";
  }

  void submit(const PlanOutput& plan, const std::vector<size_t>& runs, Stream stream) override {
    std::vector<RunSlice> slices;
    std::vector<ReadWr> wrs;
    std::vector<int> peers;
    std::string why = build(plan, runs, &slices, &wrs, &peers);
    if (!why.empty()) KVCOMM_THROW(InvalidArgument, "fetch (rdma)", why);
    if (ctx_.kind == MemoryKind::Cuda && fabric_->needsStreamSync()) syncStream(ctx_.device, stream);
    LandedBlocks landed;
    std::string e = fabric_->run(
        opOf(plan), wrs, peers, [&](size_t s) { landed.add(slices[s]); }, nullptr);
    if (e.empty()) return;
    std::vector<int64_t> done(plan.runs.size(), 0);
    landed.fill(done);
    KVCOMM_THROW(NetworkError, "fetch (rdma)", e, "; ", describeFailedBlocks(plan, runs, done));
  }

  std::unique_ptr<TransportOp> start(std::shared_ptr<const PlanOutput> plan, std::vector<size_t> runs,
                                     const FetchOptions& options, Stream stream) override;

 private:
  friend class VerbsOp;
  NetContext ctx_;
  VerbsFabric* fabric_;
  std::vector<int> fabricPeers_;
};

// A polled RDMA fetch: a driver thread posts and reaps; destruction cancels (the fabric drains) and joins.
class VerbsOp : public TransportOp {
 public:
  VerbsOp(VerbsTransport& t, std::shared_ptr<const PlanOutput> plan, std::vector<size_t> runs, Stream stream)
      : plan_(std::move(plan)) {
    std::string why = t.build(*plan_, runs, &slices_, &wrs_, &peers_);
    if (!why.empty()) KVCOMM_THROW(InvalidArgument, "fetch (rdma)", why);
    if (t.ctx_.kind == MemoryKind::Cuda && t.fabric_->needsStreamSync() && stream) syncStream(t.ctx_.device, stream);
    VerbsFabric* fabric = t.fabric_;
    driver_ = std::thread([this, fabric, op = VerbsTransport::opOf(*plan_), rank = detail::currentRank()] {
      detail::RankScope scope(rank);
      std::string e = fabric->run(
          op, wrs_, peers_, [this](size_t s) { landed_.add(slices_[s]); }, &stop_);
      std::lock_guard<std::mutex> lock(mu_);
      error_ = e;
      finished_ = true;
    });
  }
  ~VerbsOp() override {
    stop_ = true;
    driver_.join();
  }
  void poll(std::vector<int64_t>& blocksDone, bool* finished, std::string* error) override {
    std::lock_guard<std::mutex> lock(mu_);
    landed_.fill(blocksDone);
    *finished = finished_;
    *error = error_;
  }

 private:
  std::shared_ptr<const PlanOutput> plan_;
  std::vector<RunSlice> slices_;
  std::vector<ReadWr> wrs_;
  std::vector<int> peers_;
  LandedBlocks landed_;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  bool finished_ = false;
  std::string error_;
  std::thread driver_;
};

std::unique_ptr<TransportOp> VerbsTransport::start(std::shared_ptr<const PlanOutput> plan, std::vector<size_t> runs,
                                                   const FetchOptions&, Stream stream) {
  return std::make_unique<VerbsOp>(*this, std::move(plan), std::move(runs), stream);
}

}  // namespace

std::unique_ptr<FetchTransport> makeVerbsTransport(NetContext context, VerbsFabric* fabric,
                                                   std::vector<int> fabricPeers) {
  return std::make_unique<VerbsTransport>(std::move(context), fabric, std::move(fabricPeers));
}

}  // namespace kvcomm::detail
