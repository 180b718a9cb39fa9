// An endpoint registration's metadata: the bytes a peer connects from (Registration::metadata, Endpoint::connect).
// Pure encode/decode (unit-tested and fuzzed): decoding never trusts a length, a count or a string of the input.
//
// Layout (little-endian, fields in the host's order: kvcomm builds only for little-endian hosts):
//   MetadataHead  frozen across versions: magic "KVEM", the newest and oldest version the writer speaks, the total
//                 size, an FNV-1a checksum of every byte after the head (truncation and corruption, not forgery:
//                 the capability guards against that)
//   MetadataBody  version 1: endpoint id, registration id and generation, capability, memory kind, access, writer
//                 pid, host key, TCP address, transports offered besides TCP (RDMA), name, layout version and hash,
//                 region count
//   regions       `numRegions` x {offset, blockBytes, blockStride, numBlocks} (u64 each)
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "common/socket.hpp"
#include "fetch/transport/net/wire.hpp"
#include "kvcomm/kv_contents.hpp"
#include "kvcomm/kv_layout.hpp"

namespace kvcomm::detail {

inline constexpr uint32_t kMetadataMagic = 0x4d45564bu;  // "KVEM"
/// This build's metadata version and the oldest it reads. Version 2 adds the regions' contents (kMetaContents);
/// metadata without them is still written as version 1 to 2 (a version-1 reader takes it), with them as 2 to 2 (a
/// version-1 reader says to upgrade instead of misreading the records).
inline constexpr uint16_t kMetadataVersion = 2;
inline constexpr uint16_t kMetadataMinVersion = 1;

struct MetadataHead {
  uint32_t magic;
  uint16_t version;
  uint16_t minVersion;
  uint32_t totalBytes;
  uint32_t checksum;
};
static_assert(sizeof(MetadataHead) == 16 && std::is_trivially_copyable_v<MetadataHead>);

/// What a registration's metadata says (decoded).
struct EndpointMetadata {
  uint64_t endpointId = 0;
  uint64_t regionId = 0;
  uint64_t generation = 0;
  WireCapability capability{};
  uint32_t memoryKind = 0;  ///< MemoryKind
  uint32_t access = 0;      ///< Access
  int32_t pid = 0;
  uint64_t hostKey = 0;  ///< boot id and network namespace: equal on one host and namespace
  SockAddr tcp;
  uint32_t transports = 0;  ///< kMetaRdma: the owner's endpoint has an RDMA device (peers may connect over verbs)
  std::string name;         ///< at most kMaxNameBytes
  KvLayout layout;
  uint64_t layoutHash = 0;
  KvDescription contents;  ///< empty: not described
};

inline constexpr size_t kMaxNameBytes = 63;
/// Bits of EndpointMetadata::transports (version 1 writers that predate them set none).
inline constexpr uint32_t kMetaRdma = 1u << 0;
/// A contents record follows every region record (version 2).
inline constexpr uint32_t kMetaContents = 1u << 1;

std::vector<uint8_t> encodeMetadata(const EndpointMetadata& m);
/// "" when `bytes` bytes at `data` are metadata this build reads (copied into *out), else why not (not kvcomm
/// metadata, truncated, corrupted, another version, a malformed layout or address).
std::string decodeMetadata(const void* data, size_t bytes, EndpointMetadata* out);

/// This host and network namespace (boot id, /proc/self/ns/net's inode), hashed.
uint64_t thisHostKey();

}  // namespace kvcomm::detail
