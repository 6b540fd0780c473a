// The C ABI: the step: gradients handed over, the step run, parameters gathered and loaded, the
// learning rates set, the backends' call times.
#include "embed/c_api.hpp"

#include <optional>
#include <string>

using namespace zmuon::c_abi;
using zmuon::errc;

extern "C" {

namespace {

int reduce_views(const char* fn, zmuon_engine* eng, int32_t rank, const zmuon_tensor* grads,
                 size_t n, std::optional<void*> cuda_stream) {
  return with_views<zmuon::tensor_view, const float*>(
      fn, eng, grads, n, [&](zmuon::engine& e, const std::vector<zmuon::tensor_view>& v) {
        return cuda_stream ? e.reduce(rank, v, *cuda_stream) : e.reduce(rank, v);
      });
}

int gather_spans(const char* fn, zmuon_engine* eng, const zmuon_tensor* params, size_t n,
                 std::optional<void*> cuda_stream) {
  return with_views<zmuon::tensor_span, float*>(
      fn, eng, params, n, [&](zmuon::engine& e, const std::vector<zmuon::tensor_span>& v) {
        return cuda_stream ? e.gather_params(v, *cuda_stream) : e.gather_params(v);
      });
}

}  // namespace

int zmuon_engine_reduce(zmuon_engine* eng, int32_t rank, const zmuon_tensor* grads, size_t n) {
  return reduce_views("zmuon_engine_reduce", eng, rank, grads, n, std::nullopt);
}

int zmuon_engine_reduce_on_stream(zmuon_engine* eng, int32_t rank, const zmuon_tensor* grads,
                                  size_t n, void* cuda_stream) {
  return reduce_views("zmuon_engine_reduce_on_stream", eng, rank, grads, n, cuda_stream);
}

int zmuon_engine_reduce_all(zmuon_engine* eng, const zmuon_tensor* const* grads,
                            const size_t* counts, int32_t ranks) {
  const char* fn = "zmuon_engine_reduce_all";
  return on_engine(fn, eng, [&]() -> zmuon::error {
    if (ranks > 0 && (!grads || !counts))
      return null_arg(fn, !grads ? "grads" : "counts");
    std::vector<std::vector<zmuon::tensor_view>> views(static_cast<size_t>(std::max(ranks, 0)));
    for (size_t i = 0; i < views.size(); ++i)
      if (auto err = views_of<zmuon::tensor_view, const float*>(fn, grads[i], counts[i], views[i]))
        return err;
    return eng->eng->reduce_all(views);
  });
}

namespace {

int run_step(const char* fn, zmuon_engine* eng, std::optional<void*> cuda_stream,
             zmuon_step_info* out) {
  return on_engine(fn, eng, [&]() -> zmuon::error {
    if (eng->job)
      eng->job->before_step();
    auto info = cuda_stream ? eng->eng->step(*cuda_stream) : eng->eng->step();
    if (!info)
      return info.err();
    if (eng->job)
      if (auto err = eng->job->after_step(*info))
        return err;
    if (out) {
      out->step = info->step;
      out->skipped = info->skipped ? 1 : 0;
      out->grad_norm = info->grad_norm;
      out->clip_coef = info->clip_coef;
      out->loss_scale = info->loss_scale;
      out->next_loss_scale = info->next_loss_scale;
      out->micro_batches = info->micro_batches;
      out->ns_params = info->ns_params;
      out->ns_matrices = info->ns_matrices;
    }
    return {};
  });
}

}  // namespace

int zmuon_engine_step(zmuon_engine* eng, zmuon_step_info* out) {
  return run_step("zmuon_engine_step", eng, std::nullopt, out);
}

int zmuon_engine_step_on_stream(zmuon_engine* eng, void* cuda_stream, zmuon_step_info* out) {
  return run_step("zmuon_engine_step_on_stream", eng, cuda_stream, out);
}

int zmuon_engine_hand_over_reduced(zmuon_engine* eng, int32_t rank, const zmuon_tensor* grads,
                                   size_t n, void* cuda_stream) {
  return with_views<zmuon::tensor_view, const float*>(
      "zmuon_engine_hand_over_reduced", eng, grads, n,
      [&](zmuon::engine& e, const std::vector<zmuon::tensor_view>& v) {
        return cuda_stream ? e.hand_over_reduced(rank, v, cuda_stream)
                           : e.hand_over_reduced(rank, v);
      });
}

int zmuon_engine_hand_over(zmuon_engine* eng, int32_t rank, const zmuon_tensor* grads, size_t n,
                           void* cuda_stream, uint32_t flags) {
  const char* fn = "zmuon_engine_hand_over";
  constexpr uint32_t known =
      ZMUON_HAND_OVER_REDUCED | ZMUON_HAND_OVER_KEPT_UNTIL_STEP | ZMUON_HAND_OVER_AHEAD_OF_STEP;
  if (flags & ~known)
    return fail(errc::invalid_argument, std::string(fn) + ": unknown flags "
                                            + std::to_string(flags & ~known)
                                            + " (known: " + std::to_string(known) + ")");
  return with_views<zmuon::tensor_view, const float*>(
      fn, eng, grads, n, [&](zmuon::engine& e, const std::vector<zmuon::tensor_view>& v) {
        return e.hand_over(rank, v, cuda_stream, (flags & ZMUON_HAND_OVER_REDUCED) != 0,
                           (flags & ZMUON_HAND_OVER_KEPT_UNTIL_STEP) != 0,
                           (flags & ZMUON_HAND_OVER_AHEAD_OF_STEP) != 0);
      });
}

int zmuon_engine_begin_step(zmuon_engine* eng, void* cuda_stream) {
  return on_engine("zmuon_engine_begin_step", eng,
                   [&]() -> zmuon::error { return eng->eng->begin_step(cuda_stream); });
}

int zmuon_engine_handed_over(zmuon_engine* eng, int32_t rank, int32_t* micro_batches) {
  const char* fn = "zmuon_engine_handed_over";
  return on_engine(fn, eng, [&]() -> zmuon::error {
    if (!micro_batches)
      return null_arg(fn, "micro_batches");
    auto n = eng->eng->handed_over(rank);
    if (!n)
      return n.err();
    *micro_batches = *n;
    return {};
  });
}

int zmuon_engine_shard_params(zmuon_engine* eng, int32_t rank, const zmuon_tensor* params, size_t n,
                              void* cuda_stream) {
  return with_views<zmuon::tensor_span, float*>(
      "zmuon_engine_shard_params", eng, params, n,
      [&](zmuon::engine& e, const std::vector<zmuon::tensor_span>& v) {
        return cuda_stream ? e.shard_params(rank, v, cuda_stream) : e.shard_params(rank, v);
      });
}

int zmuon_engine_load_shard_params(zmuon_engine* eng, int32_t rank, const zmuon_tensor* params,
                                   size_t n) {
  return with_views<zmuon::tensor_view, const float*>(
      "zmuon_engine_load_shard_params", eng, params, n,
      [&](zmuon::engine& e, const std::vector<zmuon::tensor_view>& v) {
        return e.load_shard_params(rank, v);
      });
}

int zmuon_engine_master(zmuon_engine* eng, const char* name, zmuon_tensor* out) {
  const char* fn = "zmuon_engine_master";
  return on_engine(fn, eng, [&]() -> zmuon::error {
    if (!name || !out)
      return null_arg(fn, !name ? "name" : "out");
    auto master = eng->eng->master_of(name);
    if (!master)
      return master.err();
    *out = zmuon_tensor{name, master->data, master->size,
                        master->space == zmuon::memory_space::host ? ZMUON_HOST : master->device};
    return {};
  });
}

int zmuon_engine_gather_params(zmuon_engine* eng, const zmuon_tensor* params, size_t n) {
  return gather_spans("zmuon_engine_gather_params", eng, params, n, std::nullopt);
}

int zmuon_engine_gather_params_on_stream(zmuon_engine* eng, const zmuon_tensor* params, size_t n,
                                         void* cuda_stream) {
  return gather_spans("zmuon_engine_gather_params_on_stream", eng, params, n, cuda_stream);
}

int zmuon_engine_loss_scale(zmuon_engine* eng, float* out) {
  const char* fn = "zmuon_engine_loss_scale";
  return guarded(fn, [&]() -> zmuon::error {
    if (!eng || !out)
      return null_arg(fn, eng ? "out" : "eng");
    auto s = eng->eng->loss_scale();
    if (!s)
      return s.err();
    *out = *s;
    return {};
  });
}

int zmuon_engine_set_lr(zmuon_engine* eng, float muon_lr, float adam_lr) {
  const char* fn = "zmuon_engine_set_lr";
  return on_engine(fn, eng, [&]() -> zmuon::error {
    if (!std::isfinite(muon_lr) || !std::isfinite(adam_lr))
      return {errc::invalid_argument,
              "learning rates must be finite (a negative one keeps the current rate)"};
    zmuon::lr_schedule m, a;
    if (muon_lr >= 0)
      m = [muon_lr](uint64_t) { return muon_lr; };
    if (adam_lr >= 0)
      a = [adam_lr](uint64_t) { return adam_lr; };
    eng->eng->set_lr_schedules(std::move(m), std::move(a));
    return {};
  });
}

int zmuon_engine_time_calls(zmuon_engine* eng, int32_t on) {
  const char* fn = "zmuon_engine_time_calls";
  return on_engine(fn, eng, [&]() -> zmuon::error {
    eng->eng->time_backend_calls(on != 0);
    return {};
  });
}

int zmuon_engine_write_call_timeline(zmuon_engine* eng, const char* path) {
  const char* fn = "zmuon_engine_write_call_timeline";
  return on_engine(fn, eng, [&]() -> zmuon::error {
    if (!path)
      return null_arg(fn, "path");
    return eng->eng->write_call_timeline(path);
  });
}

}  // extern "C"
