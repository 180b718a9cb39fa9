#include "comm/wire.hpp"

#include <sys/socket.h>

#include <cstring>

#include "common/check.hpp"

namespace kvcomm::detail {

IdWire decodeUniqueId(const UniqueId& id) {
  IdWire w;
  std::memcpy(&w, id.bytes.data(), sizeof(w));
  KVCOMM_CHECK_ARG(w.magic == kWireMagic && (w.family == AF_INET || w.family == AF_INET6), "TcpBootstrap",
                   "the unique id is not a kvcomm id (bad magic or address family)");
  KVCOMM_CHECK_ARG(w.version == kProtocolVersion, "TcpBootstrap", "the unique id was made by protocol version ",
                   w.version, ", this library speaks ", kProtocolVersion);
  return w;
}

SockAddr idAddress(const IdWire& w) {
  SockAddr a;
  if (w.family == AF_INET) {
    auto* in = reinterpret_cast<sockaddr_in*>(&a.storage);
    in->sin_family = AF_INET;
    std::memcpy(&in->sin_addr, w.addr, 4);
    a.len = sizeof(sockaddr_in);
  } else {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&a.storage);
    in6->sin6_family = AF_INET6;
    std::memcpy(&in6->sin6_addr, w.addr, 16);
    a.len = sizeof(sockaddr_in6);
  }
  a.setPort(w.port);
  return a;
}

namespace {
std::string commonRefusal(const Hello& h, const Nonce& nonce) {
  if (h.magic != kWireMagic) return "bad magic (not a kvcomm peer)";
  if (h.version != kProtocolVersionWire)
    return cat("protocol version mismatch: this rank speaks ", h.version, ", the listener speaks ",
               kProtocolVersionWire);
  if (h.nonce != nonce) return "nonce mismatch: the unique id belongs to another group (stale or forged id)";
  return "";
}
}  // namespace

std::string rootHelloRefusal(const Hello& h, const Nonce& nonce, int size, const std::vector<bool>& joined) {
  std::string why = commonRefusal(h, nonce);
  if (!why.empty()) return why;
  if (h.kind != static_cast<uint32_t>(HelloKind::Root)) return "mesh connection before the group formed";
  if (h.size != size) return cat("size mismatch: rank ", h.rank, " says size ", h.size, ", the root says ", size);
  if (h.rank <= 0 || h.rank >= size) return cat("rank ", h.rank, " out of range [1, ", size, ")");
  if (!h.listenAddr.valid()) return cat("rank ", h.rank, " sent an invalid listening address");
  if (static_cast<size_t>(h.rank) < joined.size() && joined[static_cast<size_t>(h.rank)])
    return cat("rank ", h.rank, " already joined");
  return "";
}

std::string meshHelloRefusal(const Hello& h, const Nonce& nonce, int size) {
  std::string why = commonRefusal(h, nonce);
  if (!why.empty()) return why;
  if (h.kind == static_cast<uint32_t>(HelloKind::Root))
    return "the group is already formed (a stale unique id, or a rank joined twice)";
  if (h.kind != static_cast<uint32_t>(HelloKind::Mesh) && h.kind != static_cast<uint32_t>(HelloKind::Watch))
    return cat("unknown connection kind ", h.kind);
  if (h.rank < 0 || h.rank >= size) return cat("rank ", h.rank, " out of range [0, ", size, ")");
  if (h.size != size) return cat("size mismatch: rank ", h.rank, " says size ", h.size, ", this group has ", size);
  return "";
}

HelloReply refusalReply(const std::string& why) {
  HelloReply r{};
  r.status = 1;
  std::snprintf(r.message, sizeof(r.message), "%s", why.c_str());
  return r;
}

bool decodeWatch(const void* bytes, int size, WatchMsg* out) {
  std::memcpy(out, bytes, sizeof(WatchMsg));
  out->reason[sizeof(out->reason) - 1] = '\0';
  if (out->magic != kWireMagic) return false;
  if (out->kind == static_cast<uint32_t>(WatchKind::Bye)) return true;
  return out->kind == static_cast<uint32_t>(WatchKind::Gone) && out->rank >= 0 && out->rank < size &&
         (out->dead == 0 || out->dead == 1);
}

WatchMsg makeWatch(WatchKind kind, int rank, bool dead, const std::string& reason) {
  WatchMsg m{};
  m.magic = kWireMagic;
  m.kind = static_cast<uint32_t>(kind);
  m.rank = rank;
  m.dead = dead ? 1 : 0;
  std::snprintf(m.reason, sizeof(m.reason), "%s", reason.c_str());
  return m;
}

void FrameReader::append(const char* data, size_t n) {
  if (off_ > 0 && off_ == buf_.size()) {
    buf_.clear();
    off_ = 0;
  } else if (off_ > (1u << 20) && off_ > buf_.size() / 2) {
    buf_.erase(buf_.begin(), buf_.begin() + static_cast<ptrdiff_t>(off_));  // keep the buffer from creeping
    off_ = 0;
  }
  buf_.insert(buf_.end(), data, data + n);
}

bool FrameReader::next(uint64_t* tag, std::vector<char>* payload) {
  if (buffered() < sizeof(FrameHeader)) return false;
  FrameHeader fh;
  std::memcpy(&fh, buf_.data() + off_, sizeof(fh));
  if (fh.len > kMaxFrameBytes)
    KVCOMM_THROW(NetworkError, "mesh frame", "a frame of ", fh.len, " bytes exceeds the protocol's limit of ",
                 kMaxFrameBytes, " (corrupt stream)");
  if (buffered() - sizeof(fh) < fh.len) return false;
  const char* p = buf_.data() + off_ + sizeof(fh);
  payload->assign(p, p + fh.len);
  *tag = fh.tag;
  off_ += sizeof(fh) + fh.len;
  return true;
}

}  // namespace kvcomm::detail
