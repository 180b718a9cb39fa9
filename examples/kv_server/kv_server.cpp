// A KV server over kvcomm endpoints, the engines it serves started separately: it registers its KV memory (a host
// arena, which same-host engines map; and GPU memory where there is a GPU), publishes each registration's metadata
// in a directory (any channel would do: an RPC, a bootstrap server), and then only answers notifications. An engine
// says hello with its own metadata; the server answers with a plan (prefix blocks to read, pinned for it until it
// says it read them; blocks to write its new KV into, reserved for it); when the engine's read arrives the pins are
// dropped (the blocks could be evicted); when its write arrives the server checks every byte of the new blocks and
// tells the engine. It exits once every engine was answered, checking that nothing is left pinned or reserved.
//
//   example_kv_server --dir DIR --engines N [--device D] [--tcp-address HOST:PORT]
#include <unistd.h>

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "kv_protocol.hpp"
#include "kvcomm/arena.hpp"
#include "kvcomm/capabilities.hpp"

using namespace kv_server_example;

namespace {

/// One registration the server serves: its arena and a host image of what it should hold.
struct Served {
  std::string kind;  // "host" or "cuda"
  kvcomm::Arena arena;
  kvcomm::Registration registration;
  std::vector<uint8_t> image;
};

struct EngineState {
  kvcomm::RemoteMemory reply;  // the engine's registration: how the server notifies it
  Served* served = nullptr;
  std::vector<int64_t> reads, writes;
  bool readDone = false, answered = false, ok = false;
};

Served serve(kvcomm::Endpoint& ep, const std::string& kind, const kvcomm::KvLayout& layout, const std::string& dir) {
  kvcomm::ArenaOptions o;
  o.kind = kind == "cuda" ? kvcomm::MemoryKind::Cuda : kvcomm::MemoryKind::Host;
  Served s{kind, kvcomm::Arena::create(layout, o), {}, {}};
  s.image.assign(s.arena.bytes(), 0);
  for (size_t b = 0; b < kPrefixBlocks; ++b) fillImage(s.image, layout, b, kPrefixTag, b);
  s.arena.write(0, s.image.data(), s.image.size());
  s.registration = ep.registerArena(s.arena);
  publishFile(metadataPath(dir, kind), s.registration.metadata());
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir, tcpAddress;
  int engines = 0, device = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--dir") dir = argv[i + 1];
    if (a == "--engines") engines = std::atoi(argv[i + 1]);
    if (a == "--device") device = std::atoi(argv[i + 1]);
    if (a == "--tcp-address") tcpAddress = argv[i + 1];
  }
  if (dir.empty() || engines < 1 || engines > kMaxEngines) {
    std::fprintf(stderr, "usage: example_kv_server --dir DIR --engines 1..%d [--device D] [--tcp-address H:P]\n",
                 kMaxEngines);
    return 2;
  }
  try {
    bool gpu = !kvcomm::capabilities().gpus.empty();
    if (gpu) device = kvcomm::useLocalDevice(device);
    kvcomm::EndpointOptions eo;
    eo.name = "kv-server";
    eo.tcpAddress = tcpAddress;
    kvcomm::Endpoint ep = kvcomm::Endpoint::create(eo);
    kvcomm::KvLayout layout = kvLayout(kLayers, kServerBlocks, kBlockBytes);
    std::map<std::string, Served> served;
    served.emplace("host", serve(ep, "host", layout, dir));
    if (gpu) served.emplace("cuda", serve(ep, "cuda", layout, dir));
    std::printf("kv server pid %d at %s: %zu KV blocks in %s; waiting for %d engines\n", static_cast<int>(getpid()),
                ep.address().c_str(), kServerBlocks, gpu ? "a host arena and GPU memory" : "a host arena", engines);
    std::fflush(stdout);

    std::vector<int> pins(kServerBlocks, 0);    // engines that may still read a prefix block
    std::vector<int> owner(kServerBlocks, -1);  // the engine a write block is reserved for
    std::map<int, EngineState> state;
    int answered = 0, good = 0;
    while (answered < engines) {
      std::vector<kvcomm::Notification> got = ep.notifications(60000);
      if (got.empty()) throw std::runtime_error("no notification for 60 s");
      for (kvcomm::Notification& n : got) {
        std::string verb = verbOf(n.message);
        std::vector<int64_t> num = numbersOf(n.message);
        if (num.empty() || num[0] < 0 || num[0] >= kMaxEngines) throw std::runtime_error("bad message " + verb);
        int e = static_cast<int>(num[0]);
        EngineState& st = state[e];
        if (verb == "hello") {
          size_t nl = n.message.find('\n');
          st.reply = ep.connect(n.message.data() + nl + 1, n.message.size() - nl - 1);
          st.served = &served.at(st.reply.kind() == kvcomm::MemoryKind::Cuda ? "cuda" : "host");
          std::string plan = "plan " + std::to_string(e);
          for (size_t k = 0; k < kReadBlocks; ++k) {  // overlapping prefixes: engines share blocks
            int64_t b = static_cast<int64_t>((3 * e + 5 * k) % kPrefixBlocks);
            ++pins[b];
            st.reads.push_back(b);
            plan += " " + std::to_string(b);
          }
          for (size_t k = 0; k < kWriteBlocks; ++k) {
            int64_t b = static_cast<int64_t>(kPrefixBlocks + e * kWriteBlocks + k);
            owner[b] = e;
            st.writes.push_back(b);
            plan += " " + std::to_string(b);
          }
          ep.notify(st.reply, plan);
        } else if (verb == "read") {  // delivered once the engine's read finished: unpin
          for (int64_t b : st.reads) --pins[b];
          st.readDone = true;
        } else if (verb == "written") {  // delivered once the new blocks are in place: check every byte
          // Its blocks and the prefix cache (other engines' blocks may be landing meanwhile).
          Served& s = *st.served;
          for (int64_t b : st.writes) fillImage(s.image, layout, b, 100 + e, b);
          std::vector<uint8_t> now(s.image.size());
          s.arena.read(0, now.data(), now.size());
          std::vector<int64_t> check = st.writes;
          for (size_t b = 0; b < kPrefixBlocks; ++b) check.push_back(static_cast<int64_t>(b));
          st.ok = st.readDone && sameBlocks(now, s.image, layout, check, "kv server");
          for (int64_t b : st.writes) owner[b] = -1;  // acknowledged: the reservation ends
          ep.notify(st.reply, "verified " + std::to_string(e) + (st.ok ? " ok" : " bad"));
          std::printf("  engine %d (%s, %s): read %zu prefix blocks, wrote %zu blocks%s; %s\n", e, n.fromName.c_str(),
                      s.kind.c_str(), st.reads.size(), st.writes.size(), st.readDone ? "" : " (its read never arrived)",
                      st.ok ? "verified" : "FAILED");
          ep.disconnect(st.reply);
          ++answered;
          good += st.ok;
        } else {
          throw std::runtime_error("unknown message \"" + verb + "\"");
        }
      }
    }
    int pinned = 0, reserved = 0;
    for (size_t b = 0; b < kServerBlocks; ++b) pinned += pins[b] != 0, reserved += owner[b] >= 0;
    for (auto& [kind, s] : served) ep.unregister(s.registration);
    ep.close();
    std::printf("kv server: %d of %d engines verified; %d blocks left pinned, %d reserved\n", good, engines, pinned,
                reserved);
    return good == engines && pinned == 0 && reserved == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kv server: %s\n", e.what());
    return 1;
  }
}
