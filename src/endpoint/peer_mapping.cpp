#include "endpoint/peer_mapping.hpp"

#include <poll.h>
#include <sys/socket.h>

#include <cstring>
#include <exception>
#include <thread>

#include "common/check.hpp"
#include "common/log.hpp"
#include "fetch/device_copy.hpp"
#include "symm/fd_exchange.hpp"

namespace kvcomm::detail {

namespace {

class MappingUse : public PeerMemory::Use {
 public:
  explicit MappingUse(std::shared_lock<std::shared_mutex> lock) : lock_(std::move(lock)) {}
  uint64_t generation() const override { return 0; }

 private:
  std::shared_lock<std::shared_mutex> lock_;
};

}  // namespace

void onDevice(int device, const std::function<void()>& f) {
  if (device < 0) return f();
  std::exception_ptr error;
  std::thread t([&, rank = currentRank()] {
    RankScope scope(rank);
    try {
      bindCudaDevice(device);
      f();
    } catch (...) {
      error = std::current_exception();
    }
  });
  t.join();
  if (error) std::rethrow_exception(error);
}

PeerMapping::Opened PeerMapping::open(const EndpointMetadata& m, int device, int64_t timeoutMs) {
  Opened out;
  const std::string owner = cat("endpoint '", m.name, "' (pid ", m.pid, ")");
  const std::string name = shareSocketName(m.endpointId);
  auto deadline = deadlineIn(timeoutMs);
  Fd sock(KVCOMM_CHECK_SYS(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0)));
  socklen_t len;
  sockaddr_un a = abstractAddress(name, &len);
  if (connect(sock.get(), reinterpret_cast<sockaddr*>(&a), len) != 0) {
    out.status = ShareStatus::Gone;
    out.why = cat(owner, " is not listening on this host (", std::strerror(errno),
                  "): it exited or restarted (a restarted endpoint has new metadata)");
    return out;
  }
  ShareRequest req{kShareMagic, kShareVersion, m.regionId, m.generation, m.capability};
  sendPlain(sock.get(), &req, sizeof(req), "share request");
  ShareReply reply{};
  char raw[sizeof(ShareReply) + 1];
  waitReadable(sock.get(), deadline, {}, "share reply");
  size_t n = recvPlain(sock.get(), raw, sizeof(raw), "share reply");
  if (n != sizeof(reply)) KVCOMM_THROW(NetworkError, "share reply", owner, " sent a malformed reply (", n, " bytes)");
  std::memcpy(&reply, raw, sizeof(reply));
  if (reply.magic != kShareMagic) KVCOMM_THROW(NetworkError, "share reply", owner, " sent a malformed reply");
  reply.message[sizeof(reply.message) - 1] = '\0';
  if (reply.status != static_cast<int32_t>(ShareStatus::Granted)) {
    out.status = static_cast<ShareStatus>(reply.status);
    out.why = cat(owner, " refused to share registration ", hexId(m.regionId), ": ", reply.message);
    return out;
  }
  const auto kind = static_cast<ShareKind>(reply.kind);
  const char* call = "share reply";
  KVCOMM_CHECK_ARG(kind == ShareKind::MemFd || kind == ShareKind::CudaPosixFd || kind == ShareKind::CudaIpc, call,
                   owner, " offered memory of an unknown kind ", reply.kind);
  KVCOMM_CHECK_ARG(reply.count <= kMaxExportPieces && (kind != ShareKind::CudaIpc || reply.count == 0), call, owner,
                   " announced ", reply.count, " pieces");
  // The registration must lie inside what is mapped: the layout was validated against its bytes, not the span.
  uint64_t bytes = 0;
  for (const KvRegion& r : m.layout.regions)
    bytes = std::max<uint64_t>(
        bytes, r.offset + (r.numBlocks - 1) * (r.blockStride ? r.blockStride : r.blockBytes) + r.blockBytes);
  KVCOMM_CHECK_ARG(reply.offset <= reply.span && bytes <= reply.span - reply.offset, call, owner, " shares ",
                   reply.span, " bytes from offset ", reply.offset, ", its layout needs ", bytes);
  ExportSet pieces = recvPieces(sock.get(), reply.count, deadline, {}, owner);
  auto p = std::shared_ptr<PeerMapping>(new PeerMapping());
  p->shareKind_ = kind;
  p->kind_ = kind == ShareKind::MemFd ? MemoryKind::Host : MemoryKind::Cuda;
  p->device_ = p->kind_ == MemoryKind::Cuda ? device : -1;
  onDevice(p->device_, [&] {
    if (kind == ShareKind::CudaIpc) {
      p->memory_ = std::make_unique<arena::ImportedMemory>(reply.ipc, reply.span);
    } else {
      p->memory_ = std::make_unique<arena::ImportedMemory>(
          kind == ShareKind::MemFd ? HandleKind::MemFd : HandleKind::CudaPosixFd, reply.span, reply.span);
      p->memory_->map(pieces.metas, pieces.fds, reply.span);
    }
  });
  p->base_ = p->memory_->base() + reply.offset;
  p->mapped_ = true;
  p->lease_ = std::move(sock);
  out.mapping = std::move(p);
  return out;
}

PeerMapping::~PeerMapping() {
  unmap("the mapping was dropped");
}

std::unique_ptr<PeerMemory::Use> PeerMapping::use(const char* call) {
  std::shared_lock<std::shared_mutex> lock(mu_);
  KVCOMM_CHECK_ARG(mapped_, call, endedWhy_);
  return std::make_unique<MappingUse>(std::move(lock));
}

bool PeerMapping::mapped() {
  std::shared_lock<std::shared_mutex> lock(mu_);
  return mapped_;
}

std::string PeerMapping::endedWhy() {
  std::shared_lock<std::shared_mutex> lock(mu_);
  return endedWhy_;
}

std::string PeerMapping::readEnd(const std::string& owner) {
  ShareNotice n{};
  ssize_t got = ::recv(lease_.get(), &n, sizeof(n), MSG_DONTWAIT);
  if (got == static_cast<ssize_t>(sizeof(n)) && n.magic == kShareMagic) switch (static_cast<ShareEnd>(n.end)) {
      case ShareEnd::Revoked:
        return cat(owner, " revoked the registration: connect with its new metadata");
      case ShareEnd::Unregistered:
        return cat(owner, " unregistered the registration");
      case ShareEnd::Closed:
        return cat(owner, " closed its endpoint");
    }
  if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return "";
  return cat(owner, " is gone (its share connection closed: the process exited or was killed)");
}

void PeerMapping::unmap(const std::string& why) noexcept {
  std::unique_lock<std::shared_mutex> lock(mu_);  // waits for every copy that touches the mapping
  if (!mapped_ && !memory_) return;
  KVCOMM_DEBUG("endpoint: unmapping a peer's registration: ", why);
  mapped_ = false;
  endedWhy_ = why;
  try {
    onDevice(device_, [&] { memory_.reset(); });
  } catch (const std::exception& e) {
    KVCOMM_WARN("endpoint: unmapping a peer's registration: ", e.what());
  }
  memory_.reset();
  lease_.reset();  // the owner's acknowledgement: nothing here touches its memory any more
}

}  // namespace kvcomm::detail
