#include "fetch/transport/net/staged_io.hpp"

#include <sys/uio.h>

#include <algorithm>
#include <vector>

namespace kvcomm::detail {

IoResult sendStaged(int fd, SegmentCursor& cursor, const char* base, uint64_t bytes, HostStaging& staging,
                    int64_t stallMs, const std::atomic<bool>* stop, int* err) {
  uint64_t left = bytes;
  size_t filled[2] = {0, 0};
  auto fill = [&](int k) {
    std::vector<CopyDesc> copies;
    size_t at = 0;
    uint64_t off = 0, len = 0;
    while (at < staging.slotBytes() && left > 0 &&
           cursor.take(std::min<uint64_t>(left, staging.slotBytes() - at), &off, &len)) {
      copies.push_back({staging.slot(k) + at, base + off, static_cast<size_t>(len), 1, 0, 0});
      at += len;
      left -= len;
    }
    filled[k] = at;
    if (!copies.empty()) staging.toHost(k, copies);
  };
  fill(0);
  fill(1);
  IoResult r = IoResult::Ok;
  for (int k = 0; filled[k] > 0 && r == IoResult::Ok; k ^= 1) {
    staging.waitSlot(k);
    iovec v{staging.slot(k), filled[k]};
    r = writeAll(fd, &v, 1, stallMs, stop, err);
    if (r == IoResult::Ok) fill(k);
  }
  staging.waitSlot(0);
  staging.waitSlot(1);
  return r;
}

}  // namespace kvcomm::detail
