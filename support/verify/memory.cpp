#include "verify/memory.hpp"

#include <dirent.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <new>
#include <stdexcept>
#include <string>

#include "kvcomm/capabilities.hpp"
#ifdef KVCOMM_HAVE_CUDA
#include "platform/cuda_driver.hpp"
#include "platform/gpu_info.hpp"
#endif

namespace kvtest {

bool haveGpu() {
  return !kvcomm::capabilities().gpus.empty();
}

std::string noGpuReason() {
  const auto& c = kvcomm::capabilities();
  if (!c.gpus.empty()) return "";
  return c.cudaReason.empty() ? "no CUDA device" : c.cudaReason;
}

bool distinctGpus(const kvcomm::Communicator& comm) {
  return comm.topology().sharedGpu().first < 0;
}

void toMemory(kvcomm::MemoryKind kind, void* dst, const void* src, size_t n) {
  if (kind == kvcomm::MemoryKind::Host) {
    if (n) std::memcpy(dst, src, n);  // empty inputs may come with null pointers
    return;
  }
#ifdef KVCOMM_HAVE_CUDA
  // From pageable memory the call may return before the DMA lands: wait, so that a barrier after it means "written".
  KVCOMM_CHECK_CU(kvcomm::detail::cudaDriver().cuMemcpyHtoD(reinterpret_cast<CUdeviceptr>(dst), src, n));
  KVCOMM_CHECK_CU(kvcomm::detail::cudaDriver().cuCtxSynchronize());
#else
  throw std::runtime_error("no CUDA in this build");
#endif
}

void fromMemory(kvcomm::MemoryKind kind, void* dst, const void* src, size_t n) {
  if (kind == kvcomm::MemoryKind::Host) {
    if (n) std::memcpy(dst, src, n);  // empty inputs may come with null pointers
    return;
  }
#ifdef KVCOMM_HAVE_CUDA
  KVCOMM_CHECK_CU(kvcomm::detail::cudaDriver().cuMemcpyDtoH(dst, reinterpret_cast<CUdeviceptr>(src), n));
#else
  throw std::runtime_error("no CUDA in this build");
#endif
}

void fillMemory(kvcomm::MemoryKind kind, void* dst, uint8_t value, size_t n) {
  if (kind == kvcomm::MemoryKind::Host) {
    std::memset(dst, value, n);
    return;
  }
#ifdef KVCOMM_HAVE_CUDA
  KVCOMM_CHECK_CU(kvcomm::detail::cudaDriver().cuMemsetD8(reinterpret_cast<CUdeviceptr>(dst), value, n));
  KVCOMM_CHECK_CU(kvcomm::detail::cudaDriver().cuCtxSynchronize());
#else
  throw std::runtime_error("no CUDA in this build");
#endif
}

std::vector<uint8_t> pattern(uint64_t seed, uint64_t stream, size_t n) {
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + stream);
  std::vector<uint8_t> out(n);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t v = rng();
    std::memcpy(out.data() + i, &v, 8);
  }
  for (; i < n; ++i) out[i] = static_cast<uint8_t>(rng());
  return out;
}

int countFds() {
  int n = 0;
  DIR* d = opendir("/proc/self/fd");
  if (!d) return -1;
  while (readdir(d)) ++n;
  closedir(d);
  return n;
}

std::string describeFds() {
  std::string out;
  DIR* d = opendir("/proc/self/fd");
  if (!d) return "(no /proc/self/fd)";
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    char target[256] = {};
    std::string link = std::string("/proc/self/fd/") + e->d_name;
    ssize_t n = readlink(link.c_str(), target, sizeof(target) - 1);
    out += std::string(out.empty() ? "" : " ") + e->d_name + "->" + (n > 0 ? target : "?");
  }
  closedir(d);
  return out;
}

int countMappings() {
  std::ifstream f("/proc/self/maps");
  int n = 0;
  for (std::string line; std::getline(f, line);) ++n;
  return n;
}

PinnedMemory::PinnedMemory(size_t bytes) {
  const size_t page = 4096, size = (std::max<size_t>(bytes, 1) + page - 1) / page * page;
  p_ = static_cast<char*>(std::aligned_alloc(page, size));
  if (!p_) throw std::bad_alloc();
#ifdef KVCOMM_HAVE_CUDA
  if (haveGpu()) {
    CUresult r = kvcomm::detail::cudaDriver().cuMemHostRegister(
        p_, size, CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP);
    if (r != CUDA_SUCCESS) {
      std::free(p_);
      KVCOMM_CHECK_CU(r);
    }
    registered_ = true;
  }
#endif
}

PinnedMemory::~PinnedMemory() {
#ifdef KVCOMM_HAVE_CUDA
  if (registered_) kvcomm::detail::cudaDriver().cuMemHostUnregister(p_);
#endif
  std::free(p_);
}

Memory::Memory(kvcomm::MemoryKind kind, size_t bytes) : kind_(kind) {
  if (kind == kvcomm::MemoryKind::Host) {
    host_.resize(bytes ? bytes : 1);
    ptr_ = host_.data();
    return;
  }
#ifdef KVCOMM_HAVE_CUDA
  CUdeviceptr p = 0;
  KVCOMM_CHECK_CU(kvcomm::detail::cudaDriver().cuMemAlloc(&p, bytes ? bytes : 1));
  ptr_ = reinterpret_cast<char*>(p);
#else
  throw std::runtime_error("no CUDA in this build");
#endif
}

Memory::~Memory() {
#ifdef KVCOMM_HAVE_CUDA
  if (kind_ == kvcomm::MemoryKind::Cuda && ptr_)
    kvcomm::detail::cudaDriver().cuMemFree(reinterpret_cast<CUdeviceptr>(ptr_));
#endif
}

void synchronize(kvcomm::MemoryKind kind) {
  if (kind == kvcomm::MemoryKind::Host) return;
#ifdef KVCOMM_HAVE_CUDA
  KVCOMM_CHECK_CU(kvcomm::detail::cudaDriver().cuCtxSynchronize());
#endif
}

EngineCache::EngineCache(kvcomm::MemoryKind kind, size_t reservedBytes) : kind_(kind), reserved_(reservedBytes) {
  if (kind == kvcomm::MemoryKind::Host) {
    gran_ = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    void* p = mmap(nullptr, reservedBytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) throw std::runtime_error("engine reservation failed");
    base_ = static_cast<char*>(p);
    return;
  }
#ifdef KVCOMM_HAVE_CUDA
  const auto& d = kvcomm::detail::cudaDriver();
  device_ = kvcomm::detail::currentGpu().device;
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device_;
  KVCOMM_CHECK_CU(d.cuMemGetAllocationGranularity(&gran_, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  CUdeviceptr p = 0;
  KVCOMM_CHECK_CU(d.cuMemAddressReserve(&p, reservedBytes, gran_, 0, 0));
  base_ = reinterpret_cast<char*>(p);
#else
  throw std::runtime_error("no CUDA in this build");
#endif
}

EngineCache::~EngineCache() {
  while (!chunks_.empty()) release(chunks_.begin()->first);
  if (kind_ == kvcomm::MemoryKind::Host) {
    munmap(base_, reserved_);
    return;
  }
#ifdef KVCOMM_HAVE_CUDA
  kvcomm::detail::cudaDriver().cuMemAddressFree(reinterpret_cast<CUdeviceptr>(base_), reserved_);
#endif
}

void EngineCache::commit(size_t offset, size_t bytes, bool exportable) {
  if (kind_ == kvcomm::MemoryKind::Host) {
    if (!exportable) {
      void* p = mmap(base_ + offset, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
      if (p == MAP_FAILED) throw std::runtime_error("engine private commit failed");
      chunks_[offset] = {bytes, ~0ull};
      return;
    }
    int fd = memfd_create("engine-kv", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, static_cast<off_t>(bytes)) != 0) throw std::runtime_error("memfd failed");
    void* p = mmap(base_ + offset, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
    close(fd);  // the mapping keeps the file
    if (p == MAP_FAILED) throw std::runtime_error("engine commit failed");
    chunks_[offset] = {bytes, 0};
    return;
  }
#ifdef KVCOMM_HAVE_CUDA
  const auto& d = kvcomm::detail::cudaDriver();
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device_;
  prop.requestedHandleTypes = exportable ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : CU_MEM_HANDLE_TYPE_NONE;
  CUmemGenericAllocationHandle h;
  KVCOMM_CHECK_CU(d.cuMemCreate(&h, bytes, &prop, 0));
  auto ptr = reinterpret_cast<CUdeviceptr>(base_ + offset);
  KVCOMM_CHECK_CU(d.cuMemMap(ptr, bytes, 0, h, 0));
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device_;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  KVCOMM_CHECK_CU(d.cuMemSetAccess(ptr, bytes, &access, 1));
  chunks_[offset] = {bytes, static_cast<uint64_t>(h)};
#endif
}

void EngineCache::release(size_t offset) {
  auto it = chunks_.find(offset);
  if (it == chunks_.end()) return;
  size_t bytes = it->second.first;
  if (kind_ == kvcomm::MemoryKind::Host) {
    mmap(base_ + offset, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
  } else {
#ifdef KVCOMM_HAVE_CUDA
    const auto& d = kvcomm::detail::cudaDriver();
    d.cuMemUnmap(reinterpret_cast<CUdeviceptr>(base_ + offset), bytes);
    d.cuMemRelease(static_cast<CUmemGenericAllocationHandle>(it->second.second));
#endif
  }
  chunks_.erase(it);
}

}  // namespace kvtest
