// A rank's streams: the main stream, on which every backend call and the nccl comm enqueue in
// call order, and a few lanes that Newton-Schulz calls fork onto so that the same-shape groups
// of one chunk (GPT-2: 48x768², 12x768x3072, 12x3072x768) run side by side instead of each
// leaving part of the device idle.
//
// Consecutive NS calls all fork from one point of the main stream (an event recorded at the
// first of them) and run concurrently on their lanes; the next piece of work on the main
// stream joins them first (join() makes the main stream wait for every lane that has work it
// has not waited for). Every way onto the main stream joins: the backend's calls, its
// stream() accessor (nccl comm, benchmarks), and the release of buffers (a stream-ordered
// free or a pinned block's return must come after lane work that may still use the memory).
// Shared (shared_ptr) with those release functions, so it outlives the backend if need be.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <mutex>

#include "kernels/cuda/check.hpp"
#include "kernels/cuda/owners.hpp"

namespace zmuon::gpu {

class stream_set {
public:
  static constexpr int kLanes = 3;

  stream_set() = default;
  stream_set(const stream_set&) = delete;
  stream_set& operator=(const stream_set&) = delete;

  /// The main stream, after joining the lanes.
  cudaStream_t joined() {
    join();
    return main_.get();
  }
  /// The main stream as it is (for work that is itself about to join, or the constructor).
  cudaStream_t main() const { return main_.get(); }

  /// Makes the main stream wait for every lane's work enqueued so far.
  void join() {
    const std::lock_guard<std::mutex> lock(mutex_);
    for (int i = 0; i < kLanes; ++i) {
      if (pending_ & (1u << i))
        ZMUON_CUDA_CHECK(cudaStreamWaitEvent(main_.get(), lanes_[i].done.get(), 0));
    }
    pending_ = 0;
    forked_ = false;
  }

  /// The next lane's stream, ordered after the main stream's work up to the fork point.
  /// Call lane_done(lane) after enqueueing on it.
  cudaStream_t fork(int& lane) {
    const std::lock_guard<std::mutex> lock(mutex_);
    if (!forked_) {
      fork_.record(main_.get());
      forked_ = true;
    }
    lane = next_;
    next_ = (next_ + 1) % kLanes;
    ZMUON_CUDA_CHECK(cudaStreamWaitEvent(lanes_[lane].stream.get(), fork_.get(), 0));
    return lanes_[lane].stream.get();
  }
  void lane_done(int lane) {
    const std::lock_guard<std::mutex> lock(mutex_);
    lanes_[lane].done.record(lanes_[lane].stream.get());
    pending_ |= 1u << lane;
  }
  cudaStream_t lane_stream(int lane) const { return lanes_[lane].stream.get(); }

  /// Waits for everything on every stream.
  void synchronize() {
    join();
    ZMUON_CUDA_CHECK(cudaStreamSynchronize(main_.get()));
  }

private:
  struct lane_streams {
    cuda_stream stream;
    cuda_event done{cudaEventDisableTiming};
  };
  cuda_stream main_;
  std::array<lane_streams, kLanes> lanes_;
  cuda_event fork_{cudaEventDisableTiming};
  std::mutex mutex_;
  unsigned pending_ = 0;  // bit i: lane i has work the main stream has not joined
  bool forked_ = false;   // fork_ marks the current burst of NS calls
  int next_ = 0;
};

}  // namespace zmuon::gpu
