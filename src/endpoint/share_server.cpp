#include "endpoint/share_server.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>

#include "common/check.hpp"
#include "common/log.hpp"
#include "fetch/device_copy.hpp"
#include "symm/fd_exchange.hpp"

namespace kvcomm::detail {

namespace {

constexpr size_t kMaxLeases = 4096;

}  // namespace

const char* shareKindName(ShareKind k) {
  switch (k) {
    case ShareKind::None:
      return "none";
    case ShareKind::MemFd:
      return "memfd";
    case ShareKind::CudaPosixFd:
      return "cuda_posix_fd";
    case ShareKind::CudaIpc:
      return "cuda_ipc";
  }
  return "?";
}

std::string shareSocketName(uint64_t endpointId) {
  return cat("kvcomm-endpoint-", std::hex, endpointId);
}

ShareServer::ShareServer(uint64_t endpointId) : name_(shareSocketName(endpointId)), refusals_("endpoint share server") {
  listener_.reset(KVCOMM_CHECK_SYS(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0)));
  socklen_t len;
  sockaddr_un a = abstractAddress(name_, &len);
  KVCOMM_CHECK_SYS(bind(listener_.get(), reinterpret_cast<sockaddr*>(&a), len));
  KVCOMM_CHECK_SYS(listen(listener_.get(), 256));
  wake_.reset(KVCOMM_CHECK_SYS(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)));
  acceptor_ = std::make_unique<Acceptor>(listener_.get(), &refusals_);
  thread_ = std::thread([this, rank = currentRank()] {
    RankScope scope(rank);
    serve();
  });
}

ShareServer::~ShareServer() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  uint64_t one = 1;
  (void)!::write(wake_.get(), &one, sizeof(one));
  thread_.join();  // the leases close with it: their holders read end of stream
}

void ShareServer::add(std::shared_ptr<SharedMemory> memory) {
  std::lock_guard<std::mutex> lock(mu_);
  memory_[memory->served->regionId] = std::move(memory);
}

void ShareServer::remove(uint64_t regionId) {
  std::lock_guard<std::mutex> lock(mu_);
  memory_.erase(regionId);
}

namespace {

void sendNotice(int conn, ShareEnd why) {
  ShareNotice n{kShareMagic, static_cast<uint32_t>(why)};
  // Never blocks: a holder that does not read it is waited for (or outlived) like one that does not let go.
  (void)::send(conn, &n, sizeof(n), MSG_NOSIGNAL | MSG_DONTWAIT);
}

}  // namespace

std::vector<int> ShareServer::end(uint64_t regionId, ShareEnd why, int64_t timeoutMs) {
  std::unique_lock<std::mutex> lock(mu_);
  for (auto& l : leases_)
    if (l->regionId == regionId && !l->ended) {
      l->ended = true;
      l->endWhy = why;
      if (l->established) sendNotice(l->conn.get(), why);
    }
  auto holders = [&] {
    std::vector<int> pids;
    for (auto& l : leases_)
      if (l->regionId == regionId) pids.push_back(l->pid);
    return pids;
  };
  auto none = [&] { return holders().empty(); };
  if (timeoutMs < 0)
    cv_.wait(lock, none);
  else
    cv_.wait_for(lock, std::chrono::milliseconds(timeoutMs), none);
  return holders();
}

namespace {

// A reply that grants nothing: the status and why (cut to the message field). Never blocks.
void sendRefusal(int conn, ShareStatus status, const std::string& why) {
  ShareReply r{};
  r.magic = kShareMagic;
  r.status = static_cast<int32_t>(status);
  std::snprintf(r.message, sizeof(r.message), "%s", why.c_str());
  (void)::send(conn, &r, sizeof(r), MSG_NOSIGNAL | MSG_DONTWAIT);
}

}  // namespace

void ShareServer::refuse(int conn, ShareStatus status, const std::string& why, int pid) {
  sendRefusal(conn, status, why);
  refusals_.refused(cat("pid ", pid, ": ", why));
}

void ShareServer::serve() {
  Acceptor& acceptor = *acceptor_;
  PendingHandshakes pending(sizeof(ShareRequest), true, &refusals_);
  std::vector<Lease*> watched;
  while (true) {
    try {
      std::vector<pollfd> pfds{{acceptor.pollFd(), POLLIN, 0}, {wake_.get(), POLLIN, 0}};
      pending.pollFds(pfds);
      const size_t leasesAt = pfds.size();
      watched.clear();
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (stop_) {
          leases_.clear();
          cv_.notify_all();
          return;
        }
        for (auto& l : leases_) {
          watched.push_back(l.get());
          pfds.push_back({l->conn.get(), POLLIN, 0});
        }
      }
      int wait = pfds[0].fd < 0 ? 100 : pending.msToNextDeadline();
      int rc = poll(pfds.data(), pfds.size(), wait < 0 ? -1 : wait + 1);
      if (rc < 0 && errno != EINTR) throwSystem("poll(endpoint share server)", errno, __FILE__, __LINE__);
      if (rc <= 0) {
        (void)pending.progress(pfds.data() + 2, leasesAt - 2);  // expires what waited too long
        continue;
      }
      // A holder that sends anything or closes has let go (it unmapped first): the lease ends.
      bool released = false;
      for (size_t i = 0; i < watched.size(); ++i) {
        if (!pfds[leasesAt + i].revents) continue;
        char b[16];
        ssize_t got = ::recv(watched[i]->conn.get(), b, sizeof(b), MSG_DONTWAIT);
        KVCOMM_DEBUG("endpoint share server: the lease of pid ", watched[i]->pid, " on registration ",
                     hexId(watched[i]->regionId), " ended (",
                     got == 0  ? "closed"
                     : got < 0 ? "error"
                               : "released",
                     ")");
        std::lock_guard<std::mutex> lock(mu_);
        std::erase_if(leases_, [&](const std::unique_ptr<Lease>& l) { return l.get() == watched[i]; });
        released = true;
      }
      if (released) cv_.notify_all();
      for (auto& r : pending.progress(pfds.data() + 2, leasesAt - 2)) answer(std::move(r.conn), r.hello);
      if (pfds[0].revents)
        for (Fd c = acceptor.next(); c; c = acceptor.next()) pending.add(std::move(c));
    } catch (const std::exception& e) {
      KVCOMM_WARN("endpoint share server ", name_, ": ", e.what());
    }
  }
}

void ShareServer::answer(Fd conn, const std::vector<char>& request) {
  ucred cred{};
  socklen_t clen = sizeof(cred);
  KVCOMM_CHECK_SYS(getsockopt(conn.get(), SOL_SOCKET, SO_PEERCRED, &cred, &clen));
  // Credentials come from the kernel at connect time: another user is refused before its request is looked at (the
  // request is read first only so that the refusal reaches it: closing on an unread request resets the connection).
  if (cred.uid != getuid())
    return refuse(conn.get(), ShareStatus::WrongUser,
                  cat("uid ", cred.uid, " is not the uid of the endpoint's process (", getuid(), ")"), cred.pid);
  ShareRequest req{};
  if (request.size() != sizeof(req)) return refuse(conn.get(), ShareStatus::Malformed, "malformed request", cred.pid);
  std::memcpy(&req, request.data(), sizeof(req));
  if (req.magic != kShareMagic || req.version != kShareVersion)
    return refuse(conn.get(), ShareStatus::Malformed,
                  cat("not a share request of version ", kShareVersion, " (magic ", hexId(req.magic), ", version ",
                      req.version, ")"),
                  cred.pid);
  std::shared_ptr<SharedMemory> mem;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = memory_.find(req.regionId);
    if (it != memory_.end()) mem = it->second;
  }
  if (!mem)
    return refuse(conn.get(), ShareStatus::Unknown,
                  cat("registration ", hexId(req.regionId), " is not registered here (unregistered by its owner)"),
                  cred.pid);
  {
    std::shared_lock<std::shared_mutex> lock(mem->served->mu);
    uint8_t diff = 0;  // constant time: the comparison says nothing about how much of a guess was right
    for (size_t i = 0; i < sizeof(req.capability.bytes); ++i)
      diff |= req.capability.bytes[i] ^ mem->served->capability.bytes[i];
    if (diff != 0)
      return refuse(conn.get(), ShareStatus::Unauthorized,
                    cat("capability refused for registration ", hexId(req.regionId),
                        " (forged, or revoked by its owner: connect with its new metadata)"),
                    cred.pid);
    if (req.generation != mem->served->generation)
      return refuse(conn.get(), ShareStatus::Stale,
                    cat("stale generation ", req.generation, " of registration ", hexId(req.regionId), " (now ",
                        mem->served->generation, "): ", mem->served->staleAdvice),
                    cred.pid);
  }
  const MemoryExport* exp = nullptr;
  {
    std::lock_guard<std::mutex> lock(mem->mu);
    if (!mem->exported) {
      if (mem->served->kind == MemoryKind::Cuda) bindCudaDevice(mem->served->device);
      if (mem->ownPieces)
        mem->exp = exportOwnPieces(mem->ownPieces(), mem->bytes, mem->served->kind, mem->served->device);
      if (mem->exp.kind == ShareKind::None)
        mem->exp = exportMemory(mem->served->base, mem->bytes, mem->served->kind, mem->served->device);
      mem->exported = true;
    }
    exp = &mem->exp;
  }
  if (exp->kind == ShareKind::None)  // not a hostile peer (no refusal logged): the memory is reached over TCP
    return sendRefusal(conn.get(), ShareStatus::NotShareable, exp->whyNot);
  // The lease exists before the reply leaves: an unregister from now on waits for this holder.
  Lease* lease = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!memory_.count(req.regionId))
      return refuse(conn.get(), ShareStatus::Unknown,
                    cat("registration ", hexId(req.regionId), " was unregistered by its owner"), cred.pid);
    if (leases_.size() >= kMaxLeases)
      return refuse(conn.get(), ShareStatus::Busy, cat("too many same-host peers (", kMaxLeases, ")"), cred.pid);
    auto l = std::make_unique<Lease>();
    l->regionId = req.regionId;
    l->pid = cred.pid;
    lease = l.get();
    leases_.push_back(std::move(l));
  }
  ShareReply reply{};
  reply.magic = kShareMagic;
  reply.status = static_cast<int32_t>(ShareStatus::Granted);
  reply.kind = static_cast<uint32_t>(exp->kind);
  reply.count = static_cast<uint32_t>(exp->pieces.size());
  reply.device = exp->device;
  reply.span = exp->span;
  reply.offset = exp->offset;
  std::memcpy(reply.ipc, exp->ipc.data(), sizeof(reply.ipc));
  bool sent = false;
  try {
    // The peer holds a valid capability: blocking sends, bounded at 1 s each.
    setNonBlocking(conn.get(), false);
    timeval tv{1, 0};
    setsockopt(conn.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    sendPlain(conn.get(), &reply, sizeof(reply), "share reply");
    if (!exp->pieces.empty()) {
      std::vector<PieceMeta> metas;
      std::vector<Fd> fds;
      for (const Piece& p : exp->pieces) {
        metas.push_back({p.offset, p.bytes, p.chunkOffset, p.chunk->bytes()});
        fds.push_back(p.chunk->exportFd());
      }
      sendPieces(conn.get(), metas, fds);
    }
    setNonBlocking(conn.get(), true);
    sent = true;
  } catch (const std::exception& e) {
    KVCOMM_DEBUG("endpoint share server: reply to pid ", cred.pid, " failed: ", e.what());
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (!sent) {
    std::erase_if(leases_, [&](const std::unique_ptr<Lease>& l) { return l.get() == lease; });
    cv_.notify_all();
    return;
  }
  lease->conn = std::move(conn);
  lease->established = true;
  if (lease->ended) sendNotice(lease->conn.get(), lease->endWhy);  // ended while the reply was on its way
}

}  // namespace kvcomm::detail
