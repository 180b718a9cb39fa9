// An engine process of the arena example: registers its KV memory with the server (see arena_server.cpp) in one of the
// two directions, and checks every byte of every block the server filled.
//   example_arena_client --address @name --mode export|alloc [--tag T] [--device D]
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "kv_blocks.hpp"
#include "kvcomm/arena.hpp"
#include "kvcomm/capabilities.hpp"

using namespace arena_example;

namespace {

// Every block against the content the server was asked to fill in; returns the number of blocks that differ.
template <typename T>
size_t verify(T& memory, const kvcomm::KvLayout& layout, uint64_t tag) {
  size_t bad = 0;
  std::vector<uint8_t> want, got;
  for (size_t r = 0; r < layout.regions.size(); ++r) {
    const kvcomm::KvRegion& g = layout.regions[r];
    want.resize(g.blockBytes);
    got.resize(g.blockBytes);
    for (size_t b = 0; b < g.numBlocks; ++b) {
      fillBlock(tag, r, b, want.data(), want.size());
      memory.read(g.offset + b * g.blockStride, got.data(), got.size());
      bad += want != got;
    }
  }
  return bad;
}

}  // namespace

int main(int argc, char** argv) {
  std::string address, mode;
  uint64_t tag = static_cast<uint64_t>(getpid());
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--address") address = argv[i + 1];
    if (a == "--mode") mode = argv[i + 1];
    if (a == "--tag") tag = std::stoull(argv[i + 1]);
  }
  if (address.empty() || (mode != "export" && mode != "alloc")) {
    std::fprintf(stderr,
                 "usage: example_arena_client --address @name|PATH --mode export|alloc [--tag T] [--device D]\n");
    return 2;
  }
  try {
    if (!kvcomm::capabilities().gpus.empty()) kvcomm::useLocalDevice(parseDevice(argc, argv));
    Request req{};
    std::snprintf(req.mode, sizeof(req.mode), "%s", mode.c_str());
    req.tag = tag;
    req.layers = 4;
    req.blocks = 64;
    req.blockBytes = 16 * 128;  // 16 tokens of 128 bytes per block
    kvcomm::KvLayout layout = kvLayout(req.layers, req.blocks, req.blockBytes);
    kvcomm::ArenaSession s = kvcomm::ArenaSession::connect(address);
    sendPod(s, req);
    size_t bad = 0, bytes = 0;
    if (mode == "export") {
      // Client-owned: this process allocates its KV cache and lets the server import it.
      kvcomm::Arena kv = kvcomm::Arena::create(layout);
      sendPod(s, s.offer(kv));
      if (receivePod<char>(s) != 'F') return 1;
      bad = verify(kv, layout, tag);
      bytes = kv.bytes();
      sendPod(s, bad ? 'X' : 'V');
      kv.free(10000);  // once the server closed its import
    } else {
      // Server-owned: the server allocated from this layout; import it as this process's KV cache.
      kvcomm::ArenaImport kv = s.import(receivePod<kvcomm::ArenaCapability>(s));
      bad = verify(kv, layout, tag);
      bytes = kv.bytes();
      kv.close();  // before saying so: the server frees once the lease is gone
      sendPod(s, bad ? 'X' : 'V');
    }
    std::printf("arena client pid %d (%s): %zu bytes, %zu blocks, %zu differ: %s\n", static_cast<int>(getpid()),
                mode.c_str(), bytes, layout.regions.size() * req.blocks, bad, bad ? "FAILED" : "verified");
    return bad ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "arena client: %s\n", e.what());
    return 1;
  }
}
