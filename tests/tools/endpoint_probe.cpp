// One process of the endpoint tests across hosts (tests/scripts/netns_endpoint.sh): a server or a client, each in its
// own network namespace, meeting through a metadata file only (public API, like two engines).
//   endpoint_probe --mode server --dir D --clients N [--kind host|cuda]
//       registers a split K/V cache, writes D/meta, waits for N files D/done.<i>, then checks every byte of its
//       memory: its own blocks untouched, client i's pushed blocks in [32 + 4i, 36 + 4i)
//   endpoint_probe --mode client --dir D --index I [--kind host|cuda]
//       connects from D/meta, pulls 32 blocks (shuffled, some -1) and checks every byte of its memory, pushes its 4
//       blocks, writes D/done.<I>
// Exit 0: every check passed; 1: a check failed (printed); 2: usage.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#ifdef KVCOMM_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#include "kvcomm/capabilities.hpp"
#include "kvcomm/endpoint.hpp"

namespace {

using namespace kvcomm;

constexpr size_t kBlock = 4096, kBlocks = 96;

KvLayout layout() {  // K and V of a block side by side, a gap after each block pair
  KvLayout l;
  l.regions.push_back({64, kBlock, 2 * kBlock + 64, kBlocks});
  l.regions.push_back({64 + kBlock, kBlock, 2 * kBlock + 64, kBlocks});
  return l;
}
size_t bytesOf() {
  return 64 + kBlocks * (2 * kBlock + 64);
}
size_t at(size_t r, int64_t b) {
  return 64 + r * kBlock + static_cast<size_t>(b) * (2 * kBlock + 64);
}

uint8_t byteOf(uint64_t tag, size_t r, size_t i) {
  uint64_t x = tag * 0x9e3779b97f4a7c15ull + r * 0xbf58476d1ce4e5b9ull + i / 8;
  x = (x ^ (x >> 31)) * 0x94d049bb133111ebull;
  return static_cast<uint8_t>((x ^ (x >> 29)) >> (i % 8 * 8));
}
void put(std::vector<uint8_t>& m, int64_t b, uint64_t tag) {
  for (size_t r = 0; r < 2; ++r)
    for (size_t i = 0; i < kBlock; ++i) m[at(r, b) + i] = byteOf(tag, r, i);
}
// Guard bytes of memory `who` everywhere, then the blocks.
std::vector<uint8_t> guard(uint64_t who) {
  std::vector<uint8_t> m(bytesOf());
  for (size_t i = 0; i < m.size(); ++i) m[i] = byteOf(who + 1000, 9, i);
  return m;
}
uint64_t serverTag(int64_t b) {
  return 500 + static_cast<uint64_t>(b);
}
uint64_t clientTag(int c, int64_t b) {
  return 9000 + static_cast<uint64_t>(c) * 100 + static_cast<uint64_t>(b);
}

std::vector<uint8_t> serverImage() {
  auto m = guard(0);
  for (size_t b = 0; b < kBlocks; ++b) put(m, static_cast<int64_t>(b), serverTag(static_cast<int64_t>(b)));
  return m;
}

bool diff(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want, const char* what) {
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != want[i]) {
      std::printf("FAIL %s: byte %zu differs\n", what, i);
      return true;
    }
  return false;
}

// Memory of `kind` holding `image` (CUDA: device memory), read back with get().
struct Memory {
  MemoryKind kind;
  std::vector<uint8_t> host;
  void* dev = nullptr;
  Memory(MemoryKind k, const std::vector<uint8_t>& image) : kind(k), host(image) {
#ifdef KVCOMM_HAVE_CUDA
    if (kind == MemoryKind::Cuda) {
      cudaMalloc(&dev, image.size());
      cudaMemcpy(dev, image.data(), image.size(), cudaMemcpyHostToDevice);
    }
#endif
  }
  void* data() {
    return kind == MemoryKind::Cuda ? dev : host.data();
  }
  std::vector<uint8_t> get() {
#ifdef KVCOMM_HAVE_CUDA
    if (kind == MemoryKind::Cuda) cudaMemcpy(host.data(), dev, host.size(), cudaMemcpyDeviceToHost);
#endif
    return host;
  }
};

bool waitFile(const std::string& path, int seconds) {
  for (int i = 0; i < seconds * 100; ++i) {
    if (access(path.c_str(), F_OK) == 0) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

std::vector<uint8_t> readAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}

void writeAll(const std::string& path, const std::vector<uint8_t>& bytes) {
  {
    std::ofstream f(path + ".tmp", std::ios::binary);
    f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  }
  std::rename((path + ".tmp").c_str(), path.c_str());
}

int server(const std::string& dir, int clients, MemoryKind kind) {
  Endpoint ep = Endpoint::create({"server", "", -1, 4});
  Memory mem(kind, serverImage());
  Registration reg = ep.registerMemory(mem.data(), bytesOf(), kind, layout(), kind == MemoryKind::Cuda ? 0 : -1);
  writeAll(dir + "/meta", reg.metadata());
  std::printf("server: endpoint at %s, %d clients\n", ep.address().c_str(), clients);
  for (int c = 0; c < clients; ++c)
    if (!waitFile(dir + "/done." + std::to_string(c), 120)) {
      std::printf("FAIL server: client %d never finished\n", c);
      return 1;
    }
  auto want = serverImage();
  for (int c = 0; c < clients; ++c)
    for (int64_t b = 0; b < 4; ++b) {
      // The client's block b holds its tag at the client's own block index b.
      for (size_t r = 0; r < 2; ++r)
        for (size_t i = 0; i < kBlock; ++i) want[at(r, 32 + 4 * c + b) + i] = byteOf(clientTag(c, b), r, i);
    }
  if (diff(mem.get(), want, "server memory after the pushes")) return 1;
  std::printf("PASS server: every byte as expected after %d clients pulled and pushed\n", clients);
  return 0;
}

int client(const std::string& dir, int index, MemoryKind kind) {
  if (!waitFile(dir + "/meta", 60)) {
    std::printf("FAIL client %d: no metadata\n", index);
    return 1;
  }
  Endpoint ep = Endpoint::create({"client " + std::to_string(index), "", -1, 4});
  RemoteMemory remote = ep.connect(readAll(dir + "/meta"));
  auto image = guard(static_cast<uint64_t>(index) + 1);
  for (int64_t b = 0; b < 4; ++b) put(image, b, clientTag(index, b));
  Memory mem(kind, image);
  Registration reg = ep.registerMemory(mem.data(), bytesOf(), kind, layout(), kind == MemoryKind::Cuda ? 0 : -1);
  std::mt19937_64 rng(static_cast<uint64_t>(index) * 7 + 1);
  std::vector<int64_t> src(32), dst(32);
  for (int i = 0; i < 32; ++i) src[static_cast<size_t>(i)] = i, dst[static_cast<size_t>(i)] = 8 + i;
  std::shuffle(src.begin(), src.end(), rng);
  for (size_t i = 0; i < 32; i += 7) src[i] = -1;
  auto t0 = std::chrono::steady_clock::now();
  Transfer t = ep.read(reg, remote, src.data(), dst.data(), 32);
  FetchStatus s = t.wait(60000);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (s.state != FetchState::Done) {
    std::printf("FAIL client %d read: %s\n", index, s.error.c_str());
    return 1;
  }
  auto want = image;
  for (size_t i = 0; i < 32; ++i)
    if (src[i] >= 0) put(want, dst[i], serverTag(src[i]));
  if (diff(mem.get(), want, "client memory after the read")) return 1;
  std::vector<int64_t> from{0, 1, 2, 3}, to{32 + 4 * index, 33 + 4 * index, 34 + 4 * index, 35 + 4 * index};
  FetchStatus w = ep.write(reg, remote, to.data(), from.data(), 4).wait(60000);
  if (w.state != FetchState::Done) {
    std::printf("FAIL client %d write: %s\n", index, w.error.c_str());
    return 1;
  }
  std::printf("PASS client %d: read %zu bytes in %.1f ms (%zu tcp runs), checked every byte; pushed 4 blocks\n", index,
              s.bytesTotal, ms, t.info().tcpRuns);
  writeAll(dir + "/done." + std::to_string(index), {1});
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode, dir, kindName = "host";
  int clients = 1, index = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--mode")
      mode = v;
    else if (k == "--dir")
      dir = v;
    else if (k == "--clients")
      clients = std::stoi(v);
    else if (k == "--index")
      index = std::stoi(v);
    else if (k == "--kind")
      kindName = v;
    else {
      std::fprintf(stderr, "endpoint_probe: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  if (dir.empty() || (mode != "server" && mode != "client") || (kindName != "host" && kindName != "cuda")) {
    std::fprintf(stderr,
                 "usage: endpoint_probe --mode server|client --dir D [--clients N] [--index I] "
                 "[--kind host|cuda]\n");
    return 2;
  }
  const MemoryKind kind = kindName == "cuda" ? MemoryKind::Cuda : MemoryKind::Host;
  try {
    return mode == "server" ? server(dir, clients, kind) : client(dir, index, kind);
  } catch (const std::exception& e) {
    std::printf("FAIL %s: %s\n", mode.c_str(), e.what());
    return 1;
  }
}
