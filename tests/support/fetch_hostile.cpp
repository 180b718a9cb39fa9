#include "support/fetch_hostile.hpp"

#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "common/check.hpp"
#include "kvcomm/error.hpp"

namespace kvtest {

using namespace kvcomm::detail;

RawFetchClient::RawFetchClient(const SockAddr& a) : fd_(connectTcp(a, deadlineIn(2000), "fetch server")) {}

void RawFetchClient::send(const void* p, size_t n) {
  sendAll(fd_.get(), p, n, deadlineIn(2000), "fetch server");
}

bool RawFetchClient::recv(void* p, size_t n, int ms) {
  try {
    recvAll(fd_.get(), p, n, deadlineIn(ms), "fetch server");
    return true;
  } catch (const kvcomm::Error&) {
    return false;
  }
}

bool RawFetchClient::closedByPeer(int ms) {
  char c;
  auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(ms)) {
    ssize_t n = ::recv(fd_.get(), &c, 1, MSG_DONTWAIT);
    if (n == 0) return true;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return false;
}

WireHelloReply RawFetchClient::hello(uint64_t regionId, uint64_t groupId, uint16_t version, uint16_t minVersion) {
  WireHello h{kWireHelloMagic, version, minVersion, kCapDirect | kCapTcp, 0, regionId, groupId};
  sendStruct(h);
  WireHelloReply r{};
  if (!recv(&r, sizeof(r))) r = WireHelloReply{};
  return r;
}

WireReply RawFetchClient::request(const WireRequest& q, const std::vector<WireRun>& runs, std::vector<char>* payload,
                                  std::string* error) {
  sendStruct(q);
  if (!runs.empty()) send(runs.data(), runs.size() * sizeof(WireRun));
  WireReply r{};
  if (!recv(&r, sizeof(r))) return WireReply{};
  if (r.status != 0) {
    std::string text(r.errorBytes, '\0');
    if (r.errorBytes) recv(text.data(), r.errorBytes);
    if (error) *error = text;
  } else if (r.payloadBytes) {
    std::vector<char> sink;
    std::vector<char>& into = payload ? *payload : sink;
    into.resize(r.payloadBytes);
    recv(into.data(), r.payloadBytes);
  }
  return r;
}

WireRequest fetchRequest(const FetchTarget& t, uint32_t runs) {
  static std::atomic<uint64_t> id{0};
  return WireRequest{kWireRequestMagic, runs, ++id, t.generation, t.layoutHash};
}

const char* malformedKindName(int kind) {
  static const char* names[kMalformedKinds] = {
      "bad hello magic",         "wrong region",        "version mismatch", "bad request magic", "zero runs",
      "run count above the cap", "block out of range",  "negative id",      "count near 2^63",   "stale generation",
      "another layout",          "reply above the cap", "truncated header", "truncated runs",    "stalled request"};
  return kind >= 0 && kind < kMalformedKinds ? names[kind] : "?";
}

std::string sendMalformed(const FetchTarget& t, int kind, int64_t stallMs) {
  const std::string what = malformedKindName(kind);
  try {
    RawFetchClient c(t.addr);
    auto expectClosed = [&](const std::string& before) {
      return c.closedByPeer(static_cast<int>(stallMs)) ? before : cat(what, ": the server kept the connection");
    };
    auto status = [](auto s) { return static_cast<int32_t>(s); };
    switch (kind) {
      case 0: {
        WireHello h{0xdeadbeef, 1, 1, 0, 0, 0, 0};
        c.sendStruct(h);
        WireHelloReply r{};
        if (!c.recv(&r, sizeof(r)) || r.status != status(WireStatus::Malformed)) return cat(what, ": no refusal");
        return expectClosed("");
      }
      case 1:
        if (c.hello(t.regionId ^ 1, t.groupId).status != status(WireStatus::WrongRegion))
          return cat(what, ": not refused as another region");
        return expectClosed("");
      case 2:
        if (c.hello(t.regionId, t.groupId, 900, 900).status != status(WireStatus::VersionMismatch))
          return cat(what, ": not refused as a version mismatch");
        return expectClosed("");
      default:
        break;
    }
    WireHelloReply hr = c.hello(t.regionId, t.groupId);
    if (hr.magic != kWireHelloReplyMagic || hr.status != 0)
      return cat(what, ": the valid hello was refused: ", hr.reason);
    std::string err;
    WireStatus want = WireStatus::Ok;
    std::vector<WireRun> runs;
    WireRequest q = fetchRequest(t, 1);
    const int64_t n = static_cast<int64_t>(t.minBlocks);
    switch (kind) {
      case 3:
        q.magic = 0x11111111;
        runs = {{0, 1}};
        want = WireStatus::Malformed;
        break;
      case 4:
        q.numRuns = 0;
        want = WireStatus::Malformed;
        break;
      case 5:
        q.numRuns = 1000000;  // refused from the header alone: nothing is allocated for the runs it claims
        want = WireStatus::Oversize;
        break;
      case 6:
        q.numRuns = 2;
        runs = {{0, 1}, {n - 1, 2}};
        want = WireStatus::OutOfRange;
        break;
      case 7:
        runs = {{-3, 1}};
        want = WireStatus::OutOfRange;
        break;
      case 8:
        runs = {{1, INT64_MAX}};
        want = WireStatus::OutOfRange;
        break;
      case 9:
        q.generation ^= 0x100;
        runs = {{0, 1}};
        want = WireStatus::Stale;
        break;
      case 10:
        q.layoutHash ^= 1;
        runs = {{0, 1}};
        want = WireStatus::LayoutMismatch;
        break;
      case 11: {
        // As many runs of the whole layout as make a reply above the cap (each in range).
        const uint64_t perRun = static_cast<uint64_t>(n) * t.blockBytesSum;
        const uint64_t count = std::min<uint64_t>(kMaxRunsPerRequest, kMaxReplyBytes / perRun + 1);
        if (count * perRun <= kMaxReplyBytes) return "";  // this layout cannot make an oversize reply
        q.numRuns = static_cast<uint32_t>(count);
        runs.assign(count, WireRun{0, n});
        want = WireStatus::Oversize;
        break;
      }
      case 12:
        c.send(&q, 10);
        return "";  // closed mid-header: nobody to answer
      case 13: {
        q.numRuns = 4;
        c.sendStruct(q);
        WireRun r{0, 1};
        c.sendStruct(r);
        return "";  // closed mid-runs
      }
      case 14:
        c.send(&q, 10);
        return expectClosed("");  // dropped after the request deadline
      default:
        return cat("no malformed request of kind ", kind);
    }
    WireReply r = c.request(q, runs, nullptr, &err);
    if (r.magic != kWireReplyMagic || r.status != status(want))
      return cat(what, ": answered status ", r.status, " (", err, "), not ", wireStatusName(want));
    if (err.empty()) return cat(what, ": the error reply says nothing");
    if (kind <= 5) return expectClosed("");
    // A well-formed bad request leaves the connection usable.
    std::vector<char> payload;
    WireReply ok = c.request(fetchRequest(t, 1), {{0, 1}}, &payload);
    if (ok.status != 0 || payload.size() != t.blockBytesSum)
      return cat(what, ": a valid read on the same connection failed (status ", ok.status, ")");
    return "";
  } catch (const std::exception& e) {
    return cat(what, ": ", e.what());
  }
}

}  // namespace kvtest
