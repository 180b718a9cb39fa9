#include "arena/protocol.hpp"

#include <cstdio>
#include <cstring>

#include "common/check.hpp"

namespace kvcomm::detail::arena {

const char* msgTypeName(MsgType t) {
  switch (t) {
    case MsgType::Hello:
      return "Hello";
    case MsgType::Welcome:
      return "Welcome";
    case MsgType::Refused:
      return "Refused";
    case MsgType::Import:
      return "Import";
    case MsgType::Grant:
      return "Grant";
    case MsgType::Deny:
      return "Deny";
    case MsgType::Pieces:
      return "Pieces";
    case MsgType::Grown:
      return "Grown";
    case MsgType::GrowAck:
      return "GrowAck";
    case MsgType::Close:
      return "Close";
    case MsgType::CloseAck:
      return "CloseAck";
    case MsgType::Revoked:
      return "Revoked";
    case MsgType::User:
      return "User";
    case MsgType::Bye:
      return "Bye";
  }
  return "unknown";
}

std::string arenaName(uint64_t id) {
  char b[24];
  std::snprintf(b, sizeof(b), "0x%016llx", static_cast<unsigned long long>(id));
  return b;
}

std::string printable(const std::string& text) {
  std::string out = text;
  for (char& c : out)
    if (c < 0x20 || c > 0x7e) c = '?';
  return out;
}

namespace {

bool isPowerOfTwo(uint64_t v) {
  return v != 0 && (v & (v - 1)) == 0;
}

bool allZero(const uint8_t* p, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (p[i]) return false;
  return true;
}

// Reads a fixed-size body part and advances; false when fewer bytes are left.
template <typename T>
bool take(const uint8_t*& p, size_t& left, T* out) {
  if (left < sizeof(T)) return false;
  std::memcpy(out, p, sizeof(T));
  p += sizeof(T);
  left -= sizeof(T);
  return true;
}

std::string takeRegions(const uint8_t*& p, size_t& left, uint32_t n, std::vector<WireRegion>* out) {
  if (n > kMaxRegions) return cat(n, " regions (at most ", kMaxRegions, ")");
  if (left < n * sizeof(WireRegion)) return cat("truncated region table (", n, " regions announced)");
  out->resize(n);
  if (n) std::memcpy(out->data(), p, n * sizeof(WireRegion));
  p += n * sizeof(WireRegion);
  left -= n * sizeof(WireRegion);
  return "";
}

std::string takeReason(const uint8_t* p, size_t left, std::string* out) {
  if (left > kMaxReason) return cat("a reason of ", left, " bytes (at most ", kMaxReason, ")");
  out->assign(reinterpret_cast<const char*>(p), left);
  return "";
}

std::string decodeBody(const uint8_t* p, size_t left, size_t nfds, Message* m) {
  auto exact = [&](size_t want) -> std::string {
    return left == want ? "" : cat("body of ", left, " bytes, expected ", want);
  };
  if (m->type != MsgType::Pieces && nfds != 0) return cat(nfds, " descriptors attached to a message that carries none");
  switch (m->type) {
    case MsgType::Hello:
    case MsgType::Welcome: {
      if (auto e = exact(sizeof(HelloBody)); !e.empty()) return e;
      take(p, left, &m->hello);
      if (m->hello.reserved != 0) return "reserved field set";
      if (m->hello.pid <= 0) return cat("pid ", m->hello.pid);
      return "";
    }
    case MsgType::Refused:
    case MsgType::Deny:
      return takeReason(p, left, &m->reason);
    case MsgType::Import:
      if (auto e = exact(sizeof(ImportBody)); !e.empty()) return e;
      take(p, left, &m->import);
      return "";
    case MsgType::Grant: {
      if (!take(p, left, &m->grant)) return "truncated grant";
      const GrantBody& g = m->grant;
      if (auto e = takeRegions(p, left, g.numRegions, &m->regions); !e.empty()) return e;
      if (left != 0) return cat(left, " bytes after the region table");
      auto kind = static_cast<HandleKind>(g.handleKind);
      if (kind != HandleKind::MemFd && kind != HandleKind::CudaPosixFd && kind != HandleKind::CudaIpc)
        return cat("handle kind ", g.handleKind);
      if (kind == HandleKind::MemFd ? g.device != -1 : g.device < 0) return cat("device ", g.device);
      if (!isPowerOfTwo(g.granularity)) return cat("granularity ", g.granularity, " is not a power of two");
      if (g.capacity == 0 || g.capacity > kMaxCapacity || g.capacity % g.granularity != 0)
        return cat("capacity ", g.capacity);
      if (g.bytes == 0 || g.bytes > g.capacity || g.bytes % g.granularity != 0) return cat("bytes ", g.bytes);
      if (g.numRegions == 0) return "no regions";
      if (g.generation == 0 || g.leaseId == 0 || g.arenaId == 0) return "zero arena id, generation or lease";
      if (kind == HandleKind::CudaIpc) {
        if (g.numPieces != 0) return "a cuda_ipc grant with pieces";
      } else {
        if (g.numPieces == 0 || g.numPieces > kMaxPieces) return cat(g.numPieces, " pieces");
        if (!allZero(g.ipcHandle, sizeof(g.ipcHandle))) return "an IPC handle in a grant of another kind";
      }
      return "";
    }
    case MsgType::Pieces: {
      if (!take(p, left, &m->pieces)) return "truncated pieces header";
      const PiecesBody& b = m->pieces;
      if (b.count == 0 || b.count > kPiecesPerMessage) return cat(b.count, " pieces in one message");
      if (b.last > 1) return cat("last = ", b.last);
      if (left != b.count * sizeof(PieceMeta)) return cat("piece table of ", left, " bytes for ", b.count, " pieces");
      if (nfds != b.count) return cat(nfds, " descriptors for ", b.count, " pieces");
      m->metas.resize(b.count);
      std::memcpy(m->metas.data(), p, left);
      for (const PieceMeta& pm : m->metas) {
        uint64_t end = 0;
        if (pm.bytes == 0 || pm.chunkBytes == 0 || __builtin_add_overflow(pm.offset, pm.bytes, &end) ||
            end > kMaxCapacity || __builtin_add_overflow(pm.chunkOffset, pm.bytes, &end) || end > pm.chunkBytes)
          return cat("piece at offset ", pm.offset, " (", pm.bytes, " bytes, chunk offset ", pm.chunkOffset, " of a ",
                     pm.chunkBytes, "-byte chunk) is malformed");
      }
      return "";
    }
    case MsgType::Grown: {
      if (!take(p, left, &m->grown)) return "truncated growth notice";
      const GrownBody& g = m->grown;
      if (auto e = takeRegions(p, left, g.numRegions, &m->regions); !e.empty()) return e;
      if (left != 0) return cat(left, " bytes after the region table");
      if (g.numRegions == 0) return "no regions";
      if (g.numPieces > kMaxPieces) return cat(g.numPieces, " pieces");
      if (g.bytes == 0 || g.bytes > kMaxCapacity) return cat("bytes ", g.bytes);
      if (g.generation == 0 || g.leaseId == 0 || g.arenaId == 0) return "zero arena id, generation or lease";
      return "";
    }
    case MsgType::GrowAck: {
      if (!take(p, left, &m->growAck)) return "truncated growth acknowledgement";
      if (m->growAck.reserved != 0) return "reserved field set";
      if (m->growAck.ok > 1) return cat("ok = ", m->growAck.ok);
      if (m->growAck.ok == 1 && left != 0) return "a successful acknowledgement with a reason";
      return takeReason(p, left, &m->reason);
    }
    case MsgType::Close:
    case MsgType::CloseAck:
      if (auto e = exact(sizeof(LeaseBody)); !e.empty()) return e;
      take(p, left, &m->lease);
      return "";
    case MsgType::Revoked:
      if (!take(p, left, &m->revoked)) return "truncated revocation";
      return takeReason(p, left, &m->reason);
    case MsgType::User:
      if (left > kMaxUserBytes) return cat("an application message of ", left, " bytes");
      m->user.assign(p, p + left);
      return "";
    case MsgType::Bye:
      return exact(0);
  }
  return cat("unknown message type ", static_cast<unsigned>(m->type));
}

// resize + memcpy rather than vector::insert: GCC 12 reports a false -Warray-bounds in insert's inlined memmove.
void append(std::vector<uint8_t>& out, const void* p, size_t n) {
  if (n == 0) return;
  size_t at = out.size();
  out.resize(at + n);
  std::memcpy(out.data() + at, p, n);
}

template <typename T>
void put(std::vector<uint8_t>& out, const T& v) {
  append(out, &v, sizeof(T));
}

void putText(std::vector<uint8_t>& out, const std::string& text) {
  append(out, text.data(), std::min(text.size(), kMaxReason));
}

}  // namespace

std::string decode(const uint8_t* data, size_t len, size_t nfds, Message* out) {
  *out = Message{};
  if (len < kHeaderBytes) return cat("a message of ", len, " bytes (shorter than its header)");
  if (len > kMaxMessage) return cat("a message of ", len, " bytes (at most ", kMaxMessage, ")");
  Header h;
  std::memcpy(&h, data, sizeof(h));
  if (h.magic != kMagic) return "bad magic (not an arena session)";
  if (h.version != kVersion) return cat("arena protocol version ", h.version, " (this process speaks ", kVersion, ")");
  if (h.length != len - kHeaderBytes)
    return cat("header says ", h.length, " body bytes, ", len - kHeaderBytes, " came");
  if (h.type < static_cast<uint16_t>(MsgType::Hello) || h.type > static_cast<uint16_t>(MsgType::Bye))
    return cat("unknown message type ", h.type);
  out->type = static_cast<MsgType>(h.type);
  out->seq = h.seq;
  std::string why = decodeBody(data + kHeaderBytes, len - kHeaderBytes, nfds, out);
  if (!why.empty()) return cat(msgTypeName(out->type), ": ", why);
  return "";
}

std::vector<uint8_t> encode(const Message& m) {
  std::vector<uint8_t> out(kHeaderBytes);
  switch (m.type) {
    case MsgType::Hello:
    case MsgType::Welcome:
      put(out, m.hello);
      break;
    case MsgType::Refused:
    case MsgType::Deny:
      putText(out, m.reason);
      break;
    case MsgType::Import:
      put(out, m.import);
      break;
    case MsgType::Grant: {
      GrantBody g = m.grant;
      g.numRegions = static_cast<uint32_t>(m.regions.size());
      put(out, g);
      for (const WireRegion& r : m.regions) put(out, r);
      break;
    }
    case MsgType::Pieces: {
      PiecesBody b = m.pieces;
      b.count = static_cast<uint32_t>(m.metas.size());
      put(out, b);
      for (const PieceMeta& pm : m.metas) put(out, pm);
      break;
    }
    case MsgType::Grown: {
      GrownBody g = m.grown;
      g.numRegions = static_cast<uint32_t>(m.regions.size());
      put(out, g);
      for (const WireRegion& r : m.regions) put(out, r);
      break;
    }
    case MsgType::GrowAck:
      put(out, m.growAck);
      if (!m.growAck.ok) putText(out, m.reason);
      break;
    case MsgType::Close:
    case MsgType::CloseAck:
      put(out, m.lease);
      break;
    case MsgType::Revoked:
      put(out, m.revoked);
      putText(out, m.reason);
      break;
    case MsgType::User:
      append(out, m.user.data(), m.user.size());
      break;
    case MsgType::Bye:
      break;
  }
  Header h{kMagic, kVersion, static_cast<uint16_t>(m.type), m.seq, static_cast<uint32_t>(out.size() - kHeaderBytes)};
  std::memcpy(out.data(), &h, sizeof(h));
  return out;
}

}  // namespace kvcomm::detail::arena
