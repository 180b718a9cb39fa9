// NCCL, loaded at run time (dlopen libnccl.so.2): the CUDA fallback (AllGather + insert) uses it; nothing else does.
#pragma once

#include <nccl.h>

#include <string>

#include "common/check.hpp"

namespace kvcomm::detail {

struct NcclLib {
  decltype(&::ncclGetVersion) getVersion = nullptr;
  decltype(&::ncclGetUniqueId) getUniqueId = nullptr;
  decltype(&::ncclCommInitRank) commInitRank = nullptr;
  decltype(&::ncclCommDestroy) commDestroy = nullptr;
  decltype(&::ncclCommAbort) commAbort = nullptr;
  decltype(&::ncclAllGather) allGather = nullptr;
  decltype(&::ncclGroupStart) groupStart = nullptr;
  decltype(&::ncclGroupEnd) groupEnd = nullptr;
  decltype(&::ncclGetErrorString) getErrorString = nullptr;
  bool usable = false;
  std::string reason;
  int version = 0;
};

/// Loaded on first use; never throws.
const NcclLib& nccl();
/// Throws Unsupported naming `call` when NCCL cannot be loaded.
const NcclLib& requireNccl(const char* call);

[[noreturn]] void throwNccl(const char* expr, ncclResult_t r, const char* file, int line);

}  // namespace kvcomm::detail

#define KVCOMM_CHECK_NCCL(expr)                                                                          \
  do {                                                                                                   \
    ncclResult_t kvcommNccl_ = (expr);                                                                   \
    if (kvcommNccl_ != ncclSuccess) ::kvcomm::detail::throwNccl(#expr, kvcommNccl_, __FILE__, __LINE__); \
  } while (0)
