// job_end: why the job ended for this node ("node 1 (rank 1) lost in step 57: ..."), empty while
// it runs. The node supervisor writes it once; any thread reads it: the engine, to fail every
// later call with it, and a tool's watchdog, to end its process if its loop stays blocked.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>

namespace zmuon {

class job_end {
public:
  /// The first reason set stays.
  void set(const std::string& what) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!what_.empty())
        return;
      what_ = what;
    }
    changed_.notify_all();
  }

  /// The reason, or "" while the job runs.
  std::string what() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return what_;
  }

  /// The reason, waiting up to `limit` for one; "" if none came.
  std::string wait(std::chrono::milliseconds limit) const {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait_for(lock, limit, [&] { return !what_.empty(); });
    return what_;
  }

private:
  mutable std::mutex mutex_;
  mutable std::condition_variable changed_;
  std::string what_;
};

}  // namespace zmuon
