// An engine of the KV server example, started on its own: it knows the server only from the metadata file. It
// registers its own KV cache (host memory, or GPU memory with --memory cuda), connects, says hello with its own
// metadata, reads the prefix blocks the server planned for it into free slots of its cache (with a notification:
// the server may unpin them), checks every byte of its cache, writes new blocks into the server's reserved blocks
// (with a notification: the server checks them) and waits for the server's verdict.
//
//   example_kv_engine --dir DIR --index I [--memory host|cuda] [--via auto|peer|tcp|rdma] [--device D]
//                     [--tcp-address HOST:PORT]
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "kv_protocol.hpp"
#include "kvcomm/arena.hpp"
#include "kvcomm/capabilities.hpp"

using namespace kv_server_example;

namespace {

kvcomm::TransferVia viaOf(const std::string& v) {
  if (v == "peer") return kvcomm::TransferVia::Peer;
  if (v == "tcp") return kvcomm::TransferVia::Tcp;
  if (v == "rdma") return kvcomm::TransferVia::Rdma;
  if (v == "auto") return kvcomm::TransferVia::Auto;
  throw std::runtime_error("--via " + v + ": not auto, peer, tcp or rdma");
}

void finish(kvcomm::Transfer& t, const char* what) {
  kvcomm::FetchStatus s = t.wait(60000);
  if (s.state != kvcomm::FetchState::Done)
    throw std::runtime_error(std::string(what) + " did not finish: " + (s.error.empty() ? "in progress" : s.error));
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir, memory = "host", via = "auto", tcpAddress;
  int index = -1, device = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--dir") dir = argv[i + 1];
    if (a == "--index") index = std::atoi(argv[i + 1]);
    if (a == "--memory") memory = argv[i + 1];
    if (a == "--via") via = argv[i + 1];
    if (a == "--device") device = std::atoi(argv[i + 1]);
    if (a == "--tcp-address") tcpAddress = argv[i + 1];
  }
  if (dir.empty() || index < 0 || index >= kMaxEngines || (memory != "host" && memory != "cuda")) {
    std::fprintf(stderr,
                 "usage: example_kv_engine --dir DIR --index 0..%d [--memory host|cuda] "
                 "[--via auto|peer|tcp|rdma] [--device D] [--tcp-address H:P]\n",
                 kMaxEngines - 1);
    return 2;
  }
  std::string who = "kv engine " + std::to_string(index);
  try {
    if (memory == "cuda") kvcomm::useLocalDevice(device);
    kvcomm::EndpointOptions eo;
    eo.name = "engine-" + std::to_string(index);
    eo.tcpAddress = tcpAddress;
    kvcomm::Endpoint ep = kvcomm::Endpoint::create(eo);

    // Its own KV cache, poisoned: every byte it does not receive must stay 0xEE.
    kvcomm::KvLayout layout = kvLayout(kLayers, kEngineBlocks, kBlockBytes);
    kvcomm::ArenaOptions ao;
    ao.kind = memory == "cuda" ? kvcomm::MemoryKind::Cuda : kvcomm::MemoryKind::Host;
    kvcomm::Arena cache = kvcomm::Arena::create(layout, ao);
    std::vector<uint8_t> want(cache.bytes(), 0xEE);
    cache.write(0, want.data(), want.size());
    kvcomm::Registration mine = ep.registerArena(cache);

    kvcomm::RemoteMemory server = ep.connect(awaitFile(metadataPath(dir, memory), 60000));
    std::vector<uint8_t> md = mine.metadata();
    std::string hello = "hello " + std::to_string(index) + "\n";
    hello.append(reinterpret_cast<const char*>(md.data()), md.size());
    ep.notify(server, hello);
    std::vector<int64_t> plan = numbersOf(awaitNotification(ep, "plan", 60000).message);
    if (plan.size() != 1 + kReadBlocks + kWriteBlocks || plan[0] != index) throw std::runtime_error("bad plan");
    std::vector<int64_t> reads(plan.begin() + 1, plan.begin() + 1 + kReadBlocks);
    std::vector<int64_t> writes(plan.begin() + 1 + kReadBlocks, plan.end());

    // The prefix blocks into slots 2, 4, 6, ... of its cache (a slot mapping of its own, not the server's).
    std::vector<int64_t> slots;
    for (size_t k = 0; k < reads.size(); ++k) slots.push_back(static_cast<int64_t>(2 * k + 2));
    kvcomm::TransferOptions to;
    to.via = viaOf(via);
    to.notify = "read " + std::to_string(index);
    kvcomm::Transfer rd = ep.read(mine, server, reads.data(), slots.data(), reads.size(), to);
    finish(rd, "the read");
    for (size_t k = 0; k < reads.size(); ++k) fillImage(want, layout, slots[k], kPrefixTag, reads[k]);
    std::vector<uint8_t> got(want.size());
    cache.read(0, got.data(), got.size());
    bool readOk = sameBytes(got, want, who.c_str());

    // New KV blocks (computed here: slots 3, 5, ...) into the server's reserved blocks.
    std::vector<int64_t> fresh;
    for (size_t k = 0; k < writes.size(); ++k) {
      fresh.push_back(static_cast<int64_t>(2 * k + 3));
      fillImage(want, layout, fresh[k], 100 + index, writes[k]);
    }
    cache.write(0, want.data(), want.size());
    to.notify = "written " + std::to_string(index);
    kvcomm::Transfer wr = ep.write(mine, server, writes.data(), fresh.data(), writes.size(), to);
    finish(wr, "the write");
    std::string verdict = awaitNotification(ep, "verified", 60000).message;
    bool serverOk = verdict == "verified " + std::to_string(index) + " ok";
    std::printf("%s (pid %d, %s memory): read %zu blocks (%s)%s, wrote %zu; server says %s\n", who.c_str(),
                static_cast<int>(getpid()), memory.c_str(), reads.size(), kvcomm::fetchTransportName(rd.transport()),
                readOk ? " (every byte checked)" : " (BYTES DIFFER)", writes.size(), verdict.c_str());
    ep.unregister(mine);
    ep.close();
    return readOk && serverOk ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", who.c_str(), e.what());
    return 1;
  }
}
