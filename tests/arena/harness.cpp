#include "arena/harness.hpp"

#include <dirent.h>
#include <malloc.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <fstream>
#include <iterator>
#include <random>
#include <stdexcept>
#include <thread>

#include "kvcomm/capabilities.hpp"
#include "support/sanitizers.hpp"

#ifdef KVCOMM_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace kvtest::arena {

namespace {

// Deterministic bytes: byte i depends on (seed, stream, i / 8) only, so a longer stream starts with a shorter one.
std::vector<uint8_t> pattern(uint64_t seed, uint64_t stream, size_t n) {
  std::vector<uint8_t> out(n);
  for (size_t i = 0; i < n; i += 8) {
    uint64_t z = seed * 0x9E3779B97F4A7C15ull + stream * 0xD1B54A32D192ED03ull + (i / 8 + 1) * 0x94D049BB133111EBull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    std::memcpy(out.data() + i, &z, std::min<size_t>(8, n - i));
  }
  return out;
}

}  // namespace

pid_t spawn(const std::function<bool()>& body) {
  std::fflush(stdout);
  std::fflush(stderr);
  pid_t pid = fork();
  if (pid < 0) {
    std::perror("fork");
    std::abort();
  }
  if (pid == 0) {
    // A fixed mmap threshold, one malloc arena and a heap that exists from the start and never shrinks:
    // /proc/self/maps then changes with kvcomm's mappings, not with the allocator's own growth (a [heap] appearing,
    // dynamic thresholds, per-thread arenas), so counts can be compared exactly.
    mallopt(M_MMAP_THRESHOLD, 128 * 1024);
    mallopt(M_ARENA_MAX, 1);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
    mallopt(M_TOP_PAD, 16 << 20);
    std::free(std::malloc(64));
    int code = 1;
    try {
      code = body() ? 0 : 2;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "[pid %d] threw: %s\n", getpid(), e.what());
      code = 3;
    }
    std::fflush(stdout);
    std::fflush(stderr);
    _exit(code);
  }
  return pid;
}

int reap(pid_t pid, int timeoutSec) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeoutSec);
  while (true) {
    int status = 0;
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
    if (r < 0) return -1000;
    if (std::chrono::steady_clock::now() > deadline) {
      std::fprintf(stderr, "pid %d still running after %d s: killed\n", pid, timeoutSec);
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
      return -9;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

bool runAll(const std::vector<std::function<bool()>>& bodies, int timeoutSec) {
  std::vector<pid_t> pids;
  for (const auto& b : bodies) pids.push_back(spawn(b));
  bool ok = true;
  for (size_t i = 0; i < pids.size(); ++i) {
    int code = reap(pids[i], timeoutSec);
    if (code != 0) {
      std::fprintf(stderr, "process %zu (pid %d) ended with %d\n", i, pids[i], code);
      ok = false;
    }
  }
  return ok;
}

Gate::Gate() {
  if (pipe(fd_) != 0) std::abort();
}

void Gate::pass() {
  char c = 1;
  if (write(fd_[1], &c, 1) != 1) std::abort();
}

bool Gate::wait(int64_t timeoutMs) {
  pollfd p{fd_[0], POLLIN, 0};
  if (poll(&p, 1, static_cast<int>(timeoutMs)) != 1) return false;
  char c;
  return read(fd_[0], &c, 1) == 1;
}

int gpuCount() {
  static int count = [] {
#ifdef KVCOMM_HAVE_CUDA
    int fd[2];
    if (pipe(fd) != 0) return 0;
    pid_t pid = fork();
    if (pid == 0) {
      close(fd[0]);
      int n = static_cast<int>(kvcomm::capabilities().gpus.size());
      std::string why = kvcomm::capabilities().cudaReason;
      if (write(fd[1], &n, sizeof(n)) != sizeof(n)) _exit(1);
      if (n == 0 && !why.empty() && write(fd[1], why.data(), why.size()) < 0) _exit(1);
      _exit(0);
    }
    close(fd[1]);
    int n = 0;
    if (read(fd[0], &n, sizeof(n)) != sizeof(n)) n = 0;
    close(fd[0]);
    waitpid(pid, nullptr, 0);
    return n;
#else
    return 0;
#endif
  }();
  return count;
}

std::string noGpuReason() {
#ifdef KVCOMM_HAVE_CUDA
  return gpuCount() > 0 ? "" : "no CUDA device visible (probed in a child process)";
#else
  return "libkvcomm was built without CUDA";
#endif
}

bool useDevice(kvcomm::MemoryKind kind, int ordinal) {
  if (kind != kvcomm::MemoryKind::Cuda) return true;
  return kvcomm::useLocalDevice(ordinal) >= 0;
}

std::string freshAddress() {
  static std::atomic<int> n{0};
  auto t = std::chrono::steady_clock::now().time_since_epoch().count();
  return "@kvcomm-arena-test-" + std::to_string(getpid()) + "-" + std::to_string(n++) + "-" +
         std::to_string(static_cast<unsigned long long>(t) % 1000000007ull);
}

kvcomm::KvLayout testLayout(size_t blocks, size_t extra) {
  kvcomm::KvLayout l;
  l.version = 7 + blocks;
  size_t offset = 256;
  for (size_t r = 0; r < 3; ++r) {
    kvcomm::KvRegion g;
    g.blockBytes = 1024 + 512 * r + extra;
    g.blockStride = g.blockBytes + 192;
    g.numBlocks = blocks;
    g.offset = offset;
    offset += g.blockStride * blocks + 320;
    l.regions.push_back(g);
  }
  return l;
}

size_t extentOf(const kvcomm::KvLayout& layout) {
  size_t end = 0;
  for (const auto& g : layout.regions) {
    size_t stride = g.blockStride ? g.blockStride : g.blockBytes;
    end = std::max(end, g.offset + (g.numBlocks - 1) * stride + g.blockBytes);
  }
  return end;
}

std::vector<uint8_t> blockContent(uint64_t blockSeed, size_t region, size_t block, size_t bytes) {
  return pattern(blockSeed, region * 1000003 + block, bytes);
}

std::vector<uint8_t> image(const kvcomm::KvLayout& layout, size_t bytes, uint64_t seed,
                           const std::function<uint64_t(size_t, size_t)>& blockSeed) {
  std::vector<uint8_t> out = pattern(seed, 999, bytes);
  for (size_t r = 0; r < layout.regions.size(); ++r) {
    const kvcomm::KvRegion& g = layout.regions[r];
    size_t stride = g.blockStride ? g.blockStride : g.blockBytes;
    for (size_t b = 0; b < g.numBlocks; ++b) {
      uint64_t s = blockSeed(r, b);
      if (!s) continue;
      auto v = blockContent(s, r, b, g.blockBytes);
      std::memcpy(out.data() + g.offset + b * stride, v.data(), v.size());
    }
  }
  return out;
}

std::vector<uint8_t> readRaw(kvcomm::MemoryKind kind, const void* p, size_t n) {
  std::vector<uint8_t> out(n);
  if (kind == kvcomm::MemoryKind::Host) {
    if (n) std::memcpy(out.data(), p, n);
    return out;
  }
#ifdef KVCOMM_HAVE_CUDA
  cudaError_t e = cudaMemcpy(out.data(), p, n, cudaMemcpyDefault);
  if (e != cudaSuccess) throw std::runtime_error(std::string("cudaMemcpy: ") + cudaGetErrorString(e));
  return out;
#else
  throw std::runtime_error("no CUDA in this build");
#endif
}

void sendText(kvcomm::ArenaSession& s, const std::string& text) {
  s.send(text.data(), text.size());
}

std::string recvText(kvcomm::ArenaSession& s, int64_t timeoutMs) {
  auto m = s.receive(timeoutMs);
  return std::string(m.begin(), m.end());
}

void sendCapability(kvcomm::ArenaSession& s, const kvcomm::ArenaCapability& c) {
  s.send(&c, sizeof(c));
}

kvcomm::ArenaCapability recvCapability(kvcomm::ArenaSession& s, int64_t timeoutMs) {
  auto m = s.receive(timeoutMs);
  kvcomm::ArenaCapability c;
  if (m.size() != sizeof(c))
    throw std::runtime_error("expected a capability, got " + std::to_string(m.size()) + " bytes");
  std::memcpy(&c, m.data(), sizeof(c));
  return c;
}

void sendLayout(kvcomm::ArenaSession& s, const kvcomm::KvLayout& layout) {
  std::vector<uint64_t> words{layout.version};
  for (const auto& g : layout.regions) words.insert(words.end(), {g.offset, g.blockBytes, g.blockStride, g.numBlocks});
  s.send(words.data(), words.size() * sizeof(uint64_t));
}

kvcomm::KvLayout recvLayout(kvcomm::ArenaSession& s, int64_t timeoutMs) {
  auto m = s.receive(timeoutMs);
  if (m.size() < 8 || (m.size() - 8) % 32 != 0) throw std::runtime_error("expected a layout");
  std::vector<uint64_t> w(m.size() / 8);
  std::memcpy(w.data(), m.data(), m.size());
  kvcomm::KvLayout l;
  l.version = w[0];
  for (size_t i = 1; i + 3 < w.size(); i += 4) l.regions.push_back({w[i], w[i + 1], w[i + 2], w[i + 3]});
  return l;
}

int fds() {
  int n = 0;
  DIR* d = opendir("/proc/self/fd");
  if (!d) return -1;
  while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
  closedir(d);
  return n - 1;  // the directory's own descriptor
}

int memfdMappings() {
  std::ifstream f("/proc/self/maps");
  int n = 0;
  for (std::string line; std::getline(f, line);) n += line.find("/memfd:") != std::string::npos;
  return n;
}

int mappings() {
#ifdef KVTEST_ASAN
  // AddressSanitizer's allocator maps and unmaps regions of its own as it goes: count kvcomm's memfd mappings only
  // (the build without sanitizers checks every line of /proc/self/maps).
  std::ifstream f("/proc/self/maps");
  int n = 0;
  for (std::string line; std::getline(f, line);) n += line.find("/memfd:") != std::string::npos;
  return n;
#else
  std::ifstream f("/proc/self/maps");
  int n = 0;
  for (std::string line; std::getline(f, line);) ++n;
  return n;
#endif
}

size_t deviceFreeBytes(kvcomm::MemoryKind kind) {
  if (kind != kvcomm::MemoryKind::Cuda) return 0;
#ifdef KVCOMM_HAVE_CUDA
  size_t free = 0, total = 0;
  if (cudaMemGetInfo(&free, &total) != cudaSuccess) return 0;
  return free;
#else
  return 0;
#endif
}

double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

bool waitUntil(const std::function<bool()>& cond, int64_t timeoutMs) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeoutMs);
  while (!cond()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

std::string kindName(kvcomm::MemoryKind kind) {
  return kind == kvcomm::MemoryKind::Cuda ? "cuda" : "host";
}

std::string tempPath(const char* what) {
  char buf[128];
  std::snprintf(buf, sizeof(buf), "/tmp/kvcomm-test-%s-%d-%u", what, static_cast<int>(getpid()),
                static_cast<unsigned>(std::random_device{}()));
  return buf;
}

void writeFile(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary);
    f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  }
  std::rename(tmp.c_str(), path.c_str());
}

std::vector<uint8_t> readFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}

}  // namespace kvtest::arena
