// A rank's streams: the main stream, on which every backend call and the nccl comm enqueue in
// call order, and a few lanes that Newton-Schulz calls fork onto, so that the same-shape groups
// of one chunk (GPT-2: 48x768², 12x768x3072, 12x3072x768) run side by side, and so that the
// main stream's memory-bound work on other chunks (the next chunk's momentum and gather, the
// last one's scatter and update) runs alongside a chunk's NS instead of after it.
//
// Both directions are ordered by the memory the work touches, not by everything before it:
// - an NS call forks onto the lane with the least work queued, after the main stream's last work
//   on the NS's memory (an event recorded after every piece of main-stream work that names its
//   memory: main_done), not after all of the main stream's queue;
// - work on the main stream waits only for the NS calls that touch its memory (join_touching:
//   an event recorded after each call on its lane; waiting for one waits for the lane's earlier
//   calls too, not for its later ones, so chunk i's scatter and update run beside chunk i+1's
//   NS on the same lanes): each backend call names the buffers it uses, and so do the nccl comm
//   (cuda_compute::stream_touching) and a buffer's release (a stream-ordered free must come
//   after lane work that may still use the memory).
// What cannot name its memory (the host-facing waits, completion callbacks, benchmarks'
// stream()) joins every lane and forgets the main stream's marks, so that the next NS call
// forks after everything. A mark's event slot is reused after kMarkEvents marks, which can only
// make a fork wait for later main-stream work (never less).
// Shared (shared_ptr) with those release functions, so it outlives the backend if need be.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <deque>
#include <initializer_list>
#include <mutex>
#include <vector>

#include "kernels/cuda/check.hpp"
#include "kernels/cuda/owners.hpp"

namespace zmuon::gpu {

/// Memory a piece of work reads or writes: [data, data + bytes).
struct touched {
  const void* data = nullptr;
  size_t bytes = 0;
};

class stream_set {
public:
  static constexpr int kLanes = 3;

  stream_set() = default;
  stream_set(const stream_set&) = delete;
  stream_set& operator=(const stream_set&) = delete;

  /// The main stream, after joining every lane, for work that does not name its memory.
  cudaStream_t joined() {
    join();
    forget_marks();
    return main_.get();
  }
  /// The main stream, after joining the lanes whose NS work touches any of `memory`.
  template <class Ranges>
  cudaStream_t touching(const Ranges& memory) {
    join_touching(memory);
    return main_.get();
  }
  cudaStream_t touching(std::initializer_list<touched> memory) {
    join_touching(memory);
    return main_.get();
  }
  /// The main stream as it is (for work that is itself about to join, or the constructor).
  cudaStream_t main() const { return main_.get(); }

  /// Makes the main stream wait for every lane's work enqueued so far.
  void join() {
    const std::lock_guard<std::mutex> lock(mutex_);
    for (int i = 0; i < kLanes; ++i)
      wait_for_calls(i, lanes_[i].calls.size());
  }
  /// Makes the main stream wait for the NS calls not yet joined that touch any of `memory`
  /// (on each lane the last such call, and so everything queued on that lane before it; not
  /// the lane's later calls on other memory).
  template <class Ranges>
  void join_touching(const Ranges& memory) {
    const std::lock_guard<std::mutex> lock(mutex_);
    for (int i = 0; i < kLanes; ++i) {
      const auto& calls = lanes_[i].calls;
      size_t through = 0;  // calls [0, through) to wait for
      for (size_t k = calls.size(); k > 0 && through == 0; --k)
        for (const touched& t : memory)
          if (overlaps(calls[k - 1].memory, t))
            through = k;
      wait_for_calls(i, through);
    }
  }
  void join_touching(std::initializer_list<touched> memory) {
    join_touching<std::initializer_list<touched>>(memory);
  }

  /// Per range of `memory`, when the NS work on it is expected to end, as the work queued on its
  /// lane up to and including the last call not yet joined that touches it (the lanes share the
  /// device and run side by side, so a lane's queued work orders its calls' ends against the
  /// other lanes'); 0 where no such call touches the range. For main-stream work split by it:
  /// the parts whose NS ends first go first, each waiting only for its own call.
  template <class Ranges>
  std::vector<double> expected_ends(const Ranges& memory) {
    const std::lock_guard<std::mutex> lock(mutex_);
    std::vector<double> out;
    for (const touched& t : memory) {
      double end = 0;
      for (const auto& lane : lanes_) {
        double queued = 0;
        for (const lane_call& call : lane.calls) {
          queued += call.work;
          if (overlaps(call.memory, t))
            end = std::max(end, queued);
        }
      }
      out.push_back(end);
    }
    return out;
  }

  /// Work just enqueued on the main stream reads or writes `memory`.
  template <class Ranges>
  void main_done(const Ranges& memory) {
    const std::lock_guard<std::mutex> lock(mutex_);
    cuda_event& event = mark_events_[next_event_];
    const int slot = next_event_;
    next_event_ = (next_event_ + 1) % kMarkEvents;
    bool recorded = false;
    for (const touched& t : memory) {
      if (t.bytes == 0)
        continue;
      if (!recorded)
        event.record(main_.get());
      recorded = true;
      marks_.push_back(mark{t, slot});
    }
    while (marks_.size() > kMaxMarks)
      marks_.pop_front();
  }

  /// The stream of the lane with the least work queued and not yet joined (ties: the next in
  /// turn), ordered after the main stream's last work on `memory` and any lane work on it: a
  /// call beyond the lanes' number starts where the first lane is expected to free up. Call
  /// lane_done(lane, memory, work) after enqueueing on it; `work` in any unit the caller keeps
  /// (NS: an iteration's multiply-adds).
  cudaStream_t fork(int& lane, touched memory) {
    join_touching({memory});
    const std::lock_guard<std::mutex> lock(mutex_);
    lane = next_;
    for (int k = 1; k < kLanes; ++k) {
      const int i = (next_ + k) % kLanes;
      if (lanes_[i].queued < lanes_[lane].queued)
        lane = i;
    }
    next_ = (lane + 1) % kLanes;
    const cuda_event* after = nullptr;
    for (auto m = marks_.rbegin(); m != marks_.rend() && after == nullptr; ++m)
      if (overlaps(m->memory, memory))
        after = &mark_events_[m->event];
    if (after == nullptr) {  // no main-stream work named this memory lately: after all of it
      fork_.record(main_.get());
      after = &fork_;
    }
    ZMUON_CUDA_CHECK(cudaStreamWaitEvent(lanes_[lane].stream.get(), after->get(), 0));
    return lanes_[lane].stream.get();
  }
  void lane_done(int lane, touched memory, double work) {
    const std::lock_guard<std::mutex> lock(mutex_);
    auto& calls = lanes_[lane].calls;
    if (calls.size() >= kMaxCalls)  // the oldest is long done: no lane holds more
      wait_for_calls(lane, 1);
    if (spare_.empty())
      spare_.emplace_back(cudaEventDisableTiming);
    lanes_[lane].queued += work;
    calls.push_back(lane_call{memory, std::move(spare_.back()), work});
    spare_.pop_back();
    calls.back().done.record(lanes_[lane].stream.get());
  }
  cudaStream_t lane_stream(int lane) const { return lanes_[lane].stream.get(); }

  /// Main-stream work that named no memory may touch anything: the next NS call forks after all.
  void forget_marks() {
    const std::lock_guard<std::mutex> lock(mutex_);
    marks_.clear();
  }

  /// Waits for everything on every stream.
  void synchronize() {
    join();
    ZMUON_CUDA_CHECK(cudaStreamSynchronize(main_.get()));
  }

private:
  /// An NS call on a lane that the main stream has not joined: its memory, and an event
  /// recorded after it on the lane.
  struct lane_call {
    touched memory;
    cuda_event done;
    double work = 0;
  };
  struct lane_streams {
    cuda_stream stream;
    std::deque<lane_call> calls;  // oldest first
    double queued = 0;            // the work of `calls`
  };
  static constexpr size_t kMaxCalls = 64;

  static constexpr int kMarkEvents = 64;
  static constexpr size_t kMaxMarks = 256;
  struct mark {
    touched memory;
    int event = 0;  // index into mark_events_
  };

  static bool overlaps(const touched& a, const touched& b) {
    const auto a0 = reinterpret_cast<uintptr_t>(a.data), b0 = reinterpret_cast<uintptr_t>(b.data);
    return a.bytes > 0 && b.bytes > 0 && a0 < b0 + b.bytes && b0 < a0 + a.bytes;
  }
  static std::vector<cuda_event> make_events() {
    std::vector<cuda_event> events;
    events.reserve(kMarkEvents);
    for (int i = 0; i < kMarkEvents; ++i)
      events.emplace_back(cudaEventDisableTiming);
    return events;
  }
  /// The main stream waits for lane i's first `count` calls not yet joined (the wait takes the
  /// event's state now, so the events can be recorded again). Holds mutex_.
  void wait_for_calls(int i, size_t count) {
    auto& calls = lanes_[i].calls;
    if (count == 0)
      return;
    ZMUON_CUDA_CHECK(cudaStreamWaitEvent(main_.get(), calls[count - 1].done.get(), 0));
    for (size_t k = 0; k < count; ++k) {
      lanes_[i].queued -= calls.front().work;
      spare_.push_back(std::move(calls.front().done));
      calls.pop_front();
    }
    if (calls.empty())
      lanes_[i].queued = 0;  // no rounding left behind
  }

  cuda_stream main_;
  std::array<lane_streams, kLanes> lanes_;
  cuda_event fork_{cudaEventDisableTiming};
  std::vector<cuda_event> mark_events_ = make_events();
  std::deque<mark> marks_;  // newest last
  int next_event_ = 0;
  std::mutex mutex_;
  std::vector<cuda_event> spare_;  // events of joined calls, recorded again by later ones
  int next_ = 0;
};

}  // namespace zmuon::gpu
