// compute_backend's call timing (kernels/compute.hpp, zmuon/call_times.hpp): the spans each
// backend records, summed per call name. In zmuon_base, which every backend library links (the
// CUDA backend's own project, bench/cuda, builds it without the host backend).

#include <algorithm>
#include <utility>

#include "kernels/compute.hpp"

namespace zmuon {

namespace {

/// Spans folded at a time per call name (a long timing period keeps at most this many).
constexpr size_t kSpansPerFold = size_t{1} << 16;

/// `ns` on the steady clock as ms since the timing period's start `epoch_ns` (call_span's times).
double ms_since(int64_t epoch_ns, int64_t ns) {
  return static_cast<double>(ns - epoch_ns) / 1e6;
}

}  // namespace

void fold_call_spans(std::vector<std::pair<double, double>>& spans, call_time& into) {
  std::sort(spans.begin(), spans.end());
  double covered_to = -1e300;
  for (const auto& [start, end] : spans) {
    ++into.calls;
    into.ms += end - start;
    if (end > covered_to) {
      into.busy_ms += end - std::max(start, covered_to);
      covered_to = end;
    }
  }
  spans.clear();
}

void compute_backend::time_calls(bool on) {
  std::lock_guard<std::mutex> lock(times_mutex_);
  if (on && !timing_.load()) {
    spans_.clear();
    period_spans_.clear();
    epoch_ns_ = steady_ns();
  }
  timing_.store(on);
}

call_times compute_backend::take_call_times() {
  std::lock_guard<std::mutex> lock(times_mutex_);
  call_times out;
  for (auto& [name, s] : spans_) {
    fold_call_spans(s.open, s.folded);
    out[name] = s.folded;
  }
  spans_.clear();
  last_spans_ = std::move(period_spans_);
  period_spans_.clear();
  std::stable_sort(last_spans_.begin(), last_spans_.end(),
                   [](const call_span& a, const call_span& b) { return a.start_ms < b.start_ms; });
  epoch_ns_ = steady_ns();
  return out;
}

std::vector<call_span> compute_backend::last_call_spans() const {
  std::lock_guard<std::mutex> lock(times_mutex_);
  return last_spans_;
}

void compute_backend::time_host_call(const char* name, int64_t start_ns) {
  if (!timing_.load())
    return;
  const int64_t end_ns = steady_ns();
  std::lock_guard<std::mutex> lock(times_mutex_);
  if (period_spans_.size() < kKeptSpans)
    period_spans_.push_back(call_span{name, call_span::kHostTrack, ms_since(epoch_ns_, start_ns),
                                      ms_since(epoch_ns_, end_ns)});
}

void compute_backend::add_call(const char* name, int64_t start_ns, int64_t end_ns, int track) {
  end_ns = std::max(start_ns, end_ns);
  if (sink_)
    sink_(traced_call{name, track, start_ns, end_ns});
  if (!timing_.load())
    return;
  std::lock_guard<std::mutex> lock(times_mutex_);
  const double start_ms = ms_since(epoch_ns_, start_ns);
  const double end_ms = ms_since(epoch_ns_, end_ns);
  auto& s = spans_[name];
  s.open.emplace_back(start_ms, end_ms);
  if (period_spans_.size() < kKeptSpans)
    period_spans_.push_back(call_span{name, track, start_ms, end_ms});
  if (s.open.size() >= kSpansPerFold)
    fold_call_spans(s.open, s.folded);
}

}  // namespace zmuon
