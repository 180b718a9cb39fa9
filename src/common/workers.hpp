// Threads that run polled operations (network transfers, same-host CPU copies), kept between operations: a small
// transfer's latency should not include creating and joining a thread (on a loaded host that cost as much as the
// transfer itself). A worker runs one task at a time; a task finds an idle worker or a new one, so tasks never wait
// behind each other. A worker idle for kIdleExit ends (owners that live long, such as retired peer links, keep no
// threads); it is joined by the next run() or by destruction, which joins every worker after its task.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace kvcomm::detail {

class Workers {
 public:
  static constexpr std::chrono::milliseconds kIdleExit{500};

  Workers() = default;
  Workers(const Workers&) = delete;
  Workers& operator=(const Workers&) = delete;
  ~Workers() {
    std::vector<std::unique_ptr<Worker>> all;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
      all.swap(all_);
    }
    for (auto& w : all) {
      {
        std::lock_guard<std::mutex> lock(w->mu);
        w->stop = true;
      }
      w->cv.notify_one();
      w->thread.join();
    }
  }

  /// Runs `task` on an idle worker, or on a new one.
  void run(std::function<void()> task) {
    Worker* w = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      reap();
      if (!idle_.empty()) {
        w = idle_.back();
        idle_.pop_back();
      } else {
        all_.push_back(std::make_unique<Worker>());
        w = all_.back().get();
        w->thread = std::thread([this, w] { loop(*w); });
      }
    }
    {
      std::lock_guard<std::mutex> lock(w->mu);
      w->task = std::move(task);
    }
    w->cv.notify_one();
  }

 private:
  struct Worker {
    std::mutex mu;
    std::condition_variable cv;
    std::function<void()> task;
    bool stop = false;
    bool exited = false;  // under the pool's mu_
    std::thread thread;
  };
  void loop(Worker& w) {
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> lock(w.mu);
        if (!w.cv.wait_for(lock, kIdleExit, [&] { return w.stop || w.task; })) {
          lock.unlock();
          if (leave(w)) return;
          continue;  // run() took it meanwhile: its task is on the way
        }
        if (!w.task) return;  // stopping, nothing to run
        task.swap(w.task);
      }
      task();
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) continue;  // the destructor owns the list now; it stops this worker next
      idle_.push_back(&w);
    }
  }
  /// An idle worker's end: true when it left the idle list (nothing can hand it a task any more).
  bool leave(Worker& w) {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return false;  // the destructor stops it
    for (auto it = idle_.begin(); it != idle_.end(); ++it)
      if (*it == &w) {
        idle_.erase(it);
        w.exited = true;
        return true;
      }
    return false;
  }
  /// Joins the workers that ended idle (under mu_: they touch nothing after leaving).
  void reap() {
    for (auto it = all_.begin(); it != all_.end();) {
      if ((*it)->exited) {
        (*it)->thread.join();
        it = all_.erase(it);
      } else {
        ++it;
      }
    }
  }

  std::mutex mu_;
  bool stopping_ = false;
  std::vector<std::unique_ptr<Worker>> all_;
  std::vector<Worker*> idle_;
};

}  // namespace kvcomm::detail
