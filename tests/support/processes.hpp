// Real processes for tests that need them without MPI (fork): a group of children running one body each, memory
// shared with them for results, and a clock that is comparable across processes.
#pragma once

#include <sys/mman.h>
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <new>
#include <stdexcept>
#include <vector>

namespace kvtest {

/// CLOCK_MONOTONIC in nanoseconds: the same clock in every process of the machine.
int64_t nowNs();
/// Milliseconds between two nowNs() values.
inline double msBetween(int64_t from, int64_t to) {
  return static_cast<double>(to - from) / 1e6;
}

/// `n` forked children, child i running body(i). A child exits 0 when its body returns true, 2 when it returns
/// false, 3 when it throws (the message goes to stderr). The destructor kills and reaps any child still running, so
/// no test leaves a process behind.
class Children {
 public:
  Children(int n, const std::function<bool(int)>& body);
  ~Children();
  Children(const Children&) = delete;
  Children& operator=(const Children&) = delete;

  pid_t pid(int i) const { return pids_[static_cast<size_t>(i)]; }
  void kill(int i, int sig);
  /// Waits for every child; children still running after `timeoutSec` are killed (reported as -9). Returns each
  /// exit code (a signal is reported as its negative number).
  std::vector<int> wait(int timeoutSec);
  /// Whether every child has been reaped.
  bool allReaped() const;

 private:
  std::vector<pid_t> pids_;
  std::vector<int> codes_;
  std::vector<bool> reaped_;
};

/// Runs `body(i)` in `n` forked processes and waits for them (see Children).
std::vector<int> runProcesses(int n, const std::function<bool(int)>& body, int timeoutSec = 60);

/// `n` trivially copyable T in memory shared with children forked afterwards (zero-initialised).
template <typename T>
class Shared {
 public:
  explicit Shared(size_t n = 1) : n_(n) {
    void* p = mmap(nullptr, sizeof(T) * n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    p_ = static_cast<T*>(p);
  }
  ~Shared() { munmap(p_, sizeof(T) * n_); }
  Shared(const Shared&) = delete;
  Shared& operator=(const Shared&) = delete;
  T& operator[](size_t i) { return p_[i]; }
  T* data() { return p_; }

 private:
  T* p_;
  size_t n_;
};

/// Polls `done` every millisecond until it holds or `timeoutMs` passed; returns whether it held.
bool waitFor(const std::function<bool()>& done, int timeoutMs);

}  // namespace kvtest
