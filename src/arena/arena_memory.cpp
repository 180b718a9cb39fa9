#include "arena/arena_memory.hpp"

#include <algorithm>

#include "arena/cuda_support.hpp"
#include "common/check.hpp"
#include "common/log.hpp"
#include "platform/gpu_info.hpp"

namespace kvcomm::detail::arena {

namespace {

constexpr size_t kIpcGranularity = 2u << 20;  // cuMemAlloc allocations are rounded to this

size_t roundUp(size_t v, size_t g, const char* call) {
  size_t r = 0;
  KVCOMM_CHECK_ARG(!__builtin_add_overflow(v, g - 1, &r), call, v, " bytes overflow when rounded to ", g);
  return r / g * g;
}

}  // namespace

MemoryKind resolveKind(MemoryKind kind) {
  if (kind != MemoryKind::Auto) return kind;
  return currentGpu().device >= 0 ? MemoryKind::Cuda : MemoryKind::Host;
}

OwnerMemory::OwnerMemory(MemoryKind kind, bool legacyIpc, size_t capacity, size_t bytes) : kind_(kind) {
  const char* call = "Arena::create";
  KVCOMM_CHECK_ARG(kind != MemoryKind::Auto, call, "memory kind not resolved");
  KVCOMM_CHECK_ARG(!legacyIpc || kind == MemoryKind::Cuda, call,
                   "legacyIpc needs CUDA memory (legacy CUDA IPC handles cover cuMemAlloc memory only)");
  if (legacyIpc) {
    handles_ = HandleKind::CudaIpc;
    gran_ = kIpcGranularity;
    device_ = currentGpu().device;
  } else {
    backend_ = kind == MemoryKind::Cuda ? makeCudaBackend(HandleKind::CudaPosixFd) : makeHostBackend();
    handles_ = backend_->handleKind();
    gran_ = backend_->granularity();
    device_ = backend_->device();
  }
  ctx_ = kind == MemoryKind::Cuda ? currentCudaContext() : nullptr;
  bytes_ = roundUp(bytes, gran_, call);
  capacity_ = roundUp(std::max(capacity, bytes), gran_, call);
  KVCOMM_CHECK_ARG(bytes_ > 0, call, "an arena needs at least one byte");
  if (legacyIpc) {
    ipc_ = ipcAllocate(capacity_);  // IPC handles cover whole allocations: the capacity is allocated up front
    base_ = static_cast<char*>(ipc_);
    return;
  }
  va_ = backend_->reserve(capacity_);
  base_ = va_->base();
  bytes_ = 0;
  grow(roundUp(bytes, gran_, call));
}

OwnerMemory::~OwnerMemory() {
  release();
}

size_t OwnerMemory::grow(size_t newBytes) {
  const char* call = "Arena::grow";
  size_t target = roundUp(newBytes, gran_, call);
  KVCOMM_CHECK_ARG(target <= capacity_, call, "newBytes ", newBytes, " exceeds the capacity ", capacity_,
                   " (reserve more with ArenaOptions::capacity)");
  size_t first = pieces_.size();
  if (target <= bytes_) return first;
  if (ipc_) {  // allocated up front
    bytes_ = target;
    return first;
  }
  Held h;
  h.piece.offset = bytes_;
  h.piece.bytes = target - bytes_;
  h.piece.chunkOffset = 0;
  h.piece.chunk = backend_->allocate(h.piece.bytes);
  h.map = backend_->map(base_ + bytes_, h.piece.bytes, h.piece.chunk, 0);
  pieces_.push_back(std::move(h));
  bytes_ = target;
  return first;
}

size_t OwnerMemory::shrinkTarget(size_t newBytes) const {
  if (ipc_) return std::max(std::min(bytes_, roundUp(newBytes, gran_, "Arena::shrink")), gran_);
  size_t end = bytes_;
  for (size_t i = pieces_.size(); i > 1; --i) {  // the first chunk always stays
    const Piece& p = pieces_[i - 1].piece;
    if (p.offset < newBytes) break;
    end = p.offset;
  }
  return end;
}

void OwnerMemory::shrink(size_t newBytes) {
  size_t target = shrinkTarget(newBytes);
  while (!pieces_.empty() && pieces_.back().piece.offset >= target) pieces_.pop_back();
  bytes_ = target;
}

std::vector<Piece> OwnerMemory::pieces() const {
  std::vector<Piece> out;
  for (const Held& h : pieces_) out.push_back(h.piece);
  return out;
}

ExportSet OwnerMemory::exportPieces(size_t from) const {
  ExportSet set;
  for (size_t i = from; i < pieces_.size(); ++i) {
    const Piece& p = pieces_[i].piece;
    set.metas.push_back(PieceMeta{p.offset, p.bytes, p.chunkOffset, p.chunk->bytes()});
    set.fds.push_back(p.chunk->exportFd());
  }
  return set;
}

void OwnerMemory::ipcHandle(uint8_t out[64]) const {
  KVCOMM_CHECK_ARG(ipc_ != nullptr, "Arena::ipcHandle",
                   "the arena was not created with ArenaOptions::legacyIpc (its memory is ", handleKindName(handles_),
                   ")");
  ipcGetHandle(ipc_, out);
}

void OwnerMemory::release() noexcept {
  pieces_.clear();  // mappings first, then the chunks they hold, then the address space
  va_.reset();
  if (ipc_) ipcFree(ipc_);
  ipc_ = nullptr;
  base_ = nullptr;
  bytes_ = 0;
}

ImportedMemory::ImportedMemory(HandleKind handles, size_t capacity, size_t ownerGranularity) : handles_(handles) {
  const char* call = "ArenaSession::import";
  KVCOMM_CHECK_ARG(handles == HandleKind::MemFd || handles == HandleKind::CudaPosixFd, call, "handle kind ",
                   handleKindName(handles), " cannot be imported through descriptors");
  backend_ = handles == HandleKind::MemFd ? makeHostBackend() : makeCudaBackend(HandleKind::CudaPosixFd);
  gran_ = backend_->granularity();
  KVCOMM_CHECK_ARG(ownerGranularity % gran_ == 0 && capacity % gran_ == 0, call, "the owner's granularity ",
                   ownerGranularity, " (capacity ", capacity, ") is not a multiple of this process's ", gran_);
  capacity_ = capacity;
  va_ = backend_->reserve(capacity_);
  base_ = va_->base();
}

ImportedMemory::ImportedMemory(const uint8_t ipcHandle[64], size_t capacity)
    : handles_(HandleKind::CudaIpc), capacity_(capacity), gran_(kIpcGranularity) {
  ipc_ = ipcOpen(ipcHandle);
  base_ = static_cast<char*>(ipc_);
}

ImportedMemory::~ImportedMemory() {
  release();
}

void ImportedMemory::map(const std::vector<PieceMeta>& metas, std::vector<Fd>& fds, size_t newEnd) {
  const char* call = "arena import (mapping the owner's pieces)";
  KVCOMM_CHECK_ARG(base_ != nullptr, call, "the import is closed");
  KVCOMM_CHECK_ARG(newEnd <= capacity_ && newEnd >= mapped_, call, "the owner announced ", newEnd, " bytes; mapped ",
                   mapped_, " of a capacity of ", capacity_);
  if (ipc_) {
    KVCOMM_CHECK_ARG(metas.empty() && fds.empty(), call, "pieces sent for legacy IPC memory");
    mapped_ = newEnd;
    return;
  }
  KVCOMM_CHECK_ARG(metas.size() == fds.size(), call, metas.size(), " pieces but ", fds.size(), " descriptors");
  // Everything is checked before the first mapping: MAP_FIXED over a wrong range would clobber this process.
  size_t at = mapped_;
  for (const PieceMeta& m : metas) {
    KVCOMM_CHECK_ARG(m.offset == at && m.bytes > 0 && m.bytes <= newEnd - at && m.offset % gran_ == 0 &&
                         m.bytes % gran_ == 0 && m.chunkOffset % gran_ == 0,
                     call, "piece [", m.offset, ", +", m.bytes, ") does not continue the mapping at ", at, " within ",
                     newEnd, " bytes in granules of ", gran_);
    at += m.bytes;
  }
  KVCOMM_CHECK_ARG(at == newEnd, call, "the pieces cover up to ", at, ", the owner announced ", newEnd);
  std::vector<std::unique_ptr<Mapping>> added;
  for (size_t i = 0; i < metas.size(); ++i) {
    std::shared_ptr<Chunk> chunk = backend_->importFd(std::move(fds[i]), metas[i]);
    added.push_back(backend_->map(base_ + metas[i].offset, metas[i].bytes, chunk, metas[i].chunkOffset));
  }
  for (auto& m : added) maps_.push_back(std::move(m));
  mapped_ = newEnd;
}

void ImportedMemory::release() noexcept {
  maps_.clear();
  va_.reset();
  if (ipc_) ipcClose(ipc_);
  ipc_ = nullptr;
  base_ = nullptr;
  mapped_ = 0;
}

}  // namespace kvcomm::detail::arena
