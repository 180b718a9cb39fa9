// The arena session protocol: messages on one SOCK_SEQPACKET Unix connection between two processes (one datagram per
// message, descriptors attached with SCM_RIGHTS to Pieces messages only). Every message is a 16-byte header and a
// body whose size the type fixes (plus counted arrays); decode() checks every field of bytes that come from another
// process before anything uses them, and encode() writes the one canonical form (reserved fields zero), so
// decode(encode(m)) == m and encode(decode(bytes)) == bytes.
//
// Phases of a session:
//   1. handshake: the client sends Hello; the server (which checked SO_PEERCRED before reading) answers Welcome, or
//      Refused with a reason and closes.
//   2. any number of, in either direction:
//      - import: Import(token) from the importer; the owner answers Deny(reason), or Grant (the arena's description
//        and a new lease) followed by Pieces messages carrying every chunk's descriptor;
//      - growth: Grown (new generation, bytes, layout) followed by Pieces with the new chunks; GrowAck back;
//      - close: Close(lease) from the importer once it unmapped; CloseAck back;
//      - revoke: Revoked(lease, reason) from an owner that released the arena;
//      - User: application bytes.
//   3. Bye (or end of stream): the session ends; leases over it are dropped on both sides.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kvcomm/limits.hpp"
#include "symm/memory_backend.hpp"

namespace kvcomm::detail::arena {

inline constexpr uint32_t kMagic = 0x5241564b;  // "KVAR" in memory order
inline constexpr uint16_t kVersion = 1;
inline constexpr size_t kHeaderBytes = 16;
inline constexpr size_t kMaxMessage = 64 * 1024;  // header included
inline constexpr size_t kMaxRegions = 1024;       // 32 KiB of regions in a Grant or Grown
static_assert(kMaxRegions == limits::kMaxArenaRegions, "kvcomm/limits.hpp");
inline constexpr size_t kPiecesPerMessage = 64;   // descriptors per Pieces message (well under SCM_MAX_FD)
inline constexpr uint32_t kMaxPieces = 1u << 16;  // pieces of one arena
inline constexpr size_t kMaxReason = 1024;
inline constexpr size_t kMaxUserBytes = 60 * 1024;
inline constexpr uint64_t kMaxCapacity = 1ull << 48;  // 256 TiB: a larger claimed capacity is malformed

enum class MsgType : uint16_t {
  Hello = 1,
  Welcome = 2,
  Refused = 3,
  Import = 4,
  Grant = 5,
  Deny = 6,
  Pieces = 7,
  Grown = 8,
  GrowAck = 9,
  Close = 10,
  CloseAck = 11,
  Revoked = 12,
  User = 13,
  Bye = 14,
};
const char* msgTypeName(MsgType t);

struct Header {
  uint32_t magic;
  uint16_t version;
  uint16_t type;
  uint32_t seq;     // request number; echoed by the reply (Grant/Deny, CloseAck)
  uint32_t length;  // body bytes
};
static_assert(sizeof(Header) == kHeaderBytes);

/// Hello and Welcome.
struct HelloBody {
  int32_t pid;
  uint32_t uid;
  uint64_t reserved;
};
struct ImportBody {
  uint64_t arenaId;
  uint64_t generation;
  uint8_t token[16];
};
/// Followed by numRegions WireRegion.
struct GrantBody {
  uint64_t arenaId;
  uint64_t generation;
  uint64_t leaseId;
  uint64_t capacity;
  uint64_t bytes;
  uint64_t granularity;
  uint64_t layoutVersion;
  uint32_t handleKind;  // HandleKind: MemFd, CudaPosixFd or CudaIpc
  int32_t device;
  uint32_t numRegions;
  uint32_t numPieces;  // descriptors that follow in Pieces messages (0 for CudaIpc)
  uint8_t ipcHandle[64];
};
struct WireRegion {
  uint64_t offset;
  uint64_t blockBytes;
  uint64_t blockStride;
  uint64_t numBlocks;
};
/// Followed by count PieceMeta; carries exactly count descriptors.
struct PiecesBody {
  uint64_t arenaId;
  uint64_t leaseId;
  uint32_t count;
  uint32_t last;  // 1 on the last Pieces message of a Grant or Grown
};
/// Followed by numRegions WireRegion.
struct GrownBody {
  uint64_t arenaId;
  uint64_t leaseId;
  uint64_t generation;
  uint64_t bytes;
  uint64_t layoutVersion;
  uint32_t numRegions;
  uint32_t numPieces;
};
/// Close, CloseAck.
struct LeaseBody {
  uint64_t arenaId;
  uint64_t leaseId;
};
/// Followed by the reason (ok == 0 only).
struct GrowAckBody {
  uint64_t arenaId;
  uint64_t leaseId;
  uint64_t generation;
  uint32_t ok;
  uint32_t reserved;
};
/// Followed by the reason.
struct RevokedBody {
  uint64_t arenaId;
  uint64_t leaseId;
};

/// One decoded message (the fields its type uses).
struct Message {
  MsgType type = MsgType::Bye;
  uint32_t seq = 0;
  HelloBody hello{};
  ImportBody import{};
  GrantBody grant{};
  PiecesBody pieces{};
  GrownBody grown{};
  LeaseBody lease{};
  GrowAckBody growAck{};
  RevokedBody revoked{};
  std::vector<WireRegion> regions;  // Grant, Grown
  std::vector<PieceMeta> metas;     // Pieces
  std::string reason;               // Refused, Deny, GrowAck, Revoked (raw bytes; show with printable())
  std::vector<uint8_t> user;        // User
};

/// Decodes one datagram of `len` bytes that arrived with `nfds` descriptors. Returns "" when well formed, else why
/// not (the session is then dropped).
std::string decode(const uint8_t* data, size_t len, size_t nfds, Message* out);
/// The canonical bytes of `m` (its type's fields; counts taken from the arrays).
std::vector<uint8_t> encode(const Message& m);

/// An arena id as errors and logs show it ("0x0123456789abcdef").
std::string arenaName(uint64_t id);

/// `text` with bytes outside printable ASCII replaced by '?' (peer text shown in errors and logs).
std::string printable(const std::string& text);

}  // namespace kvcomm::detail::arena
