// Socket I/O of the network fetch transports: reads and writes bounded by a deadline that every bit of progress
// renews, polled in short slices so that a stop flag ends them promptly. Failures are returned, never thrown: the
// server drops the connection, the requester turns them into a fetch error naming the source.
#pragma once

#include <sys/uio.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/fd.hpp"
#include "common/socket.hpp"
#include "fetch/transport/net/segments.hpp"

namespace kvcomm::detail {

/// How an I/O call ended.
enum class IoResult { Ok, Closed, Timeout, Stopped, Error };
const char* ioResultText(IoResult r);

/// Reads exactly `n` bytes; `firstMs` bounds the wait for the first byte (< 0: `stallMs`), `stallMs` every later wait.
IoResult readExact(int fd, void* buf, size_t n, int64_t firstMs, int64_t stallMs, const std::atomic<bool>* stop,
                   int* err);
/// Writes all of iov[0..count) (the array is consumed in place). `more`: more data follows at once (MSG_MORE).
IoResult writeAll(int fd, iovec* iov, int count, int64_t stallMs, const std::atomic<bool>* stop, int* err,
                  bool more = false);

/// Moves the bytes of a segment cursor between a socket and memory at `base`, up to kIovBatch segments per system
/// call. `limit` stops after that many bytes (the cursor keeps its place). sendSegments sends `headBytes` at `head`
/// first, in the same system call as the first segments.
inline constexpr int kIovBatch = 64;
IoResult sendSegments(int fd, SegmentCursor& cursor, const char* base, uint64_t limit, int64_t stallMs,
                      const std::atomic<bool>* stop, int* err, const void* head = nullptr, size_t headBytes = 0);
IoResult recvSegments(int fd, SegmentCursor& cursor, char* base, uint64_t limit, int64_t stallMs,
                      const std::atomic<bool>* stop, int* err, uint64_t* received);

/// One connection attempt to a server that should be listening (a fetch server exists from Fetcher::create on):
/// refused or unreachable fails at once, a silent peer after `timeoutMs`. Returns an invalid Fd with *why.
Fd connectOnce(const SockAddr& addr, int64_t timeoutMs, std::string* why);

/// Waits until `fd` is readable (data or EOF) or `ms` elapse (< 0: forever), checking `stop`.
IoResult waitReadable(int fd, int64_t ms, const std::atomic<bool>* stop);

}  // namespace kvcomm::detail
