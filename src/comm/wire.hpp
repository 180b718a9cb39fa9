// Bytes kvcomm's TCP sockets carry, and their decoders: the unique id, the hello every connection starts with, the
// root's reply, mesh frames and liveness notices. Everything here reads bytes from another process, so every decoder
// validates sizes and ranges before use and never trusts a length; fuzz/ runs each of them under libFuzzer.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/socket.hpp"
#include "kvcomm/bootstrap.hpp"

namespace kvcomm::detail {

using Nonce = std::array<uint8_t, 16>;

/// Wire constants shared by the mesh and the TCP bootstrap's root handshake.
inline constexpr uint32_t kWireMagic = 0x4b56434d;  // "KVCM"
inline constexpr uint32_t kProtocolVersionWire = kvcomm::kProtocolVersion;

/// Message tag: a group identity and that group's collective sequence number.
inline uint64_t makeTag(uint32_t group, uint32_t seq) {
  return (static_cast<uint64_t>(group) << 32) | seq;
}

/// What a connection is for: joining through the root, carrying mesh frames, or watching liveness (each non-root
/// rank keeps one Watch connection to world rank 0).
enum class HelloKind : uint32_t { Root = 1, Mesh = 2, Watch = 3 };

/// First message on every connection.
struct Hello {
  uint32_t magic;
  uint32_t version;
  uint32_t kind;
  int32_t rank;
  int32_t size;
  uint32_t reserved;
  Nonce nonce;
  SockAddr listenAddr;  // Root hellos: where this rank's mesh listens
};

/// Root's answer to a Root hello (and a listener's refusal of any hello): status 0 and then size() addresses, or
/// status 1 and an error text.
struct HelloReply {
  int32_t status;
  char message[252];
};

/// Header of each mesh frame; `len` payload bytes follow.
struct FrameHeader {
  uint64_t tag;
  uint64_t len;
};
/// Frames longer than this are a protocol violation (the connection is dropped).
inline constexpr uint64_t kMaxFrameBytes = uint64_t(1) << 44;

/// Liveness notices on Watch connections (fixed size).
enum class WatchKind : uint32_t {
  Bye = 1,   ///< the sender closes its mesh normally: its connections closing next is not a death
  Gone = 2,  ///< (from rank 0) member `rank` died (`dead` = 1) or left
};
struct WatchMsg {
  uint32_t magic;
  uint32_t kind;
  int32_t rank;
  int32_t dead;
  char reason[240];
};

/// The unique id's payload: magic, protocol version, nonce and the root's address.
struct IdWire {
  uint32_t magic;
  uint32_t version;
  Nonce nonce;
  uint16_t family;
  uint16_t port;
  uint8_t addr[16];
};
static_assert(sizeof(IdWire) <= sizeof(UniqueId::bytes));

/// Decodes an id; throws InvalidArgumentError unless it is a kvcomm id (magic, address family) of this protocol
/// version.
IdWire decodeUniqueId(const UniqueId& id);
/// The root's address in an id.
SockAddr idAddress(const IdWire& w);

/// Why the bootstrap root refuses a Root hello ("" = accept): magic, version, nonce, kind, size, rank range, rank
/// already joined (`joined[rank]`).
std::string rootHelloRefusal(const Hello& h, const Nonce& nonce, int size, const std::vector<bool>& joined);
/// Why a mesh listener refuses a hello ("" = accept): Mesh and Watch hellos of this group only.
std::string meshHelloRefusal(const Hello& h, const Nonce& nonce, int size);
/// A refusal reply carrying `why`.
HelloReply refusalReply(const std::string& why);

/// Validates a liveness notice from a peer of a group of `size`; false when malformed (the connection is dropped).
bool decodeWatch(const void* bytes, int size, WatchMsg* out);
WatchMsg makeWatch(WatchKind kind, int rank, bool dead, const std::string& reason);

/// Splits one connection's byte stream into frames.
class FrameReader {
 public:
  /// Appends received bytes.
  void append(const char* data, size_t n);
  /// Takes the next complete frame into (*tag, *payload); false while incomplete. Throws NetworkError when the
  /// stream announces a frame longer than kMaxFrameBytes.
  bool next(uint64_t* tag, std::vector<char>* payload);
  /// Bytes received and not yet returned.
  size_t buffered() const { return buf_.size() - off_; }

 private:
  std::vector<char> buf_;
  size_t off_ = 0;
};

}  // namespace kvcomm::detail
