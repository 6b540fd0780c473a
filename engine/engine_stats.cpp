// engine::memory / reset_peak_memory / time_backend_calls / take_backend_call_times: what each
// local rank's compute backend holds and where its time goes, for benchmarks (bench/step).
#include <exception>

#include "engine/impl.hpp"

namespace zmuon {

expected<memory_stats> engine::memory(int rank) const {
  const auto& d = *impl_;
  if (auto err = d.check_local(rank))
    return err;
  const int local = rank - d.first_rank;
  if (static_cast<size_t>(local) >= d.ranks.size())
    return error{errc::bad_state, "memory(): the engine has not started (no reduce() or step())"};
  return d.ranks[local].backend->memory();
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
  auto& d = *impl_;
  if (auto err = d.check_local(rank))
    return err;
  const int local = rank - d.first_rank;
  if (static_cast<size_t>(local) >= d.ranks.size())
    return error{errc::bad_state,
                 "take_backend_call_times(): the engine has not started (no reduce() or step())"};
  try {
    return d.ranks[local].backend->take_call_times();
  } catch (const std::exception& e) {  // a CUDA failure while reading the events
    return error{errc::device_failure, e.what()};
  }
}

}  // namespace zmuon
