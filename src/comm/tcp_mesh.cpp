#include "comm/tcp_mesh.hpp"

#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>

#include <cstring>

#include "common/check.hpp"
#include "common/log.hpp"

namespace kvcomm::detail {

namespace {
struct FrameHeader {
  uint64_t tag;
  uint64_t len;
};
}  // namespace

TcpMesh::TcpMesh(int rank, int size, const std::array<uint8_t, 16>& nonce, Fd listener, int64_t timeoutMs)
    : rank_(rank),
      size_(size),
      nonce_(nonce),
      listener_(std::move(listener)),
      timeoutMs_(timeoutMs),
      outbound_(static_cast<size_t>(size)),
      gone_(static_cast<size_t>(size)) {
  setNonBlocking(listener_.get(), true);
}

TcpMesh::~TcpMesh() = default;

void TcpMesh::setAddresses(std::vector<SockAddr> addrs) {
  std::lock_guard<std::mutex> lock(mu_);
  addrs_ = std::move(addrs);
}

[[noreturn]] void TcpMesh::throwPeerGone(int peer, const char* call) {
  KVCOMM_THROW(NetworkError, call, "rank ", peer, " is gone: ", gone_[static_cast<size_t>(peer)]);
}

int TcpMesh::outboundLocked(int peer) {
  Fd& fd = outbound_[static_cast<size_t>(peer)];
  if (fd) return fd.get();
  KVCOMM_CHECK_ARG(static_cast<size_t>(peer) < addrs_.size(), "TcpMesh::send", "no address known for rank ", peer);
  auto deadline = deadlineIn(timeoutMs_);
  Fd conn = connectTcp(addrs_[static_cast<size_t>(peer)], deadline, cat("rank ", peer));
  Hello hello{};
  hello.magic = kWireMagic;
  hello.version = kProtocolVersionWire;
  hello.kind = static_cast<uint32_t>(HelloKind::Mesh);
  hello.rank = rank_;
  hello.size = size_;
  hello.nonce = nonce_;
  sendAll(conn.get(), &hello, sizeof(hello), deadline, cat("hello to rank ", peer));
  setNonBlocking(conn.get(), true);
  fd = std::move(conn);
  return fd.get();
}

void TcpMesh::acceptLocked() {
  while (true) {
    int c = accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (c < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;
      throwSystem("accept4(mesh listener)", errno, __FILE__, __LINE__);
    }
    auto in = std::make_unique<Inbound>();
    in->fd.reset(c);
    inbound_.push_back(std::move(in));
  }
}

void TcpMesh::parseFramesLocked(Inbound& in) {
  size_t off = 0;
  if (in.rank < 0) {
    if (in.buf.size() < sizeof(Hello)) return;
    Hello h;
    std::memcpy(&h, in.buf.data(), sizeof(h));
    off = sizeof(Hello);
    std::string why;
    if (h.magic != kWireMagic)
      why = "bad magic (not a kvcomm peer)";
    else if (h.version != kProtocolVersionWire)
      why = cat("protocol version ", h.version, " != ", kProtocolVersionWire);
    else if (h.nonce != nonce_)
      why = "nonce belongs to another group";
    else if (h.kind != static_cast<uint32_t>(HelloKind::Mesh))
      why = "the group is already formed";
    else if (h.rank < 0 || h.rank >= size_)
      why = cat("rank ", h.rank, " out of range");
    if (!why.empty()) {
      HelloReply reply{};
      reply.status = 1;
      std::snprintf(reply.message, sizeof(reply.message), "%s", why.c_str());
      (void)::send(in.fd.get(), &reply, sizeof(reply), MSG_NOSIGNAL | MSG_DONTWAIT);
      KVCOMM_WARN("mesh rank ", rank_, ": refused a connection: ", why);
      in.fd.reset();
      in.buf.clear();
      return;
    }
    in.rank = h.rank;
    gone_[static_cast<size_t>(h.rank)].clear();
  }
  while (in.buf.size() - off >= sizeof(FrameHeader)) {
    FrameHeader fh;
    std::memcpy(&fh, in.buf.data() + off, sizeof(fh));
    if (in.buf.size() - off - sizeof(fh) < fh.len) break;
    const char* p = in.buf.data() + off + sizeof(fh);
    stash_[{in.rank, fh.tag}].emplace_back(p, p + fh.len);
    off += sizeof(fh) + fh.len;
  }
  in.buf.erase(in.buf.begin(), in.buf.begin() + static_cast<ptrdiff_t>(off));
}

bool TcpMesh::readInboundLocked(Inbound& in) {
  char chunk[65536];
  while (true) {
    ssize_t n = ::recv(in.fd.get(), chunk, sizeof(chunk), MSG_DONTWAIT);
    if (n > 0) {
      in.buf.insert(in.buf.end(), chunk, chunk + n);
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    if (n < 0 && errno == EINTR) continue;
    parseFramesLocked(in);
    if (in.rank >= 0)
      gone_[static_cast<size_t>(in.rank)] = n == 0
                                                ? "its connection closed (process exited or destroyed its communicator)"
                                                : cat("connection error: ", std::strerror(errno));
    return false;
  }
  parseFramesLocked(in);
  return in.fd.valid();
}

void TcpMesh::progressLocked(int timeoutMs) {
  std::vector<pollfd> pfds;
  pfds.push_back({listener_.get(), POLLIN, 0});
  for (auto& in : inbound_) pfds.push_back({in->fd.get(), POLLIN, 0});
  int rc = poll(pfds.data(), pfds.size(), timeoutMs);
  if (rc < 0) {
    if (errno == EINTR) return;
    throwSystem("poll(mesh)", errno, __FILE__, __LINE__);
  }
  if (rc == 0) return;
  size_t n = inbound_.size();
  for (size_t i = 0; i < n; ++i) {
    if (pfds[i + 1].revents == 0) continue;
    if (!readInboundLocked(*inbound_[i])) inbound_[i]->fd.reset();
  }
  std::erase_if(inbound_, [](const std::unique_ptr<Inbound>& in) { return !in->fd.valid(); });
  if (pfds[0].revents & POLLIN) acceptLocked();
}

void TcpMesh::sendLocked(int peer, uint64_t tag, const void* data, size_t len) {
  KVCOMM_CHECK_ARG(peer >= 0 && peer < size_, "TcpMesh::send", "peer ", peer, " out of range [0, ", size_, ")");
  if (peer == rank_) {
    const char* p = static_cast<const char*>(data);
    stash_[{peer, tag}].emplace_back(p, p + len);
    return;
  }
  int fd = outboundLocked(peer);
  FrameHeader fh{tag, len};
  const char* parts[2] = {reinterpret_cast<const char*>(&fh), static_cast<const char*>(data)};
  size_t sizes[2] = {sizeof(fh), len};
  auto deadline = deadlineIn(timeoutMs_);
  for (int part = 0; part < 2; ++part) {
    const char* p = parts[part];
    size_t left = sizes[part];
    while (left > 0) {
      ssize_t w = ::send(fd, p, left, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w > 0) {
        p += w;
        left -= static_cast<size_t>(w);
        continue;
      }
      if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        if (gone_[static_cast<size_t>(peer)].empty())
          gone_[static_cast<size_t>(peer)] = cat("send failed: ", std::strerror(errno));
        throwPeerGone(peer, "TcpMesh::send");
      }
      if (msLeft(deadline) == 0)
        KVCOMM_THROW(Timeout, "TcpMesh::send", "rank ", peer, " did not drain ", left, " bytes within ", timeoutMs_,
                     " ms");
      // Drain our own inbound connections while the peer's buffer is full, so that symmetric exchanges progress.
      std::vector<pollfd> pfds{{fd, POLLOUT, 0}};
      pollfd lp{listener_.get(), POLLIN, 0};
      pfds.push_back(lp);
      for (auto& in : inbound_) pfds.push_back({in->fd.get(), POLLIN, 0});
      int rc = poll(pfds.data(), pfds.size(), std::min(msLeft(deadline), 100));
      if (rc > 0 && pfds.size() > 1) progressLocked(0);
    }
  }
}

void TcpMesh::recvLocked(int peer, uint64_t tag, void* data, size_t len, Clock::time_point deadline) {
  KVCOMM_CHECK_ARG(peer >= 0 && peer < size_, "TcpMesh::recv", "peer ", peer, " out of range [0, ", size_, ")");
  while (true) {
    auto it = stash_.find({peer, tag});
    if (it != stash_.end() && !it->second.empty()) {
      std::vector<char> msg = std::move(it->second.front());
      it->second.pop_front();
      if (it->second.empty()) stash_.erase(it);
      if (msg.size() != len)
        KVCOMM_THROW(InternalError, "TcpMesh::recv", "message from rank ", peer, " has ", msg.size(),
                     " bytes, expected ", len, " (ranks called collectives in a different order?)");
      if (len) std::memcpy(data, msg.data(), len);
      return;
    }
    if (!gone_[static_cast<size_t>(peer)].empty()) throwPeerGone(peer, "TcpMesh::recv");
    int left = msLeft(deadline);
    if (left == 0)
      KVCOMM_THROW(Timeout, "TcpMesh::recv", "no message from rank ", peer, " within ", timeoutMs_,
                   " ms (is it alive and in the same collective?)");
    progressLocked(left < 0 ? 1000 : std::min(left, 1000));
  }
}

void TcpMesh::send(int peer, uint64_t tag, const void* data, size_t len) {
  std::lock_guard<std::mutex> lock(mu_);
  sendLocked(peer, tag, data, len);
}

void TcpMesh::recv(int peer, uint64_t tag, void* data, size_t len) {
  std::lock_guard<std::mutex> lock(mu_);
  recvLocked(peer, tag, data, len, deadlineIn(timeoutMs_));
}

void TcpMesh::sendRecv(int sendPeer, const void* sdata, size_t slen, int recvPeer, void* rdata, size_t rlen,
                       uint64_t tag) {
  std::lock_guard<std::mutex> lock(mu_);
  sendLocked(sendPeer, tag, sdata, slen);
  recvLocked(recvPeer, tag, rdata, rlen, deadlineIn(timeoutMs_));
}

void TcpMesh::allgather(const std::vector<int>& members, int me, void* data, size_t bytesPerRank, uint64_t tag) {
  size_t n = members.size();
  if (n <= 1) return;
  char* base = static_cast<char*>(data);
  int next = members[(static_cast<size_t>(me) + 1) % n];
  int prev = members[(static_cast<size_t>(me) + n - 1) % n];
  for (size_t s = 0; s + 1 < n; ++s) {
    size_t sendIdx = (static_cast<size_t>(me) + n - s) % n;
    size_t recvIdx = (static_cast<size_t>(me) + 2 * n - s - 1) % n;
    sendRecv(next, base + sendIdx * bytesPerRank, bytesPerRank, prev, base + recvIdx * bytesPerRank, bytesPerRank, tag);
  }
}

}  // namespace kvcomm::detail
