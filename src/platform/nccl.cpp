#include "platform/nccl.hpp"

#include <dlfcn.h>

namespace kvcomm::detail {

const NcclLib& nccl() {
  static const NcclLib lib = [] {
    NcclLib l;
    void* h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      const char* e = dlerror();
      l.reason = cat("NCCL not found: dlopen(libnccl.so.2) failed: ", e ? e : "unknown");
      return l;
    }
    auto sym = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(h, name));
      if (!fn && l.reason.empty()) l.reason = cat("libnccl.so.2 lacks ", name);
    };
    sym(l.getVersion, "ncclGetVersion");
    sym(l.getUniqueId, "ncclGetUniqueId");
    sym(l.commInitRank, "ncclCommInitRank");
    sym(l.commDestroy, "ncclCommDestroy");
    sym(l.commAbort, "ncclCommAbort");
    sym(l.allGather, "ncclAllGather");
    sym(l.groupStart, "ncclGroupStart");
    sym(l.groupEnd, "ncclGroupEnd");
    sym(l.getErrorString, "ncclGetErrorString");
    if (l.reason.empty()) {
      l.getVersion(&l.version);
      l.usable = true;
    }
    return l;
  }();
  return lib;
}

const NcclLib& requireNccl(const char* call) {
  const NcclLib& l = nccl();
  if (!l.usable) throwError(ErrorCode::Unsupported, call, l.reason, __FILE__, __LINE__);
  return l;
}

void throwNccl(const char* expr, ncclResult_t r, const char* file, int line) {
  const NcclLib& l = nccl();
  std::string text = l.getErrorString ? l.getErrorString(r) : "unknown NCCL error";
  throwError(ErrorCode::NetworkError, expr, cat("NCCL error ", static_cast<int>(r), ": ", text), file, line);
}

}  // namespace kvcomm::detail
