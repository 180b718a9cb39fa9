// Host backend: memfd chunks mapped MAP_SHARED|MAP_FIXED into a PROT_NONE reservation. Unmapping puts PROT_NONE
// back over the range, so the reservation (and every address handed out) stays.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "common/check.hpp"
#include "common/log.hpp"
#include "symm/memory_backend.hpp"

namespace kvcomm::detail {

const char* handleKindName(HandleKind k) {
  switch (k) {
    case HandleKind::MemFd:
      return "memfd";
    case HandleKind::CudaPosixFd:
      return "posix_fd";
    case HandleKind::CudaFabric:
      return "fabric";
    case HandleKind::CudaIpc:
      return "cuda_ipc";
  }
  return "unknown";
}

namespace {

class HostChunk : public Chunk {
 public:
  HostChunk(Fd fd, size_t bytes) : fd_(std::move(fd)), bytes_(bytes) {}
  size_t bytes() const override { return bytes_; }
  Fd exportFd() const override { return Fd(KVCOMM_CHECK_SYS(fcntl(fd_.get(), F_DUPFD_CLOEXEC, 0))); }
  int fd() const { return fd_.get(); }

 private:
  Fd fd_;
  size_t bytes_;
};

// Puts an inaccessible, unbacked mapping over [va, va + bytes): the address space stays reserved.
void* protNone(void* va, size_t bytes, int extraFlags) {
  return mmap(va, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | extraFlags, -1, 0);
}

class HostReservation : public Reservation {
 public:
  explicit HostReservation(size_t bytes) {
    void* p = protNone(nullptr, bytes, 0);
    if (p == MAP_FAILED)
      throwSystem(cat("mmap(PROT_NONE reservation of ", bytes, " bytes)"), errno, __FILE__, __LINE__);
    base_ = static_cast<char*>(p);
    bytes_ = bytes;
  }
  ~HostReservation() override {
    if (munmap(base_, bytes_) != 0) KVCOMM_WARN("munmap(reservation) failed: ", std::strerror(errno));
  }
};

class HostMapping : public Mapping {
 public:
  HostMapping(char* va, size_t bytes, std::shared_ptr<Chunk> chunk, size_t chunkOffset) : chunk_(std::move(chunk)) {
    auto* hc = dynamic_cast<HostChunk*>(chunk_.get());
    KVCOMM_CHECK_ARG(hc != nullptr, "HostMapping", "chunk is not a host chunk");
    void* p =
        mmap(va, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, hc->fd(), static_cast<off_t>(chunkOffset));
    if (p == MAP_FAILED) throwSystem(cat("mmap(MAP_FIXED memfd, ", bytes, " bytes)"), errno, __FILE__, __LINE__);
    va_ = va;
    bytes_ = bytes;
  }
  ~HostMapping() override {
    if (protNone(va_, bytes_, MAP_FIXED) == MAP_FAILED)
      KVCOMM_WARN("re-reserving ", bytes_, " bytes failed: ", std::strerror(errno));
  }

 private:
  std::shared_ptr<Chunk> chunk_;
};

struct MapsLine {
  uintptr_t start, end;
  std::string perms;
  uint64_t fileOffset;
  std::string path;
};

std::vector<MapsLine> readMaps() {
  std::vector<MapsLine> out;
  std::ifstream f("/proc/self/maps");
  for (std::string line; std::getline(f, line);) {
    MapsLine m{};
    char perms[8] = {0};
    unsigned long long start = 0, end = 0, off = 0;
    int pathPos = 0;
    if (std::sscanf(line.c_str(), "%llx-%llx %7s %llx %*s %*s %n", &start, &end, perms, &off, &pathPos) < 4) continue;
    m.start = start;
    m.end = end;
    m.perms = perms;
    m.fileOffset = off;
    if (pathPos > 0 && static_cast<size_t>(pathPos) <= line.size()) m.path = line.substr(static_cast<size_t>(pathPos));
    out.push_back(m);
  }
  return out;
}

class HostBackend : public MemoryBackend {
 public:
  HostBackend() : page_(static_cast<size_t>(sysconf(_SC_PAGESIZE))) {}
  MemoryKind kind() const override { return MemoryKind::Host; }
  HandleKind handleKind() const override { return HandleKind::MemFd; }
  size_t granularity() const override { return page_; }
  int device() const override { return -1; }

  std::unique_ptr<Reservation> reserve(size_t bytes) override { return std::make_unique<HostReservation>(bytes); }

  std::shared_ptr<Chunk> allocate(size_t bytes) override {
    Fd fd(KVCOMM_CHECK_SYS(memfd_create("kvcomm", MFD_CLOEXEC)));
    KVCOMM_CHECK_SYS(ftruncate(fd.get(), static_cast<off_t>(bytes)));
    return std::make_shared<HostChunk>(std::move(fd), bytes);
  }

  std::unique_ptr<Mapping> map(char* va, size_t bytes, std::shared_ptr<Chunk> chunk, size_t chunkOffset) override {
    return std::make_unique<HostMapping>(va, bytes, std::move(chunk), chunkOffset);
  }

  std::shared_ptr<Chunk> importFd(Fd fd, const PieceMeta& meta) override {
    // An under-allocated file must fail the import, not become out-of-bounds accesses later.
    struct stat st {};
    KVCOMM_CHECK_SYS(fstat(fd.get(), &st));
    KVCOMM_CHECK_ARG(static_cast<uint64_t>(st.st_size) >= meta.chunkOffset + meta.bytes, "import(memfd)",
                     "the peer's file holds ", st.st_size, " bytes but it declared a mapping of ", meta.bytes,
                     " bytes at file offset ", meta.chunkOffset);
    return std::make_shared<HostChunk>(std::move(fd), static_cast<size_t>(st.st_size));
  }

  std::vector<Piece> retain(char* va, size_t bytes, size_t bufferOffset) override {
    std::vector<Piece> out;
    uintptr_t lo = reinterpret_cast<uintptr_t>(va), hi = lo + bytes, at = lo;
    for (const MapsLine& m : readMaps()) {
      if (m.end <= at || m.start >= hi) continue;
      KVCOMM_CHECK_ARG(m.start <= at, "SymmetricBuffer::commit", "bytes [0x", std::hex, at, ", 0x", m.start,
                       ") of the committed range are not mapped by the engine");
      // The engine's reservation itself shows as PROT_NONE: a hole in what it committed.
      KVCOMM_CHECK_ARG(m.perms.rfind("---", 0) != 0, "SymmetricBuffer::commit", "bytes [0x", std::hex, m.start, ", 0x",
                       std::min<uintptr_t>(m.end, hi), ") of the committed range are not mapped by the engine");
      KVCOMM_CHECK_ARG(m.perms.size() >= 4 && m.perms[3] == 's', "SymmetricBuffer::commit", "the mapping at 0x",
                       std::hex, m.start,
                       " is private or anonymous; host adopt needs MAP_SHARED memfd or shm mappings");
      uintptr_t end = std::min<uintptr_t>(m.end, hi);
      char path[96];
      std::snprintf(path, sizeof(path), "/proc/self/map_files/%lx-%lx", static_cast<unsigned long>(m.start),
                    static_cast<unsigned long>(m.end));
      int fd = open(path, O_RDWR | O_CLOEXEC);
      if (fd < 0) throwSystem(cat("open(", path, ") to export an adopted mapping"), errno, __FILE__, __LINE__);
      Fd owned(fd);
      struct stat st {};
      KVCOMM_CHECK_SYS(fstat(owned.get(), &st));
      Piece p;
      p.offset = bufferOffset + (at - lo);
      p.bytes = end - at;
      p.chunkOffset = m.fileOffset + (at - m.start);
      p.chunk = std::make_shared<HostChunk>(std::move(owned), static_cast<size_t>(st.st_size));
      out.push_back(std::move(p));
      at = end;
      if (at >= hi) break;
    }
    KVCOMM_CHECK_ARG(at >= hi, "SymmetricBuffer::commit", "bytes [0x", std::hex, at, ", 0x", hi,
                     ") of the committed range are not mapped by the engine");
    return out;
  }

  uint64_t* allocTable(size_t entries) override { return new uint64_t[entries](); }
  void writeTable(uint64_t* table, const std::vector<uint64_t>& values) override {
    std::memcpy(table, values.data(), values.size() * sizeof(uint64_t));
  }
  void freeTable(uint64_t* table) noexcept override { delete[] table; }

 private:
  size_t page_;
};

}  // namespace

std::shared_ptr<MemoryBackend> makeHostBackend() {
  return std::make_shared<HostBackend>();
}

}  // namespace kvcomm::detail
