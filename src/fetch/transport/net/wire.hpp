// The fetch protocol between a requester and a member that serves its registered memory over TCP, and the
// decoders of everything that arrives from the other side (pure functions: unit-tested and fuzzed).
//
// Phase 1 (connect): the requester sends a Hello naming the registration it wants to read (region id from the
//   member's descriptor) and the protocol versions it speaks; the server answers a HelloReply: accepted (status Ok,
//   the version both speak, what the server offers) or refused with a reason (another region, an incompatible
//   version, too many connections). A server that does not offer direct reads is refused by the requester.
// Phase 1 of an endpoint's registration: the hello sets kCapAuth and a WireCapability (the registration's 128-bit
//   secret) follows it; a server whose registration demands one refuses a hello without it or with another one
//   (Unauthorized) before it says anything about the memory.
// Phase 2 (requests, one at a time per connection): a Request header and `numRuns` Runs (a write: then the payload,
//   in the order a read's reply carries it); the server re-validates the request against what it serves now
//   (generation, layout hash, ids, bytes backed) before it touches memory and answers a Reply: status Ok and
//   `payloadBytes` bytes (run by run, region by region, the run's blocks back to back), or an error status and a
//   message of at most kMaxWireErrorText bytes. A header that is not a request (bad magic, a run count outside [1,
//   kMaxRunsPerRequest]) ends the connection after its error reply: the stream cannot be trusted after it. Decoding
//   never allocates: headers and runs have fixed caps.
// Control requests (endpoints, phase 2): a Request header with kWireControlMagic whose `numRuns` 16-byte units carry
//   a WireControlHead and its body (kind 1: the RDMA connection of a pair, fetch/transport/rdma/rdma_connect.hpp;
//   kind 2: an endpoint's notification, whose body the endpoint layer decodes); checked like a read (open,
//   generation) and answered by the registration's handler: a Reply with the handler's bytes as payload, or an error.
//   What the handler set up lives as long as the connection (the lease of its queue pairs).
// Every field is in the host's byte order, little-endian on every platform kvcomm builds for (checked below); the
// magics make a peer of another byte order fail phase 1.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "kvcomm/device/fetch.hpp"
#include "kvcomm/symm.hpp"

namespace kvcomm::detail {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the fetch wire format is little-endian");

/// This build's fetch protocol (descriptors and the TCP protocol share it) and the oldest one it still speaks.
inline constexpr uint16_t kFetchProtocolVersion = 1;
inline constexpr uint16_t kFetchMinProtocolVersion = 1;

/// What a member offers to requesters (descriptor and HelloReply).
enum FetchCap : uint32_t {
  kCapDirect = 1u << 0,  ///< serves one-sided reads of its registered memory (no work by the owner's application)
  kCapTcp = 1u << 1,     ///< through its TCP server
  kCapRdma = 1u << 2,    ///< through RDMA READ of registered memory regions
  kCapAuth = 1u << 3,    ///< hello: a WireCapability follows it (endpoint registrations demand one)
  kCapWrite = 1u << 4,   ///< serves writes (requests with kWireWriteMagic) into its registered memory
};

inline constexpr uint32_t kWireHelloMagic = 0x4846564bu;       // "KVFH"
inline constexpr uint32_t kWireHelloReplyMagic = 0x5246564bu;  // "KVFR"
inline constexpr uint32_t kWireRequestMagic = 0x5146564bu;     // "KVFQ": a read
inline constexpr uint32_t kWireWriteMagic = 0x5746564bu;       // "KVFW": a write (its payload follows the runs)
inline constexpr uint32_t kWireControlMagic = 0x4346564bu;     // "KVFC": a control request (its body in the runs)
inline constexpr uint32_t kWireReplyMagic = 0x4146564bu;       // "KVFA"

/// Most runs one request may carry (its body is at most 64 KiB), and most bytes one reply may carry.
inline constexpr uint32_t kMaxRunsPerRequest = 4096;
inline constexpr uint64_t kMaxReplyBytes = 256ull << 20;
/// Longest error text of a reply or a refusal.
inline constexpr uint32_t kMaxWireErrorText = 255;

enum class WireStatus : int32_t {
  Ok = 0,
  Malformed = 1,        ///< not a request of this protocol (magic, run count): the connection ends
  Oversize = 2,         ///< the reply would exceed kMaxReplyBytes
  OutOfRange = 3,       ///< a block id or count outside the served layout
  Stale = 4,            ///< the request names another generation than the one served
  LayoutMismatch = 5,   ///< the request names another layout hash than the one served
  NotBacked = 6,        ///< the blocks are not backed (released) on the server
  WrongRegion = 7,      ///< phase 1: the hello names another registration than the one served
  VersionMismatch = 8,  ///< phase 1: no protocol version both sides speak
  Busy = 9,             ///< phase 1: the server is at its connection cap
  Closing = 10,         ///< the server is shutting down
  Internal = 11,        ///< the server failed to read its own memory (e.g. a CUDA error)
  Unauthorized = 12,    ///< phase 1: the capability is missing or does not match (revoked, rotated, forged)
  ReadOnly = 13,        ///< a write to memory served for reads only (a Fetcher's, or registered read-only)
  Unsupported = 14,     ///< a control request the server cannot serve (no handler, no RDMA device, ...)
};
const char* wireStatusName(WireStatus s);

struct WireHello {
  uint32_t magic;
  uint16_t version;
  uint16_t minVersion;
  uint32_t caps;  ///< what the requester needs (kCapDirect | kCapTcp)
  int32_t requesterRank;
  uint64_t regionId;  ///< the registration it wants to read (from the member's descriptor)
  uint64_t groupId;   ///< the communicator's id
};

/// What follows a hello with kCapAuth: the registration's bearer secret (an endpoint's metadata carries it).
struct WireCapability {
  uint8_t bytes[16];
};

struct WireHelloReply {
  uint32_t magic;
  uint16_t version;  ///< the version the server will speak (Ok), or its own newest (refusals)
  uint16_t minVersion;
  uint32_t caps;  ///< what the server offers
  int32_t status;
  uint64_t regionId;
  char reason[112];  ///< NUL-terminated when status != Ok
};

struct WireRequest {
  uint32_t magic;  ///< kWireRequestMagic (read: the reply carries the payload) or kWireWriteMagic (write: the payload
                   ///< follows the runs; the reply carries none)
  uint32_t numRuns;
  uint64_t requestId;
  uint64_t generation;
  uint64_t layoutHash;
};

/// `blocks` blocks from source block `srcBlock`, in every region.
struct WireRun {
  int64_t srcBlock;
  int64_t blocks;
};

struct WireReply {
  uint32_t magic;
  int32_t status;
  uint64_t requestId;
  uint64_t payloadBytes;
  uint32_t errorBytes;  ///< error text that follows (status != Ok), at most kMaxWireErrorText
  uint32_t reserved;
};

static_assert(sizeof(WireHello) == 32 && sizeof(WireCapability) == 16 && sizeof(WireHelloReply) == 136 &&
              sizeof(WireRequest) == 32 && sizeof(WireRun) == 16 && sizeof(WireReply) == 32);
static_assert(std::is_trivially_copyable_v<WireHello> && std::is_trivially_copyable_v<WireHelloReply> &&
              std::is_trivially_copyable_v<WireRequest> && std::is_trivially_copyable_v<WireReply>);

/// The first 16 bytes of a control request's body: what it asks (kControl*) and how many bytes of body follow.
struct WireControlHead {
  uint32_t kind;
  uint32_t bytes;
  uint64_t reserved;
};
static_assert(sizeof(WireControlHead) == sizeof(WireRun));

/// Control kinds.
inline constexpr uint32_t kControlRdmaConnect = 1;  ///< connect a queue pair set to the registration's fabric
inline constexpr uint32_t kControlNotify = 2;       ///< a notification for the endpoint (endpoint/notify_wire.hpp)

/// The runs of a control request carrying `bytes` of `body` after its head (padded to whole runs): what the
/// request's `numRuns` counts. Throws InvalidArgument when it would exceed kMaxRunsPerRequest runs.
std::vector<WireRun> encodeControl(uint32_t kind, const void* body, size_t bytes);
/// "" when the `numRuns` runs of a control request hold a well-formed head and body (*head set, *body its first
/// byte), else why not.
std::string decodeControl(const WireRun* runs, uint32_t numRuns, WireControlHead* head, const uint8_t** body);

/// The version two sides speak: the newer of both minimums up to the older of both newests; 0 when none.
uint16_t agreeVersion(uint16_t myVersion, uint16_t myMin, uint16_t peerVersion, uint16_t peerMin);

/// Decoders: "" when `size` bytes at `data` are a well-formed message (copied into *out), else why not.
std::string decodeHello(const void* data, size_t size, WireHello* out);
std::string decodeHelloReply(const void* data, size_t size, WireHelloReply* out);
/// Malformed (bad magic, wrong size, run count outside [1, kMaxRunsPerRequest]): the caller replies and closes.
std::string decodeRequest(const void* data, size_t size, WireRequest* out);
std::string decodeReply(const void* data, size_t size, WireReply* out);

/// What a server serves, as a request is checked against it (a snapshot taken under the server's lock).
struct ServedView {
  uint64_t generation = 0;
  uint64_t layoutHash = 0;
  const FetchRegionView* regions = nullptr;  ///< this member's layout
  size_t numRegions = 0;
  uint64_t minBlocks = 0;         ///< valid ids are [0, minBlocks)
  uint64_t blockBytesSum = 0;     ///< bytes one block moves over all regions
  const Range* backed = nullptr;  ///< backed ranges of the buffer, sorted and disjoint
  size_t numBacked = 0;
  const char* staleAdvice = "";  ///< what a Stale refusal tells the requester to do
};

/// Re-validates a decoded request and its runs against what is served: Ok with *payloadBytes set, else the status
/// and *why. Checked arithmetic throughout; allocates nothing.
WireStatus validateRequest(const WireRequest& req, const WireRun* runs, const ServedView& view, uint64_t* payloadBytes,
                           std::string* why);

/// Whether [offset, offset + bytes) lies inside one of the sorted disjoint ranges.
bool rangeCovered(const Range* ranges, size_t n, uint64_t offset, uint64_t bytes);

/// A refusal or acceptance reply with `reason` truncated to fit.
WireHelloReply makeHelloReply(WireStatus status, uint16_t version, uint32_t caps, uint64_t regionId,
                              const std::string& reason);

}  // namespace kvcomm::detail
