// A tiny KV block server over kvcomm arenas: engines ("clients") register their KV memory, the server fills the blocks
// they ask for (as a KV offload server would after a prefix-cache hit in its host tier), and the clients check them.
// Either side may own the memory, by the client's choice:
//   - export: the client allocates its KV arena and offers it; the server imports it (the server can then move data
//     in and out of it, e.g. RDMA-register it: a POSIX-fd VMM chunk can be re-exported as a dma-buf), fills it, and
//     closes its import when the client is done;
//   - alloc: the server allocates an arena from the client's layout (server-owned), fills it and offers it; the client
//     imports it as its KV cache. The server frees it once the client closed its import (free() waits for the lease).
// A client that dies is reclaimed (its lease dropped, its imported arena unmapped) without the server's help.
//
//   example_arena_server --address @name --clients N [--device D]
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "kv_blocks.hpp"
#include "kvcomm/arena.hpp"
#include "kvcomm/capabilities.hpp"

using namespace arena_example;

namespace {

void fillAll(kvcomm::Arena* arena, kvcomm::ArenaImport* imp, const kvcomm::KvLayout& layout, uint64_t tag) {
  std::vector<uint8_t> block;
  for (size_t r = 0; r < layout.regions.size(); ++r) {
    const kvcomm::KvRegion& g = layout.regions[r];
    block.resize(g.blockBytes);
    for (size_t b = 0; b < g.numBlocks; ++b) {
      fillBlock(tag, r, b, block.data(), block.size());
      if (arena)
        arena->write(g.offset + b * g.blockStride, block.data(), block.size());
      else
        imp->write(g.offset + b * g.blockStride, block.data(), block.size());
    }
  }
}

bool serve(kvcomm::ArenaSession s) {
  Request req = receivePod<Request>(s);
  kvcomm::KvLayout layout = kvLayout(req.layers, req.blocks, req.blockBytes);
  std::string mode(req.mode, strnlen(req.mode, sizeof(req.mode)));
  if (mode == "export") {
    // Client-owned: import what the client offers. Release: a dead client's memory is unmapped as soon as nothing
    // of the server's still uses it.
    kvcomm::ImportOptions o;
    o.onOwnerLoss = kvcomm::OwnerLoss::Release;
    kvcomm::ArenaImport imp = s.import(receivePod<kvcomm::ArenaCapability>(s), o);
    fillAll(nullptr, &imp, layout, req.tag);
    sendPod(s, 'F');
    bool ok = receivePod<char>(s) == 'V';
    std::printf("  client pid %d (export, %s memory, %zu bytes): server imported it, filled %zu blocks; client %s\n",
                s.peerPid(), imp.kind() == kvcomm::MemoryKind::Cuda ? "cuda" : "host", imp.bytes(),
                layout.regions.size() * req.blocks, ok ? "verified" : "FAILED");
    imp.close();
    return ok;
  }
  if (mode == "alloc") {
    kvcomm::Arena arena = kvcomm::Arena::create(layout);  // CUDA when this thread has a GPU context, else host
    fillAll(&arena, nullptr, layout, req.tag);
    sendPod(s, s.offer(arena));
    bool ok = receivePod<char>(s) == 'V';
    size_t bytes = arena.bytes();
    arena.free(10000);  // returns once the client closed its import (or died)
    std::printf("  client pid %d (alloc, %s memory, %zu bytes): server allocated and filled it; client %s; freed\n",
                s.peerPid(), arena.kind() == kvcomm::MemoryKind::Cuda ? "cuda" : "host", bytes,
                ok ? "verified" : "FAILED");
    return ok;
  }
  std::fprintf(stderr, "  client pid %d: unknown mode \"%s\"\n", s.peerPid(), mode.c_str());
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  std::string address;
  int clients = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--address") address = argv[i + 1];
    if (a == "--clients") clients = std::atoi(argv[i + 1]);
  }
  if (address.empty() || clients < 1) {
    std::fprintf(stderr, "usage: example_arena_server --address @name|PATH --clients N [--device D]\n");
    return 2;
  }
  try {
    int device = kvcomm::capabilities().gpus.empty() ? -1 : kvcomm::useLocalDevice(parseDevice(argc, argv));
    kvcomm::ArenaServer server = kvcomm::ArenaServer::listen(address);
    std::printf("arena server pid %d at %s on %s; serving %d clients\n", static_cast<int>(getpid()),
                server.address().c_str(), device >= 0 ? ("GPU " + std::to_string(device)).c_str() : "host memory",
                clients);
    std::fflush(stdout);
    std::atomic<int> good{0};
    std::vector<std::thread> threads;
    for (int i = 0; i < clients; ++i) {
      kvcomm::ArenaSession s = server.accept(60000);
      threads.emplace_back([&good, device, s = std::move(s)]() mutable {
        try {
          if (device >= 0) kvcomm::useLocalDevice(device);  // each thread makes the GPU current for its arenas
          if (serve(std::move(s))) ++good;
        } catch (const std::exception& e) {
          std::fprintf(stderr, "  serving a client failed: %s\n", e.what());
        }
      });
    }
    for (auto& t : threads) t.join();
    std::printf("arena server: %d of %d clients verified their blocks\n", good.load(), clients);
    return good == clients ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "arena server: %s\n", e.what());
    return 1;
  }
}
