// engine::memory / reset_peak_memory / time_backend_calls / take_backend_call_times /
// backend_call_spans / write_call_timeline: what each local rank's compute backend holds and
// where its time goes, for benchmarks (bench/step) and for finding a step's slow parts.
#include <algorithm>
#include <exception>
#include <fstream>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/impl.hpp"
#include "engine/job.hpp"
#include "engine/views.hpp"

namespace zmuon {

expected<compute_backend*> engine_job::backend_of(int rank, const char* call) const {
  if (auto err = check_local(rank))
    return err;
  const auto local = static_cast<size_t>(rank - first_rank);
  if (local >= ranks.size())
    return error{errc::bad_state,
                 std::string(call) + "(): the engine has not started (no reduce() or step())"};
  return ranks[local].backend.get();
}

expected<memory_stats> engine::memory(int rank) const {
  auto be = impl_->job->backend_of(rank, "memory");
  if (!be)
    return be.err();
  memory_stats stats;
  if (auto err = on_backend("memory", rank, [&] { stats = (*be)->memory(); }))
    return err;
  return stats;
}

void engine::reset_peak_memory() {
  for (auto& r : impl_->job->ranks)
    r.backend->reset_peak_memory();
}

void engine::time_backend_calls(bool on) {
  impl_->job->time_calls = on;
  for (auto& r : impl_->job->ranks)
    r.backend->time_calls(on);
}

expected<call_times> engine::take_backend_call_times(int rank) {
  auto be = impl_->job->backend_of(rank, "take_backend_call_times");
  if (!be)
    return be.err();
  call_times times;
  if (auto err =
          on_backend("take_backend_call_times", rank, [&] { times = (*be)->take_call_times(); }))
    return err;
  return times;
}

expected<std::vector<call_span>> engine::backend_call_spans(int rank) const {
  auto be = impl_->job->backend_of(rank, "backend_call_spans");
  if (!be)
    return be.err();
  return (*be)->last_call_spans();
}

error engine::write_call_timeline(const std::string& path) {
  auto& job = *impl_->job;
  if (!job.time_calls)
    return {errc::bad_state,
            "write_call_timeline(): call timing is off (time_backend_calls(true) "
            "first, then run the steps to see)"};
  std::map<int, std::vector<call_span>> by_rank;
  for (int r = job.first_rank; r < job.first_rank + job.local; ++r) {
    if (auto taken = take_backend_call_times(r); !taken)
      return taken.err();
    auto spans = backend_call_spans(r);
    if (!spans)
      return spans.err();
    by_rank[r] = std::move(*spans);
  }
  std::ofstream f(path);
  f << call_timeline_json(by_rank, job.opts.compute == "cuda") << "\n";
  if (!f.flush())
    return {errc::io_error, "write_call_timeline(): cannot write '" + path + "'"};
  return {};
}

std::string call_timeline_json(const std::map<int, std::vector<call_span>>& by_rank, bool cuda) {
  nlohmann::json events = nlohmann::json::array();
  const std::string first_track = cuda ? "main stream" : "host calls";
  for (const auto& [rank, spans] : by_rank) {
    events.push_back({{"ph", "M"},
                      {"name", "process_name"},
                      {"pid", rank},
                      {"args", {{"name", "rank " + std::to_string(rank)}}}});
    double origin = spans.empty() ? 0.0 : spans.front().start_ms;
    std::set<int> tracks;
    for (const call_span& s : spans) {
      origin = std::min(origin, s.start_ms);
      tracks.insert(s.track);
    }
    auto track_name = [&](int t) {
      return t == call_span::kHostTrack ? std::string("engine calls")
             : t == 0                   ? first_track
                                        : "NS lane " + std::to_string(t - 1);
    };
    for (int t : tracks)
      events.push_back({{"ph", "M"},
                        {"name", "thread_name"},
                        {"pid", rank},
                        {"tid", t},
                        {"args", {{"name", track_name(t)}}}});
    for (const call_span& s : spans)
      events.push_back({{"ph", "X"},
                        {"name", s.name},
                        {"cat", s.track == call_span::kHostTrack ? "host" : "call"},
                        {"pid", rank},
                        {"tid", s.track},
                        {"ts", (s.start_ms - origin) * 1e3},
                        {"dur", (s.end_ms - s.start_ms) * 1e3}});
  }
  return nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump();
}

}  // namespace zmuon
