// The status of polled work (a fetch operation, an endpoint transfer) as its C handle keeps it: the last test()/wait()
// result, so that its failed blocks and error text are read by separate calls (kvcomm*FailedBlocks, kvcomm*Error).
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>

#include "kvcomm/fetch.hpp"
#include "kvcomm/kvcomm.h"

namespace kvcomm::capi {

class PolledStatus {
 public:
  /// Keeps `s` and writes its C form into *out.
  void record(FetchStatus s, kvcommFetchStatus* out);
  /// The list pattern over the kept status's failed blocks.
  void failedBlocks(int64_t* blocks, size_t capacity, size_t* count, const char* call);
  /// The kept status's error text, copied like every C string.
  void error(char* text, size_t textBytes, size_t* needed, const char* call);

 private:
  std::mutex mu_;
  FetchStatus last_;
};

}  // namespace kvcomm::capi
