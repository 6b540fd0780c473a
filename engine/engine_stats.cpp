// engine::memory / reset_peak_memory / time_backend_calls / take_backend_call_times /
// backend_call_spans: what each local rank's compute backend holds and where its time goes, for
// benchmarks (bench/step).
#include <exception>
#include <string>

#include "engine/impl.hpp"

namespace zmuon {

expected<compute_backend*> engine::impl::backend_of(int rank, const char* call) const {
  if (auto err = check_local(rank))
    return err;
  const auto local = static_cast<size_t>(rank - first_rank);
  if (local >= ranks.size())
    return error{errc::bad_state,
                 std::string(call) + "(): the engine has not started (no reduce() or step())"};
  return ranks[local].backend.get();
}

expected<memory_stats> engine::memory(int rank) const {
  auto be = impl_->backend_of(rank, "memory");
  if (!be)
    return be.err();
  return (*be)->memory();
}

void engine::reset_peak_memory() {
  for (auto& r : impl_->ranks)
    r.backend->reset_peak_memory();
}

void engine::time_backend_calls(bool on) {
  impl_->time_calls = on;
  for (auto& r : impl_->ranks)
    r.backend->time_calls(on);
}

expected<call_times> engine::take_backend_call_times(int rank) {
  auto be = impl_->backend_of(rank, "take_backend_call_times");
  if (!be)
    return be.err();
  try {
    return (*be)->take_call_times();
  } catch (const std::exception& e) {  // a CUDA failure while reading the events
    return error{errc::device_failure, e.what()};
  }
}

expected<std::vector<call_span>> engine::backend_call_spans(int rank) const {
  auto be = impl_->backend_of(rank, "backend_call_spans");
  if (!be)
    return be.err();
  return (*be)->last_call_spans();
}

}  // namespace zmuon
