// completion_watcher: host work run once a stream has reached a point, from a thread of its own
// that polls an event. It replaces cudaLaunchHostFunc on the step's critical path: the vote's
// sums land on the host through it (compute_backend::when_done, scan_async). A host function
// runs on the driver's callback thread, which the driver wakes after the stream gets there,
// and the stream waits for it to return; on an H100 the scan's landing through two of them took
// about 0.15 ms from the reduction's end to the loss scaler's receipt (docs/DECISIONS.md).
// Here an event is recorded instead and the watcher's thread sees it pass within microseconds:
// it polls for up to kSpin, then blocks in cudaEventSynchronize, so a long wait (a whole step's)
// costs no core. The stream never waits for the host work.
#pragma once

#include <cuda_runtime.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace zmuon::gpu {

class completion_watcher {
public:
  /// How long the thread polls an event before it blocks on it.
  static constexpr std::chrono::microseconds kSpin{1000};

  /// A watcher of streams on `device` (an ordinal), its thread started.
  explicit completion_watcher(int device);
  /// Runs what still waits, each once its event has passed, then ends the thread. The owner
  /// synchronizes its streams first, so nothing waits long.
  ~completion_watcher();
  completion_watcher(const completion_watcher&) = delete;
  completion_watcher& operator=(const completion_watcher&) = delete;

  /// Runs `done(true)` on the watcher's thread once the work enqueued on `stream` so far has
  /// finished; `done(false)` where the device failed first (the stream's later CUDA calls then
  /// fail too). The calls run in the order they were made, each after the ones before (a
  /// watcher serves one stream). Throws gpu::failure where the event cannot be recorded
  /// (nothing is then queued). `done` must not throw.
  void after(cudaStream_t stream, std::function<void(bool)> done);
  /// Returns once every `done` queued before the call has run (at once on the watcher's own
  /// thread, where waiting would never end). The caller has synchronized the stream, so that
  /// none of them waits long.
  void drain();

private:
  struct waiting {
    cudaEvent_t event;
    std::function<void(bool)> done;
  };
  void run();
  void give_back(cudaEvent_t event);

  int device_;
  std::mutex mutex_;
  std::condition_variable woken_;
  std::deque<waiting> queue_;
  std::vector<cudaEvent_t> spare_;  // events whose waits are over, for reuse
  uint64_t queued_ = 0;             // calls of after() so far
  uint64_t ran_ = 0;                // of those, the ones whose `done` has run
  std::condition_variable drained_;
  bool stopping_ = false;
  std::thread thread_;  // last: started once the members above exist
};

}  // namespace zmuon::gpu
