// CUDA backend: cuMemCreate chunks (POSIX-fd, or fabric where a probe proved it), cuMemAddressReserve windows,
// cuMemMap + cuMemSetAccess; and the legacy-IPC fallback.
#include <unistd.h>

#include <cstring>

#include "common/check.hpp"
#include "common/log.hpp"
#include "kvcomm/capabilities.hpp"
#include "platform/cuda_driver.hpp"
#include "platform/gpu_info.hpp"
#include "symm/legacy_ipc.hpp"
#include "symm/memory_backend.hpp"
#include "symm/rendezvous.hpp"

namespace kvcomm::detail {

namespace {

// Driver calls in destructors: log, never throw (the driver may already be shutting down at exit).
void quietly(CUresult r, const char* what) {
  if (r != CUDA_SUCCESS && r != CUDA_ERROR_DEINITIALIZED) KVCOMM_WARN(what, " failed: ", cuResultText(r));
}

// Word tables kernels read (peer table, backed bitmap): plain device memory at a stable address.
uint64_t* cudaAllocTable(size_t entries) {
  CUdeviceptr p = 0;
  KVCOMM_CHECK_CU(cudaDriver().cuMemAlloc(&p, entries * sizeof(uint64_t)));
  return reinterpret_cast<uint64_t*>(p);
}
void cudaWriteTable(uint64_t* table, const std::vector<uint64_t>& values) {
  KVCOMM_CHECK_CU(
      cudaDriver().cuMemcpyHtoD(reinterpret_cast<CUdeviceptr>(table), values.data(), values.size() * sizeof(uint64_t)));
}
void cudaFreeTable(uint64_t* table) noexcept {
  if (table) quietly(cudaDriver().cuMemFree(reinterpret_cast<CUdeviceptr>(table)), "cuMemFree(table)");
}

CUmemAllocationHandleType cuHandleType(HandleKind k) {
  return k == HandleKind::CudaFabric ? CU_MEM_HANDLE_TYPE_FABRIC : CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
}

class CudaChunk : public Chunk {
 public:
  CudaChunk(CUmemGenericAllocationHandle h, size_t bytes) : h_(h), bytes_(bytes) {}
  ~CudaChunk() override { quietly(cudaDriver().cuMemRelease(h_), "cuMemRelease"); }
  size_t bytes() const override { return bytes_; }
  Fd exportFd() const override {
    int fd = -1;
    KVCOMM_CHECK_CU(cudaDriver().cuMemExportToShareableHandle(&fd, h_, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    return Fd(fd);
  }
  CUmemGenericAllocationHandle handle() const { return h_; }
  void setBytes(size_t bytes) { bytes_ = bytes; }

 private:
  CUmemGenericAllocationHandle h_;
  size_t bytes_;
};

class CudaReservation : public Reservation {
 public:
  CudaReservation(size_t bytes, size_t align) {
    CUdeviceptr p = 0;
    KVCOMM_CHECK_CU(cudaDriver().cuMemAddressReserve(&p, bytes, align, 0, 0));
    base_ = reinterpret_cast<char*>(p);
    bytes_ = bytes;
  }
  ~CudaReservation() override {
    quietly(cudaDriver().cuMemAddressFree(reinterpret_cast<CUdeviceptr>(base_), bytes_), "cuMemAddressFree");
  }
};

class CudaMapping : public Mapping {
 public:
  CudaMapping(char* va, size_t bytes, std::shared_ptr<Chunk> chunk, int device) : chunk_(std::move(chunk)) {
    auto* c = dynamic_cast<CudaChunk*>(chunk_.get());
    KVCOMM_CHECK_ARG(c != nullptr, "CudaMapping", "chunk is not a CUDA chunk");
    const CudaDriver& d = cudaDriver();
    auto ptr = reinterpret_cast<CUdeviceptr>(va);
    KVCOMM_CHECK_CU(d.cuMemMap(ptr, bytes, 0, c->handle(), 0));
    CUmemAccessDesc access{};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = device;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CUresult r = d.cuMemSetAccess(ptr, bytes, &access, 1);
    if (r != CUDA_SUCCESS) {
      quietly(d.cuMemUnmap(ptr, bytes), "cuMemUnmap");
      throwCu("cuMemSetAccess(peer memory, READWRITE)", r, __FILE__, __LINE__);
    }
    va_ = va;
    bytes_ = bytes;
  }
  ~CudaMapping() override {
    quietly(cudaDriver().cuMemUnmap(reinterpret_cast<CUdeviceptr>(va_), bytes_), "cuMemUnmap");
  }

 private:
  std::shared_ptr<Chunk> chunk_;
};

CUdevice currentDevice(const char* call, int* ordinal) {
  const CudaDriver& d = requireCudaDriver(call);
  GpuInfo g = currentGpu();
  if (g.device < 0)
    KVCOMM_THROW(Unsupported, call,
                 "no current CUDA context: call cudaSetDevice (or kvcomm::useLocalDevice) before creating CUDA "
                 "symmetric memory");
  CUdevice dev;
  KVCOMM_CHECK_CU(d.cuDeviceGet(&dev, g.device));
  *ordinal = g.device;
  return dev;
}

int deviceAttr(CUdevice dev, CUdevice_attribute a) {
  int v = 0;
  cudaDriver().cuDeviceGetAttribute(&v, a, dev);
  return v;
}

class CudaBackend : public MemoryBackend {
 public:
  explicit CudaBackend(HandleKind handles) : handles_(handles) {
    dev_ = currentDevice("SymmetricBuffer (cuda)", &ordinal_);
    if (!deviceAttr(dev_, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED))
      KVCOMM_THROW(Unsupported, "SymmetricBuffer (cuda)", "device ", ordinal_,
                   " lacks virtual memory management; use KVCOMM_HANDLE_TYPE=ipc");
    if (handles_ == HandleKind::CudaPosixFd &&
        !deviceAttr(dev_, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED))
      KVCOMM_THROW(Unsupported, "SymmetricBuffer (cuda)", "device ", ordinal_,
                   " cannot export POSIX-fd handles; use KVCOMM_HANDLE_TYPE=ipc");
    if (handles_ == HandleKind::CudaFabric) {
      for (const auto& g : capabilities().gpus)
        if (g.ordinal == ordinal_ && !g.fabricUsable)
          KVCOMM_THROW(Unsupported, "SymmetricBuffer (fabric)", "device ", ordinal_, ": ", g.fabricReason);
      // Fabric handles are a blob, not an fd; kvcomm's exchange carries fds, so fabric chunks are also made
      // exportable as POSIX fds for same-host peers (cross-node mapping needs IMEX, not available here).
    }
    gdr_ = deviceAttr(dev_, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED) != 0;
    CUmemAllocationProp prop = props();
    KVCOMM_CHECK_CU(cudaDriver().cuMemGetAllocationGranularity(&gran_, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  }

  MemoryKind kind() const override { return MemoryKind::Cuda; }
  HandleKind handleKind() const override { return handles_; }
  size_t granularity() const override { return gran_; }
  int device() const override { return ordinal_; }

  std::unique_ptr<Reservation> reserve(size_t bytes) override {
    return std::make_unique<CudaReservation>(bytes, gran_);
  }

  std::shared_ptr<Chunk> allocate(size_t bytes) override {
    CUmemAllocationProp prop = props();
    CUmemGenericAllocationHandle h;
    KVCOMM_CHECK_CU(cudaDriver().cuMemCreate(&h, bytes, &prop, 0));
    return std::make_shared<CudaChunk>(h, bytes);
  }

  std::unique_ptr<Mapping> map(char* va, size_t bytes, std::shared_ptr<Chunk> chunk, size_t chunkOffset) override {
    KVCOMM_CHECK_ARG(chunkOffset == 0, "CudaBackend::map", "CUDA maps chunks from offset 0 only");
    return std::make_unique<CudaMapping>(va, bytes, std::move(chunk), ordinal_);
  }

  std::shared_ptr<Chunk> importFd(Fd fd, const PieceMeta& meta) override {
    CUmemGenericAllocationHandle h;
    KVCOMM_CHECK_CU(cudaDriver().cuMemImportFromShareableHandle(
        &h, reinterpret_cast<void*>(static_cast<uintptr_t>(fd.get())), CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    // The imported handle holds the allocation; the fd is no longer needed (closed by ~Fd). A mapping larger than
    // the real allocation fails in cuMemMap, before any access.
    return std::make_shared<CudaChunk>(h, meta.chunkBytes);
  }

  // Walks the range granule by granule: cuMemRetainAllocationHandle returns the very handle the engine mapped, so
  // a change of handle marks the next allocation.
  std::vector<Piece> retain(char* va, size_t bytes, size_t bufferOffset) override {
    const CudaDriver& d = requireCudaDriver("SymmetricBuffer::commit", CudaFeature::AdoptMemory);
    // Peers map every allocation from its offset 0: a range must start and end on allocation boundaries.
    auto sameAllocation = [&](char* a, char* b) {
      CUmemGenericAllocationHandle ha, hb;
      if (d.cuMemRetainAllocationHandle(&ha, a) != CUDA_SUCCESS) return false;
      bool same = d.cuMemRetainAllocationHandle(&hb, b) == CUDA_SUCCESS &&
                  (quietly(d.cuMemRelease(hb), "cuMemRelease"), hb == ha);
      quietly(d.cuMemRelease(ha), "cuMemRelease");
      return same;
    };
    if (bufferOffset > 0 && sameAllocation(va - gran_, va))
      KVCOMM_THROW(InvalidArgument, "SymmetricBuffer::commit", "the range at offset ", bufferOffset,
                   " starts inside an allocation; commit whole allocations (peers map them from their start)");
    if (sameAllocation(va + bytes - gran_, va + bytes))
      KVCOMM_THROW(InvalidArgument, "SymmetricBuffer::commit", "the range at offset ", bufferOffset, " (", bytes,
                   " bytes) ends inside an allocation; commit whole allocations");
    std::vector<Piece> out;
    size_t at = 0;
    while (at < bytes) {
      CUmemGenericAllocationHandle h;
      CUresult r = d.cuMemRetainAllocationHandle(&h, va + at);
      if (r != CUDA_SUCCESS)
        KVCOMM_THROW(InvalidArgument, "SymmetricBuffer::commit", "offset ", bufferOffset + at,
                     " of the committed range is not mapped to a cuMemCreate allocation (", cuResultText(r), ")");
      auto chunk = std::make_shared<CudaChunk>(h, 0);  // owns the retained reference from here on
      CUmemAllocationProp prop{};
      KVCOMM_CHECK_CU(d.cuMemGetAllocationPropertiesFromHandle(&prop, h));
      if (!(prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
        KVCOMM_THROW(InvalidArgument, "SymmetricBuffer::commit", "the allocation at offset ", bufferOffset + at,
                     " was created without an exportable handle type: create it with requestedHandleTypes = "
                     "CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR");
      size_t len = gran_;
      while (at + len < bytes) {
        CUmemGenericAllocationHandle next;
        if (d.cuMemRetainAllocationHandle(&next, va + at + len) != CUDA_SUCCESS) break;
        quietly(d.cuMemRelease(next), "cuMemRelease");
        if (next != h) break;
        len += gran_;
      }
      chunk->setBytes(len);
      out.push_back(Piece{bufferOffset + at, len, 0, std::move(chunk)});
      at += len;
    }
    return out;
  }

  uint64_t* allocTable(size_t entries) override { return cudaAllocTable(entries); }
  void writeTable(uint64_t* table, const std::vector<uint64_t>& values) override { cudaWriteTable(table, values); }
  void freeTable(uint64_t* table) noexcept override { cudaFreeTable(table); }

 private:
  CUmemAllocationProp props() const {
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev_;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    if (handles_ == HandleKind::CudaFabric)
      prop.requestedHandleTypes =
          static_cast<CUmemAllocationHandleType>(prop.requestedHandleTypes | cuHandleType(handles_));
    prop.allocFlags.gpuDirectRDMACapable = gdr_ ? 1 : 0;
    return prop;
  }

  HandleKind handles_;
  CUdevice dev_ = 0;
  int ordinal_ = -1;
  size_t gran_ = 0;
  bool gdr_ = false;
};

// ---- legacy CUDA IPC -----------------------------------------------------------------------------------------

// Owners of what legacy IPC allocates and opens, so that a failed vote in the constructor releases them.
struct CuMemFree {
  void operator()(char* p) const noexcept {
    if (p) quietly(cudaDriver().cuMemFree(reinterpret_cast<CUdeviceptr>(p)), "cuMemFree");
  }
};
struct CuIpcClose {
  void operator()(char* p) const noexcept {
    if (p) quietly(cudaDriver().cuIpcCloseMemHandle(reinterpret_cast<CUdeviceptr>(p)), "cuIpcCloseMemHandle");
  }
};
struct CuTableFree {
  void operator()(uint64_t* p) const noexcept { cudaFreeTable(p); }
};

class CudaLegacyIpc : public LegacyIpc {
 public:
  CudaLegacyIpc(Communicator& comm, size_t capacity, size_t initialBytes) {
    const char* call = "SymmetricBuffer::create (cuda_ipc)";
    const CudaDriver& d = requireCudaDriver(call, CudaFeature::LegacyIpc);
    int ordinal = -1;
    currentDevice(call, &ordinal);
    gran_ = kGranularity;
    capacity_ = (capacity + gran_ - 1) / gran_ * gran_;
    mappedBytes_ = (initialBytes + gran_ - 1) / gran_ * gran_;
    struct Entry {
      CUipcMemHandle handle;
      uint64_t capacity;
      uint64_t initial;
    };
    int n = comm.size(), me = comm.rank();
    std::vector<Entry> all(static_cast<size_t>(n));
    Outcome local;
    try {
      KVCOMM_CHECK_ARG(capacity > 0 && mappedBytes_ <= capacity_, call, "initialBytes ", initialBytes,
                       " exceeds capacity ", capacity);
      CUdeviceptr p = 0;
      KVCOMM_CHECK_CU(d.cuMemAlloc(&p, capacity_));
      local_.reset(reinterpret_cast<char*>(p));
      KVCOMM_CHECK_CU(d.cuIpcGetMemHandle(&all[static_cast<size_t>(me)].handle, p));
    } catch (...) {
      local = Outcome::fromCurrentException();
    }
    all[static_cast<size_t>(me)].capacity = capacity_;
    all[static_cast<size_t>(me)].initial = mappedBytes_;
    comm.allgather(all.data(), sizeof(Entry));
    for (int r = 0; r < n && local.ok(); ++r)
      if (all[static_cast<size_t>(r)].capacity != capacity_ || all[static_cast<size_t>(r)].initial != mappedBytes_)
        local =
            Outcome::failure(cat("rank ", r, " passed capacity ", all[static_cast<size_t>(r)].capacity, " / initial ",
                                 all[static_cast<size_t>(r)].initial, ", this rank ", capacity_, " / ", mappedBytes_));
    vote(comm, call, local);
    const Topology& t = comm.topology();
    mapped_.assign(static_cast<size_t>(n), false);
    bases_.assign(static_cast<size_t>(n), 0);
    opened_.resize(static_cast<size_t>(n));
    allSucceed(comm, call, [&] {
      for (int r = 0; r < n; ++r) {
        if (r == me) {
          mapped_[static_cast<size_t>(r)] = true;
          bases_[static_cast<size_t>(r)] = reinterpret_cast<uint64_t>(local_.get());
        } else if (t.sameHost(me, r) && t.canAccessPeer(me, r) && t.canAccessPeer(r, me)) {
          CUdeviceptr p = 0;
          KVCOMM_CHECK_CU(
              d.cuIpcOpenMemHandle(&p, all[static_cast<size_t>(r)].handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
          opened_[static_cast<size_t>(r)].reset(reinterpret_cast<char*>(p));
          mapped_[static_cast<size_t>(r)] = true;
          bases_[static_cast<size_t>(r)] = p;
        }
      }
      table_.reset(cudaAllocTable(static_cast<size_t>(n)));
      cudaWriteTable(table_.get(), bases_);
    });
  }

  char* local() const override { return local_.get(); }
  size_t capacity() const override { return capacity_; }
  size_t granularity() const override { return gran_; }
  size_t mappedBytes() const override { return mappedBytes_; }
  void grow(size_t bytes) override {
    KVCOMM_CHECK_ARG(bytes <= capacity_, "SymmetricBuffer::grow (cuda_ipc)", "newBytes ", bytes,
                     " exceeds the capacity ", capacity_);
    mappedBytes_ = std::max(mappedBytes_, bytes);  // physically allocated up front
  }
  std::vector<bool> mappedMembers() const override { return mapped_; }
  std::vector<uint64_t> bases() const override { return bases_; }
  uint64_t* table() const override { return table_.get(); }
  uint64_t* allocTable(size_t entries) override { return cudaAllocTable(entries); }
  void writeTable(uint64_t* table, const std::vector<uint64_t>& values) override { cudaWriteTable(table, values); }
  void freeTable(uint64_t* table) noexcept override { cudaFreeTable(table); }

 private:
  // Destroyed in reverse order: the table, then peers' memory, then our own.
  std::unique_ptr<char, CuMemFree> local_;
  std::vector<std::unique_ptr<char, CuIpcClose>> opened_;
  std::unique_ptr<uint64_t, CuTableFree> table_;
  size_t gran_ = 0, capacity_ = 0, mappedBytes_ = 0;
  std::vector<bool> mapped_;
  std::vector<uint64_t> bases_;
};

}  // namespace

std::shared_ptr<MemoryBackend> makeCudaBackend(HandleKind handles) {
  return std::make_shared<CudaBackend>(handles);
}

std::unique_ptr<LegacyIpc> LegacyIpc::create(Communicator& comm, size_t capacity, size_t initialBytes) {
  return std::make_unique<CudaLegacyIpc>(comm, capacity, initialBytes);
}

}  // namespace kvcomm::detail
