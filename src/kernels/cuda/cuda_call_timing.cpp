// The CUDA backend's call timing (compute_backend::time_calls, trace_calls): two events around
// each timed call's work on the stream it ran on, read into the host's clock from an anchor
// event recorded on an idle stream at a known host time.

#include <cuda_runtime.h>

#include <cmath>
#include <utility>

#include "kernels/cuda/check.hpp"
#include "kernels/cuda/cuda_compute.hpp"

namespace zmuon::gpu {

cuda_event cuda_compute::take_event() {
  if (spare_events_.empty())
    return cuda_event();
  cuda_event e = std::move(spare_events_.back());
  spare_events_.pop_back();
  return e;
}

cuda_compute::call_timer::call_timer(cuda_compute& be, const char* name, cudaStream_t stream)
    : name_(name), stream_(stream) {
  if (!be.timing_or_tracing())
    return;
  be_ = &be;
  anchor_ = be.current_anchor();
  start_.emplace(be.take_event());
  start_->record(stream_);
}

cuda_compute::call_timer::~call_timer() {
  if (be_ == nullptr)
    return;
  try {
    cuda_event end = be_->take_event();
    end.record(stream_);
    be_->timed_.push_back(
        timed_call{name_, be_->track_of(stream_), anchor_, std::move(*start_), std::move(end)});
    be_->read_timed_calls(false);  // keeps the queue short over long runs
  } catch (const failure&) {       // a broken context: the call itself reports it
  }
}

cuda_compute::comm_timer::comm_timer(cuda_compute& be, const char* name, cudaStream_t stream)
    : be_(be) {
  const std::lock_guard<std::mutex> lock(be_.mutex_);
  if (!be_.timing_or_tracing())
    return;
  ZMUON_CUDA_CHECK(cudaSetDevice(be_.device_));  // the events belong to the stream's device
  timer_ = std::make_unique<call_timer>(be_, name, stream);
}

cuda_compute::comm_timer::~comm_timer() {
  const std::lock_guard<std::mutex> lock(be_.mutex_);
  timer_.reset();
}

std::shared_ptr<const cuda_compute::clock_anchor> cuda_compute::current_anchor() {
  const int64_t now = steady_ns();
  if (anchor_ && now - anchor_->host_ns < kAnchorNs)
    return anchor_;
  if (!clock_stream_)
    clock_stream_.emplace();
  auto a = std::make_shared<clock_anchor>();
  a->host_ns = steady_ns();
  a->event.record(clock_stream_->get());
  anchor_ = std::move(a);
  return anchor_;
}

void cuda_compute::read_timed_calls(bool wait) {
  while (!timed_.empty()) {
    timed_call& t = timed_.front();
    if (wait) {
      ZMUON_CUDA_CHECK(cudaEventSynchronize(t.end.get()));
      ZMUON_CUDA_CHECK(cudaEventSynchronize(t.anchor->event.get()));
    } else if (!t.end.done() || !t.anchor->event.done()) {
      return;
    }
    float start_ms = 0.0f, end_ms = 0.0f;
    ZMUON_CUDA_CHECK(cudaEventElapsedTime(&start_ms, t.anchor->event.get(), t.start.get()));
    ZMUON_CUDA_CHECK(cudaEventElapsedTime(&end_ms, t.anchor->event.get(), t.end.get()));
    add_call(t.name, t.anchor->host_ns + std::llround(static_cast<double>(start_ms) * 1e6),
             t.anchor->host_ns + std::llround(static_cast<double>(end_ms) * 1e6), t.track);
    spare_events_.push_back(std::move(t.start));
    spare_events_.push_back(std::move(t.end));
    timed_.pop_front();
  }
}

int cuda_compute::track_of(cudaStream_t stream) const {
  for (int i = 0; i < stream_set::kLanes; ++i)
    if (stream == streams_->lane_stream(i))
      return 1 + i;
  return 0;
}

void cuda_compute::time_calls(bool on) {
  const launch_guard guard = activate();
  read_timed_calls(true);  // the calls of an earlier period belong to it
  compute_backend::time_calls(on);
}

call_times cuda_compute::take_call_times() {
  const launch_guard guard = activate();  // no call is timed meanwhile
  read_timed_calls(true);
  return compute_backend::take_call_times();
}

void cuda_compute::read_traced_calls() {
  const std::lock_guard<std::mutex> lock(mutex_);
  try {
    ZMUON_CUDA_CHECK(cudaSetDevice(device_));
    read_timed_calls(false);
  } catch (const failure&) {  // a broken context: the calls report it
  }
}

}  // namespace zmuon::gpu
