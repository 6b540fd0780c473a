// The CUDA backend's call timing (compute_backend::time_calls): two events around each timed
// call's work on the stream it ran on, read into spans from the period's start event.

#include <cuda_runtime.h>

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
  if (!be.timing_calls())
    return;
  be_ = &be;
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
        timed_call{name_, be_->track_of(stream_), std::move(*start_), std::move(end)});
    be_->read_timed_calls(false);  // keeps the queue short over long runs
  } catch (const failure&) {       // a broken context: the call itself reports it
  }
}

cuda_compute::comm_timer::comm_timer(cuda_compute& be, const char* name, cudaStream_t stream)
    : be_(be) {
  const std::lock_guard<std::mutex> lock(be_.mutex_);
  if (!be_.timing_calls())
    return;
  ZMUON_CUDA_CHECK(cudaSetDevice(be_.device_));  // the events belong to the stream's device
  timer_ = std::make_unique<call_timer>(be_, name, stream);
}

cuda_compute::comm_timer::~comm_timer() {
  const std::lock_guard<std::mutex> lock(be_.mutex_);
  timer_.reset();
}

void cuda_compute::read_timed_calls(bool wait) {
  while (!timed_.empty()) {
    timed_call& t = timed_.front();
    if (wait)
      ZMUON_CUDA_CHECK(cudaEventSynchronize(t.end.get()));
    else if (!t.end.done())
      return;
    float start_ms = 0.0f, end_ms = 0.0f;
    ZMUON_CUDA_CHECK(cudaEventElapsedTime(&start_ms, period_start_->get(), t.start.get()));
    ZMUON_CUDA_CHECK(cudaEventElapsedTime(&end_ms, period_start_->get(), t.end.get()));
    add_call_span(t.name, start_ms, end_ms, t.track);
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

void cuda_compute::begin_timing_period() {
  if (!period_start_)
    period_start_.emplace();
  period_start_->record(ctx_.stream);
}

void cuda_compute::time_calls(bool on) {
  const launch_guard guard = activate();
  const bool was_on = timing_calls();
  read_timed_calls(true);  // the calls of an earlier period belong to it
  compute_backend::time_calls(on);
  if (on && !was_on)
    begin_timing_period();
}

call_times cuda_compute::take_call_times() {
  const launch_guard guard = activate();  // no call is timed meanwhile
  read_timed_calls(true);
  call_times out = compute_backend::take_call_times();
  if (timing_calls())
    begin_timing_period();
  return out;
}

}  // namespace zmuon::gpu
