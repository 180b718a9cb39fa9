// What the arena example's server and clients agree on: the KV layout an engine would use (per layer, a K region and a
// V region of blocks), a tiny request message, and the content the server fills block (layer, K/V, block) with, so
// that a client can check every byte it receives without seeing the server's data.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kvcomm/arena.hpp"

namespace arena_example {

/// A paged KV cache: layers x {K, V} regions of `blocks` blocks of `blockBytes` bytes, one region after the other.
inline kvcomm::KvLayout kvLayout(size_t layers, size_t blocks, size_t blockBytes) {
  kvcomm::KvLayout l;
  l.version = 1;
  for (size_t r = 0; r < 2 * layers; ++r)
    l.regions.push_back({r * blocks * blockBytes, blockBytes, blockBytes, blocks});
  return l;
}

/// Byte i of block `block` of region `region` for the client `tag` (a splitmix64 stream: no two blocks alike).
inline void fillBlock(uint64_t tag, size_t region, size_t block, uint8_t* out, size_t bytes) {
  uint64_t x = tag * 0x9E3779B97F4A7C15ull ^ (region << 40) ^ block;
  for (size_t i = 0; i < bytes; i += 8) {
    x += 0x9E3779B97F4A7C15ull;
    uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    std::memcpy(out + i, &z, bytes - i < 8 ? bytes - i : 8);
  }
}

/// A client's registration. kExport: the client owns its KV arena and sends a capability for the server to import
/// it; kAlloc: the server allocates the arena from this layout and sends back a capability for the client.
struct Request {
  char mode[8];  // "export" or "alloc"
  uint64_t tag;  // names the content the server fills in
  uint64_t layers, blocks, blockBytes;
};

/// Messages are plain bytes on the session.
template <typename T>
void sendPod(kvcomm::ArenaSession& s, const T& v) {
  s.send(&v, sizeof(v));
}
template <typename T>
T receivePod(kvcomm::ArenaSession& s, int64_t timeoutMs = 30000) {
  std::vector<uint8_t> m = s.receive(timeoutMs);
  T v{};
  if (m.size() != sizeof(T)) {
    std::fprintf(stderr, "arena example: expected a %zu-byte message, got %zu bytes\n", sizeof(T), m.size());
    std::exit(1);
  }
  std::memcpy(&v, m.data(), sizeof(T));
  return v;
}

/// The GPU to use: --device D when there are GPUs (CUDA arenas), host memory otherwise.
inline int parseDevice(int argc, char** argv) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--device") return std::atoi(argv[i + 1]);
  return 0;
}

}  // namespace arena_example
