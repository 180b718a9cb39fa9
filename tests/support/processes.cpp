#include "support/processes.hpp"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <exception>
#include <thread>

namespace kvtest {

int64_t nowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

Children::Children(int n, const std::function<bool(int)>& body) {
  std::fflush(stdout);
  std::fflush(stderr);
  for (int i = 0; i < n; ++i) {
    pid_t pid = fork();
    if (pid < 0) throw std::runtime_error("fork failed");
    if (pid == 0) {
      int code = 1;
      try {
        code = body(i) ? 0 : 2;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "child %d: %s\n", i, e.what());
        code = 3;
      }
      std::fflush(stdout);
      std::fflush(stderr);
      _exit(code);
    }
    pids_.push_back(pid);
  }
  codes_.assign(static_cast<size_t>(n), -1);
  reaped_.assign(static_cast<size_t>(n), false);
}

Children::~Children() {
  for (size_t i = 0; i < pids_.size(); ++i)
    if (!reaped_[i]) {
      ::kill(pids_[i], SIGKILL);
      waitpid(pids_[i], nullptr, 0);
    }
}

void Children::kill(int i, int sig) {
  if (!reaped_[static_cast<size_t>(i)]) ::kill(pids_[static_cast<size_t>(i)], sig);
}

std::vector<int> Children::wait(int timeoutSec) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeoutSec);
  while (true) {
    bool all = true;
    for (size_t i = 0; i < pids_.size(); ++i) {
      if (reaped_[i]) continue;
      int status = 0;
      if (waitpid(pids_[i], &status, WNOHANG) == pids_[i]) {
        codes_[i] = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
        reaped_[i] = true;
      } else {
        all = false;
      }
    }
    if (all) break;
    if (std::chrono::steady_clock::now() > deadline) {
      for (size_t i = 0; i < pids_.size(); ++i)
        if (!reaped_[i]) {
          ::kill(pids_[i], SIGKILL);
          waitpid(pids_[i], nullptr, 0);
          codes_[i] = -9;
          reaped_[i] = true;
        }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return codes_;
}

bool Children::allReaped() const {
  for (bool r : reaped_)
    if (!r) return false;
  return true;
}

std::vector<int> runProcesses(int n, const std::function<bool(int)>& body, int timeoutSec) {
  Children kids(n, body);
  return kids.wait(timeoutSec);
}

bool waitFor(const std::function<bool()>& done, int timeoutMs) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeoutMs);
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

}  // namespace kvtest
