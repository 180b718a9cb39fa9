#include "fetch/transport/negotiation.hpp"

#include <algorithm>
#include <cstring>

#include "common/check.hpp"

namespace kvcomm::detail {

FetchTestHooks& fetchTestHooks() {
  static FetchTestHooks hooks;
  return hooks;
}

DescriptorHead makeHead(uint32_t caps) {
  const FetchTestHooks& t = fetchTestHooks();
  DescriptorHead h{};
  h.magic = kDescriptorMagic;
  h.version = t.overrideVersion ? t.version : kFetchProtocolVersion;
  h.minVersion = t.overrideVersion ? t.minVersion : kFetchMinProtocolVersion;
  h.caps = caps & ~t.withhold;
  h.descriptorBytes = sizeof(RemoteDescriptor);
  return h;
}

uint16_t checkHeads(const std::vector<DescriptorHead>& heads, const char* call) {
  uint16_t hi = kFetchProtocolVersion, lo = kFetchMinProtocolVersion;
  for (size_t r = 0; r < heads.size(); ++r) {
    const DescriptorHead& h = heads[r];
    KVCOMM_CHECK_ARG(h.magic == kDescriptorMagic, call, "rank ", r, " sent no fetch descriptor (magic 0x", std::hex,
                     h.magic, "): is it running a kvcomm without cross-host fetch?");
    if (agreeVersion(kFetchProtocolVersion, kFetchMinProtocolVersion, h.version, h.minVersion) == 0)
      KVCOMM_THROW(Unsupported, call, "rank ", r, " speaks fetch protocol versions ", h.minVersion, " to ", h.version,
                   " but this kvcomm speaks ", kFetchMinProtocolVersion, " to ", kFetchProtocolVersion,
                   (h.version < kFetchMinProtocolVersion ? " (that member's kvcomm is older: upgrade it)"
                                                         : " (that member's kvcomm is newer: upgrade this one)"));
    hi = std::min(hi, h.version);
    lo = std::max(lo, h.minVersion);
  }
  // Pairwise overlap with this build does not make a group-wide version: two members may each meet this build but
  // not each other.
  if (hi < lo)
    KVCOMM_THROW(Unsupported, call, "the members' fetch protocol versions have no common version (newest common ", hi,
                 ", oldest required ", lo, ")");
  return hi;
}

std::string checkDescriptor(const RemoteDescriptor& d, const DescriptorHead& head, int rank) {
  if (std::memcmp(&d.head, &head, sizeof(head)) != 0)
    return cat("rank ", rank, "'s descriptor does not match the head it announced");
  if (d.head.descriptorBytes != sizeof(RemoteDescriptor))
    return cat("rank ", rank, "'s descriptor is ", d.head.descriptorBytes, " bytes, not ", sizeof(RemoteDescriptor));
  if (d.tcp.len > sizeof(d.tcp.storage)) return cat("rank ", rank, "'s TCP endpoint is malformed");
  if (d.demand > static_cast<uint32_t>(TransportDemand::Tcp))
    return cat("rank ", rank, " announced an unknown transport demand ", d.demand);
  return "";
}

const char* routeName(Route r) {
  switch (r) {
    case Route::Peer:
      return "peer";
    case Route::Tcp:
      return "tcp";
    case Route::Rdma:
      return "rdma";
    case Route::None:
      break;
  }
  return "none";
}

namespace {

std::string text(const char* fixed, size_t n) {
  return std::string(fixed, strnlen(fixed, n));
}

// "" when `s` can be read over TCP by this rank, else why not.
std::string tcpRefusal(const RemoteDescriptor& s, int rank) {
  if (!(s.head.caps & kCapDirect))
    return cat("rank ", rank, " does not serve direct (one-sided) reads of its memory (its kvcomm offers caps 0x",
               std::hex, s.head.caps, ")");
  if (!(s.head.caps & kCapTcp) || s.tcp.len == 0)
    return cat("rank ", rank, " runs no fetch TCP server",
               s.note[0] ? cat(" (", text(s.note, sizeof(s.note)), ")") : std::string());
  return "";
}

std::string rdmaRefusal(const RemoteDescriptor& me, const RemoteDescriptor& s, int myRank, int rank) {
  if (!(me.head.caps & kCapRdma))
    return cat("this rank (", myRank, ") has no usable RDMA device",
               me.note[0] ? cat(": ", text(me.note, sizeof(me.note))) : std::string());
  if (!(s.head.caps & kCapDirect))
    return cat("rank ", rank, " does not serve direct (one-sided) reads of its memory (caps 0x", std::hex, s.head.caps,
               ")");
  if (!(s.head.caps & kCapRdma))
    return cat("rank ", rank, " has no usable RDMA device",
               s.note[0] ? cat(": ", text(s.note, sizeof(s.note))) : std::string());
  std::string a = text(me.rdmaLinkLayer, sizeof(me.rdmaLinkLayer)), b = text(s.rdmaLinkLayer, sizeof(s.rdmaLinkLayer));
  if (a != b)
    return cat("rank ", rank, "'s RDMA device is on ", b, " but this rank's (", myRank, ") is on ", a,
               " (no path between the fabrics)");
  return "";
}

}  // namespace

std::vector<Route> chooseRoutes(const RouteInput& in, std::vector<std::string>* why) {
  const size_t n = in.descs.size();
  std::vector<Route> out(n, Route::None);
  why->assign(n, "");
  const RemoteDescriptor& me = in.descs[static_cast<size_t>(in.me)];
  for (size_t r = 0; r < n; ++r) {
    const int rank = static_cast<int>(r);
    if (rank == in.me) {  // local copies need no transport, whatever is demanded
      out[r] = Route::Peer;
      continue;
    }
    const RemoteDescriptor& s = in.descs[r];
    std::string noTcp = tcpRefusal(s, rank), noRdma = rdmaRefusal(me, s, in.me, rank);
    const bool mapped = in.mapped[r] != 0;
    switch (in.demand) {
      case TransportDemand::Peer:
        if (mapped)
          out[r] = Route::Peer;
        else
          (*why)[r] = cat("KVCOMM_FETCH_TRANSPORT=peer, but member ", rank,
                          " is not mapped here (another host, or no P2P access between the GPUs)");
        break;
      case TransportDemand::Tcp:
        if (noTcp.empty())
          out[r] = Route::Tcp;
        else
          (*why)[r] = cat("KVCOMM_FETCH_TRANSPORT=tcp, but ", noTcp);
        break;
      case TransportDemand::Rdma:
        if (noRdma.empty())
          out[r] = Route::Rdma;
        else
          (*why)[r] = cat("KVCOMM_FETCH_TRANSPORT=rdma, but ", noRdma);
        break;
      case TransportDemand::Auto:
        if (mapped)
          out[r] = Route::Peer;
        else if (noRdma.empty())
          out[r] = Route::Rdma;
        else if (noTcp.empty())
          out[r] = Route::Tcp;
        else
          (*why)[r] = cat("member ", rank, " is not mapped here, and neither RDMA (", noRdma, ") nor TCP (", noTcp,
                          ") reaches it");
        break;
    }
  }
  return out;
}

}  // namespace kvcomm::detail
