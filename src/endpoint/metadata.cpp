#include "endpoint/metadata.hpp"

#include <sys/stat.h>

#include <cstring>
#include <fstream>

#include "common/check.hpp"
#include "kvlayout/kv_layout.hpp"

namespace kvcomm::detail {

namespace {

struct MetadataBody {
  uint64_t endpointId;
  uint64_t regionId;
  uint64_t generation;
  uint8_t capability[16];
  uint32_t memoryKind;
  uint32_t access;
  int32_t pid;
  uint32_t numRegions;
  uint64_t hostKey;
  uint64_t layoutVersion;
  uint64_t layoutHash;
  sockaddr_storage tcp;
  uint32_t tcpLen;
  char name[kMaxNameBytes + 1];
  uint32_t transports;  // kMetaRdma (was reserved, 0, in the first version-1 writers: nothing offered)
};
static_assert(std::is_trivially_copyable_v<MetadataBody>);

struct RegionRecord {
  uint64_t offset, blockBytes, blockStride, numBlocks;
};

struct ContentsRecord {
  uint32_t elementBytes, headDim, tokensPerBlock, numHeads, headBegin, headEnd, order, replicated;
};

uint32_t fnv1a(const uint8_t* p, size_t n) {
  uint32_t h = 2166136261u;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 16777619u;
  return h;
}

}  // namespace

std::vector<uint8_t> encodeMetadata(const EndpointMetadata& m) {
  const bool described = !m.contents.regions.empty();
  const size_t total = sizeof(MetadataHead) + sizeof(MetadataBody) +
                       m.layout.regions.size() * (sizeof(RegionRecord) + (described ? sizeof(ContentsRecord) : 0));
  std::vector<uint8_t> out(total, 0);
  MetadataBody b{};
  b.endpointId = m.endpointId;
  b.regionId = m.regionId;
  b.generation = m.generation;
  std::memcpy(b.capability, m.capability.bytes, sizeof(b.capability));
  b.memoryKind = m.memoryKind;
  b.access = m.access;
  b.pid = m.pid;
  b.numRegions = static_cast<uint32_t>(m.layout.regions.size());
  b.hostKey = m.hostKey;
  b.layoutVersion = m.layout.version;
  b.layoutHash = m.layoutHash;
  b.tcp = m.tcp.storage;
  b.tcpLen = m.tcp.len;
  std::snprintf(b.name, sizeof(b.name), "%s", m.name.c_str());
  b.transports = (m.transports & kMetaRdma) | (described ? kMetaContents : 0u);
  std::memcpy(out.data() + sizeof(MetadataHead), &b, sizeof(b));
  uint8_t* at = out.data() + sizeof(MetadataHead) + sizeof(b);
  for (const KvRegion& r : m.layout.regions) {
    RegionRecord rec{r.offset, r.blockBytes, r.blockStride ? r.blockStride : r.blockBytes, r.numBlocks};
    std::memcpy(at, &rec, sizeof(rec));
    at += sizeof(rec);
  }
  for (const KvContents& c : m.contents.regions) {
    ContentsRecord rec{c.elementBytes,
                       c.headDim,
                       c.tokensPerBlock,
                       c.numHeads,
                       c.headBegin,
                       c.headEnd,
                       static_cast<uint32_t>(c.order),
                       c.replicated ? 1u : 0u};
    std::memcpy(at, &rec, sizeof(rec));
    at += sizeof(rec);
  }
  MetadataHead h{kMetadataMagic, kMetadataVersion, static_cast<uint16_t>(described ? 2 : 1),
                 static_cast<uint32_t>(total), 0};
  h.checksum = fnv1a(out.data() + sizeof(MetadataHead), total - sizeof(MetadataHead));
  std::memcpy(out.data(), &h, sizeof(h));
  return out;
}

std::string decodeMetadata(const void* data, size_t bytes, EndpointMetadata* out) {
  if (!data || bytes < sizeof(MetadataHead))
    return cat("metadata of ", bytes, " bytes is shorter than its ", sizeof(MetadataHead), "-byte head (truncated?)");
  const auto* p = static_cast<const uint8_t*>(data);
  MetadataHead h;
  std::memcpy(&h, p, sizeof(h));
  if (h.magic != kMetadataMagic)
    return cat("not kvcomm endpoint metadata (magic 0x", std::hex, h.magic, ", expected 0x", kMetadataMagic, ")");
  if (h.minVersion == 0 || h.minVersion > h.version)
    return cat("bad version range [", h.minVersion, ", ", h.version, "]");
  if (h.minVersion > kMetadataVersion)
    return cat("metadata version ", h.minVersion, " to ", h.version, " is newer than this kvcomm reads (",
               kMetadataMinVersion, " to ", kMetadataVersion, "): upgrade kvcomm on this side");
  if (h.version < kMetadataMinVersion)
    return cat("metadata version ", h.minVersion, " to ", h.version, " is older than this kvcomm reads (",
               kMetadataMinVersion, " to ", kMetadataVersion, "): upgrade kvcomm on the peer");
  if (h.totalBytes != bytes)
    return cat("metadata says it is ", h.totalBytes, " bytes but ", bytes, " were given (truncated or padded)");
  if (bytes < sizeof(MetadataHead) + sizeof(MetadataBody))
    return cat("metadata of ", bytes, " bytes is too short for its body (truncated?)");
  if (fnv1a(p + sizeof(MetadataHead), bytes - sizeof(MetadataHead)) != h.checksum)
    return "metadata checksum mismatch (corrupted in transit?)";
  MetadataBody b;
  std::memcpy(&b, p + sizeof(MetadataHead), sizeof(b));
  const size_t regionBytes = bytes - sizeof(MetadataHead) - sizeof(MetadataBody);
  const bool described = (b.transports & kMetaContents) != 0 && h.version >= 2;
  const size_t perRegion = sizeof(RegionRecord) + (described ? sizeof(ContentsRecord) : 0);
  if (b.numRegions == 0 || b.numRegions > kMaxFetchRegions || regionBytes != b.numRegions * perRegion)
    return cat("metadata names ", b.numRegions, " regions in ", regionBytes, " bytes of region records");
  if (b.memoryKind != static_cast<uint32_t>(MemoryKind::Host) &&
      b.memoryKind != static_cast<uint32_t>(MemoryKind::Cuda))
    return cat("bad memory kind ", b.memoryKind);
  if (b.access > 1) return cat("bad access ", b.access);
  SockAddr tcp;
  if (b.tcpLen > sizeof(tcp.storage)) return cat("bad address length ", b.tcpLen);
  tcp.storage = b.tcp;
  tcp.len = b.tcpLen;
  if (tcp.len != 0 && !tcp.valid()) return "bad TCP address";
  b.name[kMaxNameBytes] = '\0';  // the peer's text is never trusted to be terminated
  EndpointMetadata m;
  m.endpointId = b.endpointId;
  m.regionId = b.regionId;
  m.generation = b.generation;
  std::memcpy(m.capability.bytes, b.capability, sizeof(b.capability));
  m.memoryKind = b.memoryKind;
  m.access = b.access;
  m.pid = b.pid;
  m.hostKey = b.hostKey;
  m.tcp = tcp;
  m.name = b.name;
  m.transports = b.transports & kMetaRdma;  // bits this build does not know mean nothing to it
  m.layout.version = b.layoutVersion;
  const uint8_t* at = p + sizeof(MetadataHead) + sizeof(MetadataBody);
  for (uint32_t i = 0; i < b.numRegions; ++i, at += sizeof(RegionRecord)) {
    RegionRecord rec;
    std::memcpy(&rec, at, sizeof(rec));
    m.layout.regions.push_back({rec.offset, rec.blockBytes, rec.blockStride, rec.numBlocks});
  }
  for (uint32_t i = 0; described && i < b.numRegions; ++i, at += sizeof(ContentsRecord)) {
    ContentsRecord rec;
    std::memcpy(&rec, at, sizeof(rec));
    if (rec.order > 1 || rec.replicated > 1)
      return cat("the metadata's contents of region ", i, " have order ", rec.order, " and replicated ",
                 rec.replicated);
    m.contents.regions.push_back({rec.elementBytes, rec.headDim, rec.tokensPerBlock, rec.numHeads, rec.headBegin,
                                  rec.headEnd, static_cast<KvOrder>(rec.order), rec.replicated == 1});
  }
  try {  // the peer's layout must be one it could have registered
    validateLayout(
        m.layout, ~0ull, [](uint64_t, uint64_t) { return true; }, "metadata");
  } catch (const Error& e) {
    return cat("the metadata's layout is malformed: ", e.what());
  }
  m.layoutHash = layoutHash(m.layout);
  if (m.layoutHash != b.layoutHash)
    return cat("the metadata's layout hashes to 0x", std::hex, m.layoutHash, ", not 0x", b.layoutHash);
  if (described) {
    try {  // contents its owner could have registered
      checkDescription(m.layout, m.contents, "metadata");
    } catch (const Error& e) {
      return cat("the metadata's contents do not describe its layout: ", e.what());
    }
  }
  *out = std::move(m);
  return "";
}

uint64_t thisHostKey() {
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  struct stat st {};
  uint64_t ns = stat("/proc/self/ns/net", &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
  uint64_t h = 1469598103934665603ull;
  for (char c : boot) h = (h ^ static_cast<uint8_t>(c)) * 1099511628211ull;
  return (h ^ ns) * 1099511628211ull;
}

}  // namespace kvcomm::detail
