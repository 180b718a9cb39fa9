// Helpers of the arena tests: real processes (fork; the test process itself never initialises CUDA, so that its
// children can), KV layouts with gaps, an independent byte oracle for whole arenas, small text messages over a
// session, and resource counts.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kvcomm/arena.hpp"

namespace kvtest::arena {

/// Forks a child that runs `body`; its exit code is 0 when body returned true, 2 when false, 3 when it threw (the
/// message goes to stderr).
pid_t spawn(const std::function<bool()>& body);
/// Waits for `pid` up to `timeoutSec`: its exit code, -signal when killed, or -9 after killing it at the timeout.
int reap(pid_t pid, int timeoutSec = 60);
/// Runs every body in its own process and waits for all; true when each exited 0 (prints which did not).
bool runAll(const std::vector<std::function<bool()>>& bodies, int timeoutSec = 120);

/// A one-way signal between processes (a pipe made before fork; both ends stay open in every process, so that
/// descriptor counts do not change while a test runs).
class Gate {
 public:
  Gate();
  /// Lets one wait() through.
  void pass();
  /// Waits up to `timeoutMs` for a pass(); false on expiry.
  bool wait(int64_t timeoutMs = 30000);

 private:
  int fd_[2] = {-1, -1};
};

/// GPUs a child process sees (probed in a child, once; the caller's process stays free of CUDA). 0 without CUDA.
int gpuCount();
/// Why CUDA cases skip ("" when a GPU is present).
std::string noGpuReason();
/// In a child: makes GPU `ordinal` current (CUDA), nothing for host memory. False when it cannot.
bool useDevice(kvcomm::MemoryKind kind, int ordinal);

/// A fresh path under /tmp for a file of a test's processes (metadata they exchange), `what` in its name.
std::string tempPath(const char* what);
/// Writes `bytes` to `path` whole (renamed into place: a reader sees all of it or nothing).
void writeFile(const std::string& path, const std::vector<uint8_t>& bytes);
/// The bytes of `path` (empty when it does not exist).
std::vector<uint8_t> readFile(const std::string& path);

/// A fresh abstract socket address.
std::string freshAddress();

/// Three regions (layers) with gaps before, between and after blocks: blockBytes 1024 + 512 * layer (+ `extra`),
/// stride blockBytes + 192, `blocks` blocks each.
kvcomm::KvLayout testLayout(size_t blocks, size_t extra = 0);
/// Bytes the layout spans (its extent).
size_t extentOf(const kvcomm::KvLayout& layout);

/// The expected content of an arena of `bytes` bytes: guard bytes of `seed` everywhere, and in every block
/// (region r, block b) the bytes of `blockSeed(r, b)` (0: the block keeps its guard bytes).
std::vector<uint8_t> image(const kvcomm::KvLayout& layout, size_t bytes, uint64_t seed,
                           const std::function<uint64_t(size_t, size_t)>& blockSeed);
/// One block's expected bytes.
std::vector<uint8_t> blockContent(uint64_t blockSeed, size_t region, size_t block, size_t bytes);

/// Writes every block of `layout` whose `blockSeed` is non-zero into `target` (Arena or ArenaImport), from `first`
/// block on.
template <typename T>
void writeBlocks(T& target, const kvcomm::KvLayout& layout, const std::function<uint64_t(size_t, size_t)>& blockSeed,
                 size_t first = 0) {
  for (size_t r = 0; r < layout.regions.size(); ++r) {
    const kvcomm::KvRegion& g = layout.regions[r];
    size_t stride = g.blockStride ? g.blockStride : g.blockBytes;
    for (size_t b = first; b < g.numBlocks; ++b) {
      uint64_t s = blockSeed(r, b);
      if (!s) continue;
      auto v = blockContent(s, r, b, g.blockBytes);
      target.write(g.offset + b * stride, v.data(), v.size());
    }
  }
}

/// Compares the whole of `target` [0, expected.size()) with `expected`; "" when equal, else where and how.
template <typename T>
std::string compare(T& target, const std::vector<uint8_t>& expected) {
  std::vector<uint8_t> got(expected.size());
  target.read(0, got.data(), got.size());
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != expected[i]) {
      size_t bad = 0;
      for (size_t j = i; j < got.size(); ++j) bad += got[j] != expected[j];
      return "byte " + std::to_string(i) + " is " + std::to_string(got[i]) + ", expected " +
             std::to_string(expected[i]) + " (" + std::to_string(bad) + " bytes differ)";
    }
  return "";
}

/// Reads [0, n) straight from a mapping (host memcpy or cuMemcpy), bypassing the import's checks (for mappings
/// whose owner is gone).
std::vector<uint8_t> readRaw(kvcomm::MemoryKind kind, const void* p, size_t n);

/// Text messages over a session.
void sendText(kvcomm::ArenaSession& s, const std::string& text);
std::string recvText(kvcomm::ArenaSession& s, int64_t timeoutMs = 20000);
void sendCapability(kvcomm::ArenaSession& s, const kvcomm::ArenaCapability& c);
kvcomm::ArenaCapability recvCapability(kvcomm::ArenaSession& s, int64_t timeoutMs = 20000);
/// A layout as a message and back.
void sendLayout(kvcomm::ArenaSession& s, const kvcomm::KvLayout& layout);
kvcomm::KvLayout recvLayout(kvcomm::ArenaSession& s, int64_t timeoutMs = 20000);

/// Open descriptors and /proc/self/maps lines of this process (under AddressSanitizer, whose allocator maps memory
/// as it goes: the memfd mappings only).
int fds();
int mappings();
/// Mappings of kvcomm's shared memory only (memfd chunks): what an import would leave behind, without the heap
/// regions a thread's allocator may add (glibc versions differ there).
int memfdMappings();
/// Free bytes of the current CUDA device (0 for host memory or without CUDA).
size_t deviceFreeBytes(kvcomm::MemoryKind kind);

/// Seconds since `t0` (steady clock, as a double).
double since(std::chrono::steady_clock::time_point t0);
/// Polls `cond` every millisecond until it holds or `timeoutMs` passes; true when it held.
bool waitUntil(const std::function<bool()>& cond, int64_t timeoutMs);

/// "host" / "cuda", for parameterised test names.
std::string kindName(kvcomm::MemoryKind kind);

}  // namespace kvtest::arena
