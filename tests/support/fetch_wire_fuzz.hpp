// The body of the fetch request decoder's fuzz target (fuzz/fetch_request.cpp), shared with the unit test that runs
// it over random and mutated inputs in CI: bytes are decoded as the fetch server decodes a request (header, then
// runs) and re-validated against a fixed served layout (a control request: its head, and its body as an RDMA connect
// request and reply), and also as a hello, a hello reply, a reply and an RDMA connect request and reply. A broken
// invariant aborts (libFuzzer keeps the input as a crash).
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "fetch/transport/net/segments.hpp"
#include "fetch/transport/net/wire.hpp"
#include "fetch/transport/rdma/rdma_connect.hpp"

#define KVCOMM_FUZZ_CHECK(cond)                                                                     \
  do {                                                                                              \
    if (!(cond)) {                                                                                  \
      std::fprintf(stderr, "fetch fuzz invariant failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__); \
      std::abort();                                                                                 \
    }                                                                                               \
  } while (0)

namespace kvcomm::detail {

/// An RDMA connect message's decoders over `size` bytes: what they accept holds its invariants.
inline void fuzzRdmaConnect(const uint8_t* data, size_t size) {
  RdmaConnectRequest q;
  if (decodeConnectRequest(data, size, &q).empty())
    KVCOMM_FUZZ_CHECK(q.qps.size() == static_cast<size_t>(kQpsPerPeer) && q.fabric.valid == 1);
  constexpr uint64_t kRegistered = 1u << 20;
  RdmaConnectReply r;
  if (decodeConnectReply(data, size, kRegistered, &r).empty()) {
    KVCOMM_FUZZ_CHECK(r.qps.size() == static_cast<size_t>(kQpsPerPeer) && !r.chunks.empty() &&
                      r.chunks.size() <= kMaxConnectChunks);
    uint64_t end = 0;
    for (const ChunkKey& k : r.chunks) {
      KVCOMM_FUZZ_CHECK(k.bytes > 0 && k.offset >= end && k.offset + k.bytes <= kRegistered && k.lkey == 0);
      end = k.offset + k.bytes;
    }
    // What was accepted encodes back to the same bytes.
    std::vector<uint8_t> again = encodeConnectReply(r);
    KVCOMM_FUZZ_CHECK(again.size() == size);
  }
}

/// Returns 1 when `data` held a request the server would serve, 0 otherwise.
inline int fuzzFetchRequest(const uint8_t* data, size_t size) {
  // A served layout with two regions (one padded), a hole in the backed ranges, 100 blocks.
  static const std::vector<FetchRegionView> regions = {{0, 1024, 1024, 100}, {200000, 512, 640, 120}};
  static const std::vector<Range> backed = {{0, 102400}, {200000, 640 * 50}, {200000 + 640 * 51, 640 * 68 + 512}};
  ServedView view;
  view.generation = 3;
  view.layoutHash = 0x55;
  view.regions = regions.data();
  view.numRegions = regions.size();
  view.minBlocks = 100;
  view.blockBytesSum = 1536;
  view.backed = backed.data();
  view.numBacked = backed.size();

  int accepted = 0;
  WireRequest q{};
  if (size >= sizeof(WireRequest)) {
    std::string why = decodeRequest(data, sizeof(WireRequest), &q);
    if (!why.empty()) return 0;
    KVCOMM_FUZZ_CHECK((q.magic == kWireRequestMagic || q.magic == kWireWriteMagic || q.magic == kWireControlMagic) &&
                      q.numRuns >= 1 && q.numRuns <= kMaxRunsPerRequest);
    const size_t body = q.numRuns * sizeof(WireRun);
    if (size - sizeof(WireRequest) >= body && q.magic == kWireControlMagic) {
      static WireRun runs[kMaxRunsPerRequest];
      std::memcpy(runs, data + sizeof(WireRequest), body);
      WireControlHead head{};
      const uint8_t* at = nullptr;
      if (decodeControl(runs, q.numRuns, &head, &at).empty()) {
        KVCOMM_FUZZ_CHECK(head.bytes <= body - sizeof(WireRun) &&
                          body - sizeof(WireRun) - head.bytes < sizeof(WireRun));
        KVCOMM_FUZZ_CHECK(at == reinterpret_cast<const uint8_t*>(runs + 1));
        fuzzRdmaConnect(at, head.bytes);
        accepted = 1;
      }
    } else if (size - sizeof(WireRequest) >= body) {
      static WireRun runs[kMaxRunsPerRequest];
      std::memcpy(runs, data + sizeof(WireRequest), body);
      uint64_t bytes = 0;
      std::string reason;
      WireStatus s = validateRequest(q, runs, view, &bytes, &reason);
      if (s == WireStatus::Ok) {
        KVCOMM_FUZZ_CHECK(reason.empty() && bytes <= kMaxReplyBytes && bytes > 0);
        uint64_t blocks = 0;
        for (uint32_t i = 0; i < q.numRuns; ++i) {
          KVCOMM_FUZZ_CHECK(runs[i].srcBlock >= 0 && runs[i].blocks > 0);
          KVCOMM_FUZZ_CHECK(static_cast<uint64_t>(runs[i].srcBlock) + static_cast<uint64_t>(runs[i].blocks) <=
                            view.minBlocks);
          blocks += static_cast<uint64_t>(runs[i].blocks);
        }
        KVCOMM_FUZZ_CHECK(bytes == blocks * view.blockBytesSum);
        // What the server would read: every segment inside a backed range, the total as announced.
        SegmentCursor c(regions.data(), regions.size(), runs, q.numRuns);
        uint64_t off = 0, len = 0, total = 0;
        while (c.take(1u << 20, &off, &len)) {
          KVCOMM_FUZZ_CHECK(rangeCovered(backed.data(), backed.size(), off, len));
          total += len;
        }
        KVCOMM_FUZZ_CHECK(total == bytes);
        accepted = 1;
      } else {
        KVCOMM_FUZZ_CHECK(!reason.empty());
      }
    }
  }
  fuzzRdmaConnect(data, size);
  WireHello h{};
  if (decodeHello(data, size, &h).empty())
    KVCOMM_FUZZ_CHECK(h.magic == kWireHelloMagic && h.version >= h.minVersion && h.minVersion > 0);
  WireHelloReply hr{};
  if (decodeHelloReply(data, size, &hr).empty())
    KVCOMM_FUZZ_CHECK(std::strlen(hr.reason) < sizeof(hr.reason) && hr.status >= 0);
  WireReply r{};
  if (decodeReply(data, size, &r).empty())
    KVCOMM_FUZZ_CHECK(r.errorBytes <= kMaxWireErrorText && r.payloadBytes <= kMaxReplyBytes &&
                      (r.status == 0 || r.payloadBytes == 0));
  return accepted;
}

}  // namespace kvcomm::detail
