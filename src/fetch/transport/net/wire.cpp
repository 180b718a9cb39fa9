#include "fetch/transport/net/wire.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "common/check.hpp"

namespace kvcomm::detail {

const char* wireStatusName(WireStatus s) {
  switch (s) {
    case WireStatus::Ok:
      return "ok";
    case WireStatus::Malformed:
      return "malformed request";
    case WireStatus::Oversize:
      return "oversize request";
    case WireStatus::OutOfRange:
      return "block out of range";
    case WireStatus::Stale:
      return "stale generation";
    case WireStatus::LayoutMismatch:
      return "layout mismatch";
    case WireStatus::NotBacked:
      return "blocks not backed";
    case WireStatus::WrongRegion:
      return "wrong region";
    case WireStatus::VersionMismatch:
      return "protocol version mismatch";
    case WireStatus::Busy:
      return "too many connections";
    case WireStatus::Closing:
      return "server closing";
    case WireStatus::Internal:
      return "server error";
    case WireStatus::Unauthorized:
      return "capability refused";
    case WireStatus::Unsupported:
      return "unsupported control request";
    case WireStatus::ReadOnly:
      return "read-only memory";
  }
  return "unknown status";
}

uint16_t agreeVersion(uint16_t myVersion, uint16_t myMin, uint16_t peerVersion, uint16_t peerMin) {
  uint16_t hi = std::min(myVersion, peerVersion), lo = std::max(myMin, peerMin);
  return hi >= lo && hi > 0 ? hi : 0;
}

std::string decodeHello(const void* data, size_t size, WireHello* out) {
  if (size != sizeof(WireHello)) return cat("a hello is ", sizeof(WireHello), " bytes, not ", size);
  WireHello h;
  std::memcpy(&h, data, sizeof(h));
  if (h.magic != kWireHelloMagic) return cat("bad magic 0x", std::hex, h.magic, " (not a kvcomm fetch client)");
  if (h.version == 0 || h.minVersion == 0 || h.minVersion > h.version)
    return cat("bad version range [", h.minVersion, ", ", h.version, "]");
  if (h.requesterRank < 0) return cat("bad requester rank ", h.requesterRank);
  *out = h;
  return "";
}

std::string decodeHelloReply(const void* data, size_t size, WireHelloReply* out) {
  if (size != sizeof(WireHelloReply)) return cat("a hello reply is ", sizeof(WireHelloReply), " bytes, not ", size);
  WireHelloReply r;
  std::memcpy(&r, data, sizeof(r));
  if (r.magic != kWireHelloReplyMagic) return cat("bad magic 0x", std::hex, r.magic, " (not a kvcomm fetch server)");
  if (r.status < 0 || r.status > static_cast<int32_t>(WireStatus::Unsupported)) return cat("bad status ", r.status);
  r.reason[sizeof(r.reason) - 1] = '\0';  // the peer's text is never trusted to be terminated
  *out = r;
  return "";
}

std::string decodeRequest(const void* data, size_t size, WireRequest* out) {
  if (size != sizeof(WireRequest)) return cat("a request header is ", sizeof(WireRequest), " bytes, not ", size);
  WireRequest q;
  std::memcpy(&q, data, sizeof(q));
  if (q.magic != kWireRequestMagic && q.magic != kWireWriteMagic && q.magic != kWireControlMagic)
    return cat("bad magic 0x", std::hex, q.magic);
  if (q.numRuns == 0 || q.numRuns > kMaxRunsPerRequest)
    return cat("run count ", q.numRuns, " is outside [1, ", kMaxRunsPerRequest, "]");
  *out = q;
  return "";
}

std::string decodeReply(const void* data, size_t size, WireReply* out) {
  if (size != sizeof(WireReply)) return cat("a reply header is ", sizeof(WireReply), " bytes, not ", size);
  WireReply r;
  std::memcpy(&r, data, sizeof(r));
  if (r.magic != kWireReplyMagic) return cat("bad magic 0x", std::hex, r.magic);
  if (r.status < 0 || r.status > static_cast<int32_t>(WireStatus::Unsupported)) return cat("bad status ", r.status);
  if (r.status == 0 && r.errorBytes != 0) return "an Ok reply carries error text";
  if (r.status != 0 && r.payloadBytes != 0) return "an error reply carries payload";
  if (r.errorBytes > kMaxWireErrorText) return cat("error text of ", r.errorBytes, " bytes");
  if (r.payloadBytes > kMaxReplyBytes) return cat("payload of ", r.payloadBytes, " bytes exceeds ", kMaxReplyBytes);
  *out = r;
  return "";
}

std::vector<WireRun> encodeControl(uint32_t kind, const void* body, size_t bytes) {
  const size_t units = 1 + (bytes + sizeof(WireRun) - 1) / sizeof(WireRun);
  KVCOMM_CHECK_ARG(units <= kMaxRunsPerRequest, "fetch (control request)", "a body of ", bytes,
                   " bytes exceeds one request");
  std::vector<WireRun> runs(units, WireRun{0, 0});
  WireControlHead head{kind, static_cast<uint32_t>(bytes), 0};
  std::memcpy(runs.data(), &head, sizeof(head));
  if (bytes) std::memcpy(runs.data() + 1, body, bytes);
  return runs;
}

std::string decodeControl(const WireRun* runs, uint32_t numRuns, WireControlHead* head, const uint8_t** body) {
  if (numRuns == 0 || numRuns > kMaxRunsPerRequest)
    return cat("run count ", numRuns, " is outside [1, ", kMaxRunsPerRequest, "]");
  WireControlHead h;
  std::memcpy(&h, runs, sizeof(h));
  const uint64_t room = (static_cast<uint64_t>(numRuns) - 1) * sizeof(WireRun);
  // The body fills the runs after the head, up to less than one run of padding.
  if (h.bytes > room || room - h.bytes >= sizeof(WireRun))
    return cat("a control body of ", h.bytes, " bytes in ", numRuns - 1, " runs");
  if (h.reserved != 0) return "a control head with reserved bits set";
  *head = h;
  *body = reinterpret_cast<const uint8_t*>(runs + 1);
  return "";
}

bool rangeCovered(const Range* ranges, size_t n, uint64_t offset, uint64_t bytes) {
  if (bytes == 0) return true;
  // The last range starting at or before `offset` is the only candidate.
  size_t lo = 0, hi = n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (ranges[mid].offset <= offset)
      lo = mid + 1;
    else
      hi = mid;
  }
  if (lo == 0) return false;
  const Range& r = ranges[lo - 1];
  return offset - r.offset <= r.bytes && bytes <= r.bytes - (offset - r.offset);
}

WireStatus validateRequest(const WireRequest& req, const WireRun* runs, const ServedView& view, uint64_t* payloadBytes,
                           std::string* why) {
  if (req.generation != view.generation) {
    *why = cat("request names generation ", req.generation, " but generation ", view.generation, " is served (",
               view.staleAdvice, ")");
    return WireStatus::Stale;
  }
  if (req.layoutHash != view.layoutHash) {
    *why = cat("request names layout 0x", std::hex, req.layoutHash, " but 0x", view.layoutHash, " is served");
    return WireStatus::LayoutMismatch;
  }
  uint64_t blocks = 0;
  for (uint32_t i = 0; i < req.numRuns; ++i) {
    const WireRun& r = runs[i];
    // Unsigned compares after the sign checks: no id near 2^63 can wrap past the limit.
    if (r.srcBlock < 0 || r.blocks <= 0 || static_cast<uint64_t>(r.srcBlock) >= view.minBlocks ||
        static_cast<uint64_t>(r.blocks) > view.minBlocks - static_cast<uint64_t>(r.srcBlock)) {
      *why = cat("run ", i, ": blocks [", r.srcBlock, ", +", r.blocks, ") are outside [0, ", view.minBlocks, ")");
      return WireStatus::OutOfRange;
    }
    blocks += static_cast<uint64_t>(r.blocks);  // below 2^28 before, below 2^63 added: no wrap
    uint64_t bytes = 0;
    if (blocks > kMaxReplyBytes || __builtin_mul_overflow(blocks, view.blockBytesSum, &bytes) ||
        bytes > kMaxReplyBytes) {
      *why = cat("the reply would exceed ", kMaxReplyBytes, " bytes (at run ", i, ")");
      return WireStatus::Oversize;
    }
  }
  for (uint32_t i = 0; i < req.numRuns; ++i)
    for (size_t j = 0; j < view.numRegions; ++j) {
      const FetchRegionView& g = view.regions[j];
      // Registration checked every valid block lies inside the buffer, so these products cannot wrap.
      uint64_t first = g.offset + static_cast<uint64_t>(runs[i].srcBlock) * g.blockStride;
      uint64_t extent = static_cast<uint64_t>(runs[i].blocks - 1) * g.blockStride + g.blockBytes;
      if (!rangeCovered(view.backed, view.numBacked, first, extent)) {
        *why = cat("run ", i, ", region ", j, ": [", first, ", +", extent, ") is not backed (released?)");
        return WireStatus::NotBacked;
      }
    }
  *payloadBytes = blocks * view.blockBytesSum;
  return WireStatus::Ok;
}

WireHelloReply makeHelloReply(WireStatus status, uint16_t version, uint32_t caps, uint64_t regionId,
                              const std::string& reason) {
  WireHelloReply r{};
  r.magic = kWireHelloReplyMagic;
  r.version = version;
  r.minVersion = kFetchMinProtocolVersion;
  r.caps = caps;
  r.status = static_cast<int32_t>(status);
  r.regionId = regionId;
  std::snprintf(r.reason, sizeof(r.reason), "%s", reason.c_str());
  return r;
}

}  // namespace kvcomm::detail
