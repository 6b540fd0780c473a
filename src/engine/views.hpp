// The caller's buffers as the engine checks them (index_views: names, sizes, memory the backend
// can use) and backend calls made on the caller's thread (on_backend). Internal: not installed.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kernels/compute.hpp"
#include "plan/ownership.hpp"
#include "plan/plan.hpp"
#include "zmuon/engine.hpp"

namespace zmuon {

/// Runs `body`, backend calls made on the caller's thread (copies, waits: reduce(),
/// gather_params), and returns the failure a backend throws there (a CUDA error) as the error
/// it is, named after the engine's `call`: the C++ API returns errors, it never throws.
template <class Body>
error on_backend(const char* call, int rank, Body&& body) {
  try {
    body();
    return {};
  } catch (const std::exception& e) {
    return {errc::device_failure,
            std::string(call) + "(): rank " + std::to_string(rank) + ": " + e.what()};
  }
}

/// An engine call's host time on the caller's thread, in each backend's timeline while timing
/// is on (compute_backend::time_host_call): how the host's work lines up with the device's.
class host_call_timer {
public:
  host_call_timer(compute_backend& be, const char* name) : host_call_timer({&be}, name) {}
  host_call_timer(std::vector<compute_backend*> backends, const char* name)
      : backends_(std::move(backends)), name_(name), start_ns_(compute_backend::steady_ns()) {}
  host_call_timer(const host_call_timer&) = delete;
  host_call_timer& operator=(const host_call_timer&) = delete;
  ~host_call_timer() {
    for (compute_backend* be : backends_)
      be->time_host_call(name_, start_ns_);
  }

private:
  std::vector<compute_backend*> backends_;
  const char* name_;
  int64_t start_ns_;
};

/// Device buffers (memory_space::cuda) need the cuda compute backend; the engine then copies
/// from and to them on the rank's stream (reduce(): engine_reduce.cpp; gather_params: the
/// parameters are written when it returns).
template <class View>
error check_buffer(const View& v, const engine_options& opts) {
  if (v.space != memory_space::host && opts.compute != "cuda")
    return {errc::unsupported, "'" + v.name + "' is a CUDA device buffer (device "
                                   + std::to_string(v.device) + "), which compute backend '"
                                   + opts.compute
                                   + "' cannot read: hand over host memory or use 'cuda'"};
  return {};
}

/// The caller's views by parameter index (`at`: nullptr where none is given; `on_device`), once
/// all of them pass: a registered name, its size, memory the backend can use, no null pointer,
/// none given twice. The messages call a view `of` ("gradient of") and, when its name is
/// unknown, `for_` ("gradient for").
///
/// `shard_of` >= 0: a view may also be rank shard_of's shard alone (valid_len elements);
/// `whole` then says, per parameter, whether its view is the whole tensor.
template <class View, class Ptr>
error index_views(const plan& pl, const engine_options& opts, const std::vector<View>& views,
                  const std::string& of, const std::string& for_, std::vector<Ptr>& at,
                  std::vector<bool>& on_device, int shard_of = -1,
                  std::vector<bool>* whole = nullptr) {
  at.assign(pl.params.size(), nullptr);
  on_device.assign(pl.params.size(), false);
  if (whole)
    whole->assign(pl.params.size(), true);
  for (const auto& v : views) {
    const int i = pl.find(v.name);
    if (i < 0)
      return {errc::unknown_parameter,
              for_ + " '" + v.name + "', which is not a registered parameter"};
    const int64_t shard = shard_of >= 0 ? valid_len(pl.params[i], shard_of) : -1;
    if (v.size != pl.params[i].numel && v.size != shard)
      return {errc::shape_mismatch,
              of + " '" + v.name + "' has " + std::to_string(v.size) + " elements, expected "
                  + std::to_string(pl.params[i].numel)
                  + (shard_of >= 0 ? " (the whole tensor) or " + std::to_string(shard) + " (rank "
                                         + std::to_string(shard_of) + "'s shard)"
                                   : std::string())};
    if (whole)
      (*whole)[i] = v.size == pl.params[i].numel;
    if (v.size == 0)  // rank shard_of holds none of it (a short last dim-0 slice)
      continue;
    if (auto err = check_buffer(v, opts))
      return err;
    if (!v.data)
      return {errc::invalid_argument, of + " '" + v.name + "' is a null pointer"};
    if (at[i])
      return {errc::invalid_argument, of + " '" + v.name + "' is given twice"};
    at[i] = v.data;
    on_device[i] = v.space != memory_space::host;
  }
  return {};
}

}  // namespace zmuon
