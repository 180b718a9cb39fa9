#include "fetch/transport/tcp/tcp_client.hpp"

#include <sys/uio.h>

#include <atomic>
#include <cstring>

#include "common/check.hpp"
#include "common/socket.hpp"
#include "fetch/transport/net/net_io.hpp"

namespace kvcomm::detail {

std::string describePeer(const NetContext& c, int rank) {
  const std::string name = static_cast<size_t>(rank) < c.sourceNames.size() ? c.sourceNames[static_cast<size_t>(rank)]
                                                                            : cat("source rank ", rank);
  return cat(name, " (", c.descs[static_cast<size_t>(rank)].tcp.toString(), ")");
}

HelloedConnection connectHello(const NetContext& c, int rank) {
  const RemoteDescriptor& d = c.descs[static_cast<size_t>(rank)];
  const std::string who = describePeer(c, rank);
  HelloedConnection out;
  std::string no;
  out.fd = connectOnce(d.tcp, c.netTimeoutMs, &no);
  if (!out.fd) KVCOMM_THROW(NetworkError, "fetch (tcp connect)", who, ": ", no, " (is it alive?)");
  WireHello h{};
  h.magic = kWireHelloMagic;
  h.version = kFetchProtocolVersion;
  h.minVersion = kFetchMinProtocolVersion;
  h.caps = kCapDirect | kCapTcp;
  h.requesterRank = c.rank;
  h.regionId = d.regionId;
  h.groupId = c.groupId;
  const bool auth = static_cast<size_t>(rank) < c.capabilities.size();
  WireCapability cap{};
  if (auth) {
    h.caps |= kCapAuth;
    cap = c.capabilities[static_cast<size_t>(rank)];
  }
  iovec v[2] = {{&h, sizeof(h)}, {&cap, sizeof(cap)}};
  int err = 0;
  IoResult r = writeAll(out.fd.get(), v, auth ? 2 : 1, c.netTimeoutMs, nullptr, &err);
  WireHelloReply reply{};
  if (r == IoResult::Ok)
    r = readExact(out.fd.get(), &reply, sizeof(reply), c.netTimeoutMs, c.netTimeoutMs, nullptr, &err);
  if (r != IoResult::Ok)
    KVCOMM_THROW(NetworkError, "fetch (tcp connect)", who, ": no hello reply: ", ioResultText(r),
                 err ? cat(" (", std::strerror(err), ")") : std::string());
  std::string why = decodeHelloReply(&reply, sizeof(reply), &reply);
  if (!why.empty())
    KVCOMM_THROW(Unsupported, "fetch (tcp connect)", who, " is not a kvcomm fetch server of this version: ", why);
  if (reply.status != static_cast<int32_t>(WireStatus::Ok))
    KVCOMM_THROW(Unsupported, "fetch (tcp connect)", who,
                 " refused the connection: ", wireStatusName(static_cast<WireStatus>(reply.status)), ": ",
                 reply.reason);
  if (reply.version < kFetchMinProtocolVersion || reply.version > kFetchProtocolVersion)
    KVCOMM_THROW(Unsupported, "fetch (tcp connect)", who, " speaks fetch protocol version ", reply.version,
                 " but this kvcomm speaks ", kFetchMinProtocolVersion, " to ", kFetchProtocolVersion,
                 reply.version < kFetchMinProtocolVersion ? " (its kvcomm is older: upgrade it)" : "");
  if ((reply.caps & (kCapDirect | kCapTcp)) != (kCapDirect | kCapTcp))
    KVCOMM_THROW(Unsupported, "fetch (tcp connect)", who, " does not serve direct (one-sided) reads (caps 0x", std::hex,
                 reply.caps, ")");
  if (reply.regionId != d.regionId)
    KVCOMM_THROW(Unsupported, "fetch (tcp connect)", who, " serves region 0x", std::hex, reply.regionId, ", not 0x",
                 d.regionId, " (a stale descriptor)");
  out.serverCaps = reply.caps;
  return out;
}

ControlAnswer controlRequest(int fd, uint32_t kind, uint64_t generation, const std::vector<uint8_t>& body,
                             int64_t timeoutMs, const std::string& who) {
  std::vector<WireRun> runs = encodeControl(kind, body.data(), body.size());
  WireRequest q{};
  q.magic = kWireControlMagic;
  q.numRuns = static_cast<uint32_t>(runs.size());
  q.requestId = kind;
  q.generation = generation;
  iovec v[2] = {{&q, sizeof(q)}, {runs.data(), runs.size() * sizeof(WireRun)}};
  int err = 0;
  auto failed = [&](IoResult r, const char* during) {
    KVCOMM_THROW(NetworkError, "fetch (control request)", who, ": ", during, ": ", ioResultText(r),
                 err ? cat(" (", std::strerror(err), ")") : std::string());
  };
  IoResult r = writeAll(fd, v, 2, timeoutMs, nullptr, &err);
  if (r != IoResult::Ok) failed(r, "sending the request");
  WireReply head{};
  r = readExact(fd, &head, sizeof(head), timeoutMs, timeoutMs, nullptr, &err);
  if (r != IoResult::Ok) failed(r, "waiting for its answer");
  std::string why = decodeReply(&head, sizeof(head), &head);
  if (!why.empty() || head.requestId != kind)
    KVCOMM_THROW(NetworkError, "fetch (control request)", who,
                 " answered with a malformed reply: ", why.empty() ? cat("request id ", head.requestId) : why);
  ControlAnswer a;
  a.status = static_cast<WireStatus>(head.status);
  if (a.status != WireStatus::Ok) {
    a.why.resize(head.errorBytes);
    r = readExact(fd, a.why.data(), a.why.size(), timeoutMs, timeoutMs, nullptr, &err);
    if (r != IoResult::Ok) failed(r, "reading its refusal");
    return a;
  }
  a.reply.resize(static_cast<size_t>(head.payloadBytes));
  r = readExact(fd, a.reply.data(), a.reply.size(), timeoutMs, timeoutMs, nullptr, &err);
  if (r != IoResult::Ok) failed(r, "reading its answer");
  return a;
}

}  // namespace kvcomm::detail
