#include "kernels/cuda/completion_watcher.hpp"

#include <utility>

#include "kernels/cuda/check.hpp"

namespace zmuon::gpu {

namespace {

/// Whether `event` has passed: polled for up to `spin`, then waited for without a busy core
/// (the events are made with cudaEventBlockingSync). False where the device failed.
bool wait_for(cudaEvent_t event, std::chrono::microseconds spin) {
  const auto until = std::chrono::steady_clock::now() + spin;
  for (;;) {
    const cudaError_t status = cudaEventQuery(event);
    if (status != cudaErrorNotReady)
      return status == cudaSuccess;
    if (std::chrono::steady_clock::now() >= until)
      return cudaEventSynchronize(event) == cudaSuccess;
    std::this_thread::yield();
  }
}

}  // namespace

completion_watcher::completion_watcher(int device) : device_(device), thread_([this] { run(); }) {}

completion_watcher::~completion_watcher() {
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  woken_.notify_one();
  thread_.join();
  for (cudaEvent_t e : spare_)
    (void)cudaEventDestroy(e);
}

void completion_watcher::after(cudaStream_t stream, std::function<void(bool)> done) {
  cudaEvent_t event = nullptr;
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    if (!spare_.empty()) {
      event = spare_.back();
      spare_.pop_back();
    }
  }
  if (event == nullptr)
    ZMUON_CUDA_CHECK(
        cudaEventCreateWithFlags(&event, cudaEventDisableTiming | cudaEventBlockingSync));
  if (const cudaError_t status = cudaEventRecord(event, stream); status != cudaSuccess) {
    give_back(event);
    ZMUON_CUDA_CHECK(status);
  }
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(waiting{event, std::move(done)});
    ++queued_;
  }
  woken_.notify_one();
}

void completion_watcher::drain() {
  if (std::this_thread::get_id() == thread_.get_id())
    return;
  std::unique_lock<std::mutex> lock(mutex_);
  const uint64_t target = queued_;
  drained_.wait(lock, [&] { return ran_ >= target; });
}

void completion_watcher::give_back(cudaEvent_t event) {
  const std::lock_guard<std::mutex> lock(mutex_);
  spare_.push_back(event);
}

void completion_watcher::run() {
  (void)cudaSetDevice(device_);  // the events' device; a failure shows in the queries
  for (;;) {
    waiting next;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      woken_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty())
        return;  // stopping, nothing left
      next = std::move(queue_.front());
      queue_.pop_front();
    }
    // One stream's events pass in the order they were recorded, so the oldest comes first.
    const bool ok = wait_for(next.event, kSpin);
    try {
      next.done(ok);
    } catch (...) {  // its contract is not to throw; ending the host process would be worse
    }
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      spare_.push_back(next.event);
      ++ran_;
    }
    drained_.notify_all();
  }
}

}  // namespace zmuon::gpu
