// The C ABI (zmuon/zmuon.h) over the C++ engine. Every entry point catches everything: errors
// become a status code plus the thread's last-error message, never an exception across the ABI.
#include "zmuon/zmuon.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "embed/job_hooks.hpp"
#include "plan/plan.hpp"
#include "zmuon/engine.hpp"
#include "zmuon/log.hpp"
#include "zmuon/orthogonalize.hpp"
#include "zmuon/version.hpp"

struct zmuon_engine {
  std::unique_ptr<zmuon::engine> eng;
  std::map<std::string, bool> uses_muon;  // by registered name
  std::unique_ptr<zmuon::job_hooks> job;  // zmuon_engine_create_with_host: notes, monitor
};

struct zmuon_orthogonalizer {
  zmuon::orthogonalizer ortho;
};

namespace {

using zmuon::errc;

static_assert(ZMUON_INVALID_ARGUMENT == static_cast<int>(errc::invalid_argument));
static_assert(ZMUON_SHAPE_MISMATCH == static_cast<int>(errc::shape_mismatch));
static_assert(ZMUON_INTERNAL == static_cast<int>(errc::internal));
static_assert(ZMUON_UNSUPPORTED == static_cast<int>(errc::unsupported));
static_assert(ZMUON_DEVICE_FAILURE == static_cast<int>(errc::device_failure));
static_assert(ZMUON_FLOAT32 == static_cast<int>(zmuon::element_type::fp32));
static_assert(ZMUON_BFLOAT16 == static_cast<int>(zmuon::element_type::bf16));
static_assert(ZMUON_LOG_ERROR == static_cast<int>(zmuon::log_level::error));
static_assert(ZMUON_LOG_TRACE == static_cast<int>(zmuon::log_level::trace));

thread_local std::string last_error;

int fail(const zmuon::error& err) {
  last_error = err.message();
  return static_cast<int>(err.code());
}

int fail(errc code, std::string message) {
  return fail(zmuon::error{code, std::move(message)});
}

/// Runs `body` (which returns a zmuon::error) with every exception turned into a status.
template <class Body>
int guarded(const char* fn, Body&& body) {
  try {
    zmuon::error err = body();
    return err ? fail(err) : ZMUON_OK;
  } catch (const std::bad_alloc&) {
    return fail(errc::internal, std::string(fn) + ": out of memory");
  } catch (const std::exception& e) {
    return fail(errc::internal, std::string(fn) + ": " + e.what());
  } catch (...) {
    return fail(errc::internal, std::string(fn) + ": unknown exception");
  }
}

zmuon::error null_arg(const char* fn, const char* what) {
  return {errc::invalid_argument, std::string(fn) + ": " + what + " is NULL"};
}

/// A create call's `overrides` that are NULL (the array, or one of its `n` entries), named.
zmuon::error null_override(const char* fn, const char* const* overrides, size_t n) {
  if (n > 0 && !overrides)
    return null_arg(fn, "overrides");
  for (size_t i = 0; i < n; ++i)
    if (!overrides[i])
      return null_arg(fn, ("overrides[" + std::to_string(i) + "]").c_str());
  return {};
}

std::vector<std::string> override_list(const char* const* overrides, size_t n) {
  return {overrides, overrides + n};
}

template <class View, class Ptr>
zmuon::error views_of(const char* fn, const zmuon_tensor* t, size_t n, std::vector<View>& out) {
  if (n > 0 && !t)
    return null_arg(fn, "the tensor array");
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    if (!t[i].name)
      return {errc::invalid_argument,
              std::string(fn) + ": tensor " + std::to_string(i) + " has a NULL name"};
    View v;
    v.name = t[i].name;
    v.data = static_cast<Ptr>(t[i].data);
    v.size = t[i].numel;
    if (t[i].device != ZMUON_HOST) {
      if (t[i].device < 0)
        return {errc::invalid_argument, std::string(fn) + ": tensor '" + v.name + "' has device "
                                            + std::to_string(t[i].device)
                                            + " (ZMUON_HOST = -1 or a CUDA ordinal >= 0)"};
      v.space = zmuon::memory_space::cuda;
      v.device = t[i].device;
    }
    out.push_back(std::move(v));
  }
  return {};
}

int create(const char* fn, zmuon_engine** out,
           const std::function<zmuon::expected<std::unique_ptr<zmuon::engine>>()>& make) {
  return guarded(fn, [&]() -> zmuon::error {
    if (!out)
      return null_arg(fn, "out");
    *out = nullptr;
    auto made = make();
    if (!made)
      return made.err();
    auto handle = std::make_unique<zmuon_engine>();
    handle->eng = std::move(*made);
    *out = handle.release();
    return {};
  });
}

/// The engine's buffer calls: checks `eng` and the tensors (read-only views, View =
/// tensor_view, or writable spans, tensor_span), then runs call(engine, views).
template <class View, class Ptr, class Call>
int with_views(const char* fn, zmuon_engine* eng, const zmuon_tensor* tensors, size_t n,
               Call call) {
  return guarded(fn, [&]() -> zmuon::error {
    if (!eng)
      return null_arg(fn, "eng");
    std::vector<View> views;
    if (auto err = views_of<View, Ptr>(fn, tensors, n, views))
      return err;
    return call(*eng->eng, views);
  });
}

}  // namespace

extern "C" {

const char* zmuon_last_error(void) {
  return last_error.c_str();
}

const char* zmuon_version(void) {
  return zmuon::version();
}

const char* zmuon_status_name(int status) {
  if (status < 0 || status > ZMUON_DEVICE_FAILURE)
    return "unknown";
  return zmuon::to_string(static_cast<errc>(status));
}

int zmuon_set_log_level(int level) {
  if (level < ZMUON_LOG_ERROR || level > ZMUON_LOG_TRACE)
    return fail(errc::invalid_argument, "zmuon_set_log_level: level " + std::to_string(level)
                                            + " is outside [ZMUON_LOG_ERROR = 0, "
                                              "ZMUON_LOG_TRACE = 4]");
  zmuon::set_log_level(static_cast<zmuon::log_level>(level));
  return ZMUON_OK;
}

int zmuon_set_log_callback(zmuon_log_callback callback, void* user) {
  return guarded("zmuon_set_log_callback", [&]() -> zmuon::error {
    if (!callback) {
      zmuon::set_log_sink({});
      return {};
    }
    zmuon::set_log_sink([callback, user](zmuon::log_level level, std::string_view message) {
      const std::string line(message);  // NUL-terminated
      callback(static_cast<int>(level), line.c_str(), user);
    });
    return {};
  });
}

int zmuon_engine_create(const char* config_json, const char* const* overrides, size_t n_overrides,
                        zmuon_engine** out) {
  if (auto err = null_override("zmuon_engine_create", overrides, n_overrides))
    return fail(err);
  return create("zmuon_engine_create", out, [&] {
    return zmuon::engine::create_from_json(config_json ? config_json : "",
                                           override_list(overrides, n_overrides));
  });
}

int zmuon_engine_create_from_file(const char* path, const char* const* overrides,
                                  size_t n_overrides, zmuon_engine** out) {
  if (!path)
    return fail(null_arg("zmuon_engine_create_from_file", "path"));
  if (auto err = null_override("zmuon_engine_create_from_file", overrides, n_overrides))
    return fail(err);
  return create("zmuon_engine_create_from_file", out, [&] {
    return zmuon::engine::create_from_file(path, override_list(overrides, n_overrides));
  });
}

int zmuon_engine_create_node(const char* config_json, const char* const* overrides,
                             size_t n_overrides, int32_t nodes, int32_t node_rank, int32_t ranks,
                             const char* master, zmuon_engine** out) {
  const char* fn = "zmuon_engine_create_node";
  if (auto err = null_override(fn, overrides, n_overrides))
    return fail(err);
  if (!master)
    return fail(null_arg(fn, "master"));
  return create(fn, out, [&]() -> zmuon::expected<std::unique_ptr<zmuon::engine>> {
    auto cfg = zmuon::parse_config_text(config_json ? config_json : "",
                                        override_list(overrides, n_overrides));
    if (!cfg)
      return cfg.err();
    zmuon::join_options join;
    join.nodes = nodes;
    join.node_rank = node_rank;
    join.ranks = ranks;
    join.master = master;
    join.join_timeout_ms = cfg->engine.timeout_ms;
    join.heartbeat_timeout_ms = cfg->heartbeat_timeout_ms;
    auto agreed = zmuon::config_json(*cfg);  // what every process must agree on
    agreed["zmuon"].erase("ranks");
    join.job = agreed.dump();
    return zmuon::engine::create_node(cfg->engine, join);
  });
}

int zmuon_engine_start(zmuon_engine* eng) {
  const char* fn = "zmuon_engine_start";
  return guarded(fn, [&]() -> zmuon::error {
    if (!eng)
      return null_arg(fn, "eng");
    return eng->eng->start();
  });
}

int zmuon_engine_first_rank(const zmuon_engine* eng, int32_t* out) {
  if (!eng || !out)
    return fail(null_arg("zmuon_engine_first_rank", eng ? "out" : "eng"));
  *out = eng->eng->first_rank();
  return ZMUON_OK;
}

int zmuon_engine_sum_over_nodes(zmuon_engine* eng, double* values, size_t n) {
  const char* fn = "zmuon_engine_sum_over_nodes";
  return guarded(fn, [&]() -> zmuon::error {
    if (!eng || (n > 0 && !values))
      return null_arg(fn, !eng ? "eng" : "values");
    auto sums = eng->eng->sum_over_nodes(std::vector<double>(values, values + n));
    if (!sums)
      return sums.err();
    std::copy(sums->begin(), sums->end(), values);
    return {};
  });
}

void zmuon_engine_destroy(zmuon_engine* eng) {
  try {
    delete eng;
  } catch (...) {  // a destructor that throws must not cross the ABI
  }
}

int zmuon_engine_world(const zmuon_engine* eng, int32_t* out) {
  if (!eng || !out)
    return fail(null_arg("zmuon_engine_world", eng ? "out" : "eng"));
  *out = eng->eng->world();
  return ZMUON_OK;
}

int zmuon_engine_add_parameter(zmuon_engine* eng, const char* name, const int64_t* shape,
                               int32_t ndim, int32_t group, int64_t heads, const float* init,
                               int64_t numel) {
  const char* fn = "zmuon_engine_add_parameter";
  return guarded(fn, [&]() -> zmuon::error {
    if (!eng)
      return null_arg(fn, "eng");
    if (!name)
      return null_arg(fn, "name");
    if (ndim < 1 || !shape)
      return {errc::invalid_argument,
              std::string("parameter '") + name + "' needs a shape (ndim >= 1, shape not NULL)"};
    if (group < ZMUON_GROUP_AUTO || group > ZMUON_GROUP_ADAMW)
      return {errc::invalid_argument, std::string("parameter '") + name + "': group "
                                          + std::to_string(group)
                                          + " is not ZMUON_GROUP_AUTO, _MUON or _ADAMW"};
    zmuon::param_spec spec{name, std::vector<int64_t>(shape, shape + ndim),
                           static_cast<zmuon::param_group>(group), heads};
    // The group the plan gives it (the default rule for AUTO); the plan also checks the spec.
    auto alone = zmuon::make_plan({spec}, 1, 1 << 30);
    if (!alone)
      return alone.err();
    std::vector<float> values;
    if (!init && numel != 0 && numel != alone->params[0].numel)
      return {errc::shape_mismatch, std::string("parameter '") + name + "': init is NULL (zeros) "
                                        "but numel is " + std::to_string(numel) + ", not 0 or "
                                        + std::to_string(alone->params[0].numel)};
    if (init) {
      if (numel != alone->params[0].numel)
        return {errc::shape_mismatch, std::string("initial values of '") + name + "' have "
                                          + std::to_string(numel) + " elements, shape needs "
                                          + std::to_string(alone->params[0].numel)};
      values.assign(init, init + numel);
    }
    if (auto err = eng->eng->add_parameter(spec, values))
      return err;
    eng->uses_muon[name] = alone->params[0].muon;
    return {};
  });
}

int zmuon_engine_param_uses_muon(const zmuon_engine* eng, const char* name, int32_t* out) {
  const char* fn = "zmuon_engine_param_uses_muon";
  return guarded(fn, [&]() -> zmuon::error {
    if (!eng || !name || !out)
      return null_arg(fn, !eng ? "eng" : !name ? "name" : "out");
    auto it = eng->uses_muon.find(name);
    if (it == eng->uses_muon.end())
      return {errc::unknown_parameter, std::string("'") + name + "' is not a registered parameter"};
    *out = it->second ? 1 : 0;
    return {};
  });
}

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
  return guarded(fn, [&]() -> zmuon::error {
    if (!eng)
      return null_arg(fn, "eng");
    if (ranks > 0 && (!grads || !counts))
      return null_arg(fn, !grads ? "grads" : "counts");
    std::vector<std::vector<zmuon::tensor_view>> views(static_cast<size_t>(std::max(ranks, 0)));
    for (size_t i = 0; i < views.size(); ++i)
      if (auto err = views_of<zmuon::tensor_view, const float*>(fn, grads[i], counts[i], views[i]))
        return err;
    return eng->eng->reduce_all(views);
  });
}

int zmuon_engine_step(zmuon_engine* eng, zmuon_step_info* out) {
  const char* fn = "zmuon_engine_step";
  return guarded(fn, [&]() -> zmuon::error {
    if (!eng)
      return null_arg(fn, "eng");
    if (eng->job)
      eng->job->before_step();
    auto info = eng->eng->step();
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

int zmuon_engine_hand_over_reduced(zmuon_engine* eng, int32_t rank, const zmuon_tensor* grads,
                                   size_t n, void* cuda_stream) {
  return with_views<zmuon::tensor_view, const float*>(
      "zmuon_engine_hand_over_reduced", eng, grads, n,
      [&](zmuon::engine& e, const std::vector<zmuon::tensor_view>& v) {
        return cuda_stream ? e.hand_over_reduced(rank, v, cuda_stream)
                           : e.hand_over_reduced(rank, v);
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
  return guarded(fn, [&]() -> zmuon::error {
    if (!eng)
      return null_arg(fn, "eng");
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

namespace {

/// The C struct as the engine's values: lr and weight_decay go to both algorithms; the NS
/// options start from the config's, whose coefficient schedule stays while the group keeps the
/// config's steps and coefficients.
zmuon::error to_group(const zmuon::engine& eng, const zmuon_group_hparams& in,
                      zmuon::group_hparams& out) {
  const auto& opts = eng.options();
  if (in.ns_variant < ZMUON_NS_STANDARD || in.ns_variant > ZMUON_NS_AUTO)
    return {errc::invalid_argument, "ns_variant must be 0 (standard), 1 (gram) or 2 (auto), got "
                                        + std::to_string(in.ns_variant)};
  if (in.adjust_lr < ZMUON_ADJUST_LR_ORIGINAL || in.adjust_lr > ZMUON_ADJUST_LR_RMS)
    return {errc::invalid_argument,
            "adjust_lr must be 0 (original), 1 (match_rms_adamw), "
            "2 (spectral) or 3 (rms), got "
                + std::to_string(in.adjust_lr)};
  out.muon = opts.muon;
  out.adamw = opts.adamw;
  out.muon.lr = out.adamw.lr = in.lr;
  out.muon.weight_decay = out.adamw.weight_decay = in.weight_decay;
  out.muon.momentum = in.momentum;
  out.muon.nesterov = in.nesterov != 0;
  out.adamw.beta1 = in.beta1;
  out.adamw.beta2 = in.beta2;
  out.adamw.eps = in.eps;
  auto& ns = out.muon.ns;
  const std::array<float, 3> coefficients{in.ns_coefficients[0], in.ns_coefficients[1],
                                          in.ns_coefficients[2]};
  if (in.ns_steps != ns.steps || coefficients != ns.coefficients)
    ns.schedule.clear();
  ns.steps = in.ns_steps;
  ns.coefficients = coefficients;
  ns.eps = in.ns_eps;
  ns.variant = static_cast<zmuon::ns_variant>(in.ns_variant);
  out.muon.adjust_lr = static_cast<zmuon::adjust_lr_rule>(in.adjust_lr);
  out.muon.qk_clip_tau = in.qk_clip_tau;
  return {};
}

}  // namespace

static_assert(ZMUON_NS_STANDARD == static_cast<int>(zmuon::ns_variant::standard));
static_assert(ZMUON_NS_GRAM == static_cast<int>(zmuon::ns_variant::gram));
static_assert(ZMUON_NS_AUTO == static_cast<int>(zmuon::ns_variant::automatic));
static_assert(ZMUON_ADJUST_LR_MATCH_RMS_ADAMW
              == static_cast<int>(zmuon::adjust_lr_rule::match_rms_adamw));

static_assert(ZMUON_ADJUST_LR_SPECTRAL == static_cast<int>(zmuon::adjust_lr_rule::spectral));
static_assert(ZMUON_ADJUST_LR_RMS == static_cast<int>(zmuon::adjust_lr_rule::rms));
static_assert(ZMUON_VIEW_EXPERT_STACK == static_cast<int>(zmuon::matrix_view::expert_stack));
static_assert(ZMUON_VIEW_FLATTEN == static_cast<int>(zmuon::matrix_view::flatten));

int zmuon_engine_set_muon_blocks(zmuon_engine* eng, const char* name, const int64_t* split_sizes,
                                 const int64_t* split_heads, size_t n, int32_t view) {
  const char* fn = "zmuon_engine_set_muon_blocks";
  return guarded(fn, [&]() -> zmuon::error {
    if (!eng || !name)
      return null_arg(fn, eng ? "name" : "eng");
    if (n > 0 && !split_sizes)
      return null_arg(fn, "split_sizes");
    if (view < ZMUON_VIEW_AUTO || view > ZMUON_VIEW_FLATTEN)
      return {errc::invalid_argument, std::string(fn) + ": view must be 0 (auto), 1 (expert "
                                                        "stack) or 2 (flatten), got "
                                          + std::to_string(view)};
    std::vector<int64_t> sizes(split_sizes, split_sizes + n);
    std::vector<int64_t> heads;
    if (split_heads)
      heads.assign(split_heads, split_heads + n);
    return eng->eng->set_muon_blocks(name, sizes, heads, static_cast<zmuon::matrix_view>(view));
  });
}

int zmuon_engine_add_qk_clip(zmuon_engine* eng, const char* query, const char* key,
                             int64_t query_heads, int64_t key_heads) {
  const char* fn = "zmuon_engine_add_qk_clip";
  return guarded(fn, [&]() -> zmuon::error {
    if (!eng || !query || !key)
      return null_arg(fn, !eng ? "eng" : !query ? "query" : "key");
    return eng->eng->add_qk_clip(query, key, query_heads, key_heads);
  });
}

int zmuon_engine_report_qk_logits(zmuon_engine* eng, int32_t rank, const char* query,
                                  const float* max_logits, size_t n) {
  const char* fn = "zmuon_engine_report_qk_logits";
  return guarded(fn, [&]() -> zmuon::error {
    if (!eng || !query || (!max_logits && n > 0))
      return null_arg(fn, !eng ? "eng" : !query ? "query" : "max_logits");
    return eng->eng->report_qk_logits(rank, query, std::vector<float>(max_logits, max_logits + n));
  });
}

int zmuon_engine_set_hparam_group(zmuon_engine* eng, const char* name, int32_t group) {
  const char* fn = "zmuon_engine_set_hparam_group";
  return guarded(fn, [&]() -> zmuon::error {
    if (!eng || !name)
      return null_arg(fn, eng ? "name" : "eng");
    return eng->eng->set_hparam_group(name, group);
  });
}

int zmuon_engine_set_group_hparams(zmuon_engine* eng, int32_t group,
                                   const zmuon_group_hparams* values) {
  const char* fn = "zmuon_engine_set_group_hparams";
  return guarded(fn, [&]() -> zmuon::error {
    if (!eng || !values)
      return null_arg(fn, eng ? "values" : "eng");
    zmuon::group_hparams v;
    if (auto err = to_group(*eng->eng, *values, v))
      return {err.code(),
              std::string(fn) + ": group " + std::to_string(group) + ": " + err.message()};
    return eng->eng->set_group_hparams(group, v);
  });
}

static_assert(ZMUON_VARIANT_NORMUON == static_cast<int>(zmuon::muon_variant::normuon));

int zmuon_engine_set_group_rule(zmuon_engine* eng, int32_t group, const zmuon_group_hparams* values,
                                const zmuon_update_rule* rule) {
  const char* fn = "zmuon_engine_set_group_rule";
  return guarded(fn, [&]() -> zmuon::error {
    if (!eng || !values)
      return null_arg(fn, eng ? "values" : "eng");
    zmuon::group_hparams v;
    auto bad = [&](const zmuon::error& err) -> zmuon::error {
      return {err.code(),
              std::string(fn) + ": group " + std::to_string(group) + ": " + err.message()};
    };
    if (auto err = to_group(*eng->eng, *values, v))
      return bad(err);
    if (rule) {
      if (rule->variant != ZMUON_VARIANT_MUON && rule->variant != ZMUON_VARIANT_NORMUON)
        return bad({errc::invalid_argument, "variant must be 0 (muon) or 1 (normuon), got "
                                                + std::to_string(rule->variant)});
      if (rule->algorithm < 0 || rule->algorithm >= zmuon::kScalarAlgorithms)
        return bad({errc::invalid_argument,
                    "algorithm must be in [0, " + std::to_string(zmuon::kScalarAlgorithms)
                        + ") (zmuon_scalar_algorithm), got " + std::to_string(rule->algorithm)});
      v.muon.cautious_weight_decay = v.adamw.cautious_weight_decay =
          rule->cautious_weight_decay != 0;
      v.adamw.algorithm = static_cast<zmuon::scalar_algorithm>(rule->algorithm);
      v.muon.variant = static_cast<zmuon::muon_variant>(rule->variant);
      v.muon.normuon_beta2 = rule->normuon_beta2;
      v.muon.normuon_eps = rule->normuon_eps;
    }
    return eng->eng->set_group_hparams(group, v);
  });
}

int zmuon_engine_time_calls(zmuon_engine* eng, int32_t on) {
  const char* fn = "zmuon_engine_time_calls";
  return guarded(fn, [&]() -> zmuon::error {
    if (!eng)
      return null_arg(fn, "eng");
    eng->eng->time_backend_calls(on != 0);
    return {};
  });
}

int zmuon_engine_write_call_timeline(zmuon_engine* eng, const char* path) {
  const char* fn = "zmuon_engine_write_call_timeline";
  return guarded(fn, [&]() -> zmuon::error {
    if (!eng)
      return null_arg(fn, "eng");
    if (!path)
      return null_arg(fn, "path");
    return eng->eng->write_call_timeline(path);
  });
}

int zmuon_engine_save_checkpoint(zmuon_engine* eng, const char* dir) {
  const char* fn = "zmuon_engine_save_checkpoint";
  return guarded(fn, [&]() -> zmuon::error {
    if (!eng)
      return null_arg(fn, "eng");
    if (!dir)
      return null_arg(fn, "dir");
    return eng->eng->save_checkpoint(dir);
  });
}

int zmuon_engine_load_checkpoint(zmuon_engine* eng, const char* dir, uint64_t* step_out) {
  const char* fn = "zmuon_engine_load_checkpoint";
  return guarded(fn, [&]() -> zmuon::error {
    if (!eng)
      return null_arg(fn, "eng");
    if (!dir)
      return null_arg(fn, "dir");
    auto info = eng->eng->load_checkpoint(dir);
    if (!info)
      return info.err();
    if (step_out)
      *step_out = info->step;
    return {};
  });
}

// -- The optimizer state by parameter name ------------------------------------------------------

namespace {

/// The buffers of a zmuon_param_state, in the order of param_state's tensors.
std::array<float*, 4> buffers_of(const zmuon_param_state& p) {
  return {p.param, p.momentum, p.exp_avg, p.exp_avg_sq};
}
std::array<std::vector<float> zmuon::param_state::*, 4> tensors_of() {
  return {&zmuon::param_state::param, &zmuon::param_state::momentum, &zmuon::param_state::exp_avg,
          &zmuon::param_state::exp_avg_sq};
}
const char* const tensor_names[4] = {"param", "momentum", "exp_avg", "exp_avg_sq"};

zmuon::state_scope scope_of(int32_t scope) {
  return scope == ZMUON_STATE_LOCAL ? zmuon::state_scope::local : zmuon::state_scope::full;
}

zmuon::error bad_scope(const char* fn, int32_t scope) {
  if (scope == ZMUON_STATE_FULL || scope == ZMUON_STATE_LOCAL)
    return {};
  return {errc::invalid_argument, std::string(fn) + ": scope " + std::to_string(scope)
                                      + " (ZMUON_STATE_FULL or ZMUON_STATE_LOCAL)"};
}

}  // namespace

int zmuon_engine_state_range(zmuon_engine* eng, const char* name, int32_t scope, int64_t* offset,
                             int64_t* numel) {
  const char* fn = "zmuon_engine_state_range";
  return guarded(fn, [&]() -> zmuon::error {
    if (!eng || !name || !offset || !numel)
      return null_arg(fn, !eng ? "eng" : !name ? "name" : !offset ? "offset" : "numel");
    if (auto err = bad_scope(fn, scope))
      return err;
    if (auto err = eng->eng->start())
      return err;
    const zmuon::plan* pl = eng->eng->layout();
    const int k = pl->find(name);
    if (k < 0)
      return {errc::unknown_parameter, std::string(fn) + ": no parameter '" + name + "'"};
    std::pair<int64_t, int64_t> range{0, pl->params[k].numel};
    if (scope == ZMUON_STATE_LOCAL) {
      auto local = eng->eng->local_range(name);
      if (!local)
        return local.err();
      range = *local;
    }
    *offset = range.first;
    *numel = range.second - range.first;
    return {};
  });
}

int zmuon_engine_read_state(zmuon_engine* eng, int32_t scope, zmuon_param_state* params, size_t n,
                            zmuon_state_info* info) {
  const char* fn = "zmuon_engine_read_state";
  return guarded(fn, [&]() -> zmuon::error {
    if (!eng)
      return null_arg(fn, "eng");
    if (n > 0 && !params)
      return null_arg(fn, "params");
    if (auto err = bad_scope(fn, scope))
      return err;
    auto state = eng->eng->read_state(scope_of(scope));  // a collective: before any check
    if (!state)
      return state.err();
    std::map<std::string, const zmuon::param_state*> by_name;
    for (const auto& p : state->params)
      by_name[p.name] = &p;
    const auto tensors = tensors_of();
    std::vector<const zmuon::param_state*> found(n);
    for (size_t i = 0; i < n; ++i) {  // everything checked before anything is written
      if (!params[i].name)
        return {errc::invalid_argument,
                std::string(fn) + ": entry " + std::to_string(i) + " has a NULL name"};
      auto it = by_name.find(params[i].name);
      if (it == by_name.end())
        return {errc::unknown_parameter,
                std::string(fn) + ": no parameter '" + params[i].name + "'"};
      found[i] = it->second;
      const auto bufs = buffers_of(params[i]);
      for (size_t t = 0; t < 4; ++t) {
        if (!bufs[t])
          continue;
        const auto& v = found[i]->*tensors[t];
        if (v.empty())
          return {errc::invalid_argument, std::string(fn) + ": parameter '" + params[i].name
                                              + "' keeps no " + tensor_names[t]};
        if (static_cast<int64_t>(v.size()) != params[i].numel)
          return {errc::shape_mismatch, std::string(fn) + ": parameter '" + params[i].name
                                            + "': " + tensor_names[t] + " has "
                                            + std::to_string(v.size()) + " values, the buffer "
                                            + std::to_string(params[i].numel)};
      }
    }
    for (size_t i = 0; i < n; ++i) {
      const auto bufs = buffers_of(params[i]);
      for (size_t t = 0; t < 4; ++t)
        if (bufs[t])
          std::copy((found[i]->*tensors[t]).begin(), (found[i]->*tensors[t]).end(), bufs[t]);
      params[i].offset = found[i]->offset;
      params[i].adam_step = found[i]->adam_step;
    }
    if (info)
      *info = {state->step,
               state->adam_steps,
               state->scaler.scale,
               state->scaler.iter,
               state->scaler.last_overflow_iter,
               state->scaler.hysteresis_left};
    return {};
  });
}

namespace {

/// zmuon_engine_write_state's state, with row moments from `rows` (n_rows entries) when given.
zmuon::error write_state_of(const char* fn, zmuon_engine* eng, const zmuon_param_state* params,
                            size_t n, const zmuon_state_info* info, const zmuon_row_moments* rows,
                            size_t n_rows) {
  {
    if (!eng || !info)
      return null_arg(fn, eng ? "info" : "eng");
    if (n > 0 && !params)
      return null_arg(fn, "params");
    if (n_rows > 0 && !rows)
      return null_arg(fn, "rows");
    zmuon::optimizer_state state;
    state.step = info->step;
    state.adam_steps = info->adam_steps;
    state.scaler = {info->loss_scale, info->scaler_iter, info->scaler_last_overflow_iter,
                    info->scaler_hysteresis_left};
    const auto tensors = tensors_of();
    for (size_t i = 0; i < n; ++i) {
      if (!params[i].name)
        return {errc::invalid_argument,
                std::string(fn) + ": entry " + std::to_string(i) + " has a NULL name"};
      if (params[i].numel < 0)
        return {errc::invalid_argument, std::string(fn) + ": parameter '" + params[i].name
                                            + "' has numel " + std::to_string(params[i].numel)};
      zmuon::param_state p;
      p.name = params[i].name;
      p.offset = params[i].offset;
      p.adam_step = params[i].adam_step;
      const auto bufs = buffers_of(params[i]);
      for (size_t t = 0; t < 4; ++t)
        if (bufs[t])
          (p.*tensors[t]).assign(bufs[t], bufs[t] + params[i].numel);
      state.params.push_back(std::move(p));
    }
    for (size_t i = 0; i < n_rows; ++i) {
      if (!rows[i].name || (rows[i].rows > 0 && !rows[i].values) || rows[i].rows < 0)
        return {errc::invalid_argument, std::string(fn) + ": row-moment entry " + std::to_string(i)
                                            + " has a NULL name or values, or negative rows"};
      auto it = std::find_if(state.params.begin(), state.params.end(),
                             [&](const zmuon::param_state& p) { return p.name == rows[i].name; });
      if (it == state.params.end())
        return {errc::unknown_parameter, std::string(fn) + ": row moments of '" + rows[i].name
                                             + "', which the state does not list"};
      it->row_moments.assign(rows[i].values, rows[i].values + rows[i].rows);
    }
    return eng->eng->write_state(state);
  }
}

}  // namespace

int zmuon_engine_write_state(zmuon_engine* eng, const zmuon_param_state* params, size_t n,
                             const zmuon_state_info* info) {
  const char* fn = "zmuon_engine_write_state";
  return guarded(fn, [&]() { return write_state_of(fn, eng, params, n, info, nullptr, 0); });
}

int zmuon_engine_write_state_rows(zmuon_engine* eng, const zmuon_param_state* params, size_t n,
                                  const zmuon_state_info* info, const zmuon_row_moments* rows,
                                  size_t n_rows) {
  const char* fn = "zmuon_engine_write_state_rows";
  return guarded(fn, [&]() { return write_state_of(fn, eng, params, n, info, rows, n_rows); });
}

int zmuon_engine_read_row_moments(zmuon_engine* eng, zmuon_row_moments* entries, size_t n) {
  const char* fn = "zmuon_engine_read_row_moments";
  return guarded(fn, [&]() -> zmuon::error {
    if (!eng)
      return null_arg(fn, "eng");
    if (n > 0 && !entries)
      return null_arg(fn, "entries");
    auto state = eng->eng->read_state(zmuon::state_scope::full);  // a collective: first
    if (!state)
      return state.err();
    std::vector<const zmuon::param_state*> found(n);
    for (size_t i = 0; i < n; ++i) {  // everything checked before anything is written
      if (!entries[i].name)
        return {errc::invalid_argument,
                std::string(fn) + ": entry " + std::to_string(i) + " has a NULL name"};
      for (const auto& p : state->params)
        if (p.name == entries[i].name)
          found[i] = &p;
      if (!found[i])
        return {errc::unknown_parameter,
                std::string(fn) + ": no parameter '" + entries[i].name + "'"};
      const auto& v = found[i]->row_moments;
      if (v.empty())
        return {errc::invalid_argument, std::string(fn) + ": parameter '" + entries[i].name
                                            + "' keeps no row moments (an AdamW parameter)"};
      if (static_cast<int64_t>(v.size()) != entries[i].rows || !entries[i].values)
        return {errc::shape_mismatch, std::string(fn) + ": parameter '" + entries[i].name + "' has "
                                          + std::to_string(v.size())
                                          + " row moments, the entry holds "
                                          + std::to_string(entries[i].rows)};
    }
    for (size_t i = 0; i < n; ++i)
      std::copy(found[i]->row_moments.begin(), found[i]->row_moments.end(), entries[i].values);
    return {};
  });
}

// -- Newton-Schulz on its own ------------------------------------------------------------------

int zmuon_orthogonalizer_create(const char* backend, int32_t device, const char* ns_json,
                                zmuon_orthogonalizer** out) {
  const char* fn = "zmuon_orthogonalizer_create";
  return guarded(fn, [&]() -> zmuon::error {
    if (!out)
      return null_arg(fn, "out");
    *out = nullptr;
    if (!backend)
      return null_arg(fn, "backend");
    auto made = zmuon::orthogonalizer::create_from_json(backend, device, ns_json ? ns_json : "");
    if (!made)
      return made.err();
    *out = new zmuon_orthogonalizer{std::move(*made)};
    return {};
  });
}

int zmuon_orthogonalizer_set_options(zmuon_orthogonalizer* ns, const char* ns_json) {
  const char* fn = "zmuon_orthogonalizer_set_options";
  return guarded(fn, [&]() -> zmuon::error {
    if (!ns)
      return null_arg(fn, "ns");
    auto options = zmuon::parse_ns_options(ns_json ? ns_json : "");
    if (!options)
      return options.err();
    return ns->ortho.set_options(*options);
  });
}

void zmuon_orthogonalizer_destroy(zmuon_orthogonalizer* ns) {
  try {
    delete ns;
  } catch (...) {  // a destructor that throws must not cross the ABI
  }
}

namespace {

/// x as the orthogonalizer's matrix_batch: 2-d [rows, cols] or 3-d [batch, rows, cols].
zmuon::error batch_of(const char* fn, const zmuon_array* x, zmuon::matrix_batch& out) {
  if (!x)
    return null_arg(fn, "x");
  if (x->ndim != 2 && x->ndim != 3)
    return {errc::invalid_argument,
            std::string(fn) + ": x has " + std::to_string(x->ndim)
                + " dimensions; Newton-Schulz takes [rows, cols] or [batch, rows, cols]"};
  if (!x->shape)
    return null_arg(fn, "x->shape");
  if (x->dtype != ZMUON_FLOAT32 && x->dtype != ZMUON_BFLOAT16)
    return {errc::invalid_argument, std::string(fn) + ": x->dtype " + std::to_string(x->dtype)
                                        + " is not ZMUON_FLOAT32 (0) or ZMUON_BFLOAT16 (1)"};
  if (x->device < ZMUON_HOST)
    return {errc::invalid_argument, std::string(fn) + ": x->device " + std::to_string(x->device)
                                        + " is not ZMUON_HOST (-1) or a CUDA ordinal (>= 0)"};
  out.data = x->data;
  out.dtype = static_cast<zmuon::element_type>(x->dtype);
  out.batch = x->ndim == 3 ? x->shape[0] : 1;
  out.rows = x->shape[x->ndim - 2];
  out.cols = x->shape[x->ndim - 1];
  out.space = x->device == ZMUON_HOST ? zmuon::memory_space::host : zmuon::memory_space::cuda;
  out.device = x->device == ZMUON_HOST ? 0 : x->device;
  return {};
}

int orthogonalize(const char* fn, zmuon_orthogonalizer* ns, const zmuon_array* x,
                  std::optional<void*> cuda_stream) {
  return guarded(fn, [&]() -> zmuon::error {
    if (!ns)
      return null_arg(fn, "ns");
    zmuon::matrix_batch batch;
    if (auto err = batch_of(fn, x, batch))
      return err;
    return cuda_stream ? ns->ortho.run(batch, *cuda_stream) : ns->ortho.run(batch);
  });
}

}  // namespace

int zmuon_orthogonalize(zmuon_orthogonalizer* ns, const zmuon_array* x) {
  return orthogonalize("zmuon_orthogonalize", ns, x, std::nullopt);
}

int zmuon_orthogonalize_on_stream(zmuon_orthogonalizer* ns, const zmuon_array* x,
                                  void* cuda_stream) {
  return orthogonalize("zmuon_orthogonalize_on_stream", ns, x, cuda_stream);
}

}  // extern "C"

extern "C" {

int zmuon_engine_create_with_host(const char* config_json, const char* const* overrides,
                                  size_t n_overrides, const char* host_json, zmuon_engine** out) {
  const char* fn = "zmuon_engine_create_with_host";
  if (auto err = null_override(fn, overrides, n_overrides))
    return fail(err);
  return guarded(fn, [&]() -> zmuon::error {
    if (!out)
      return null_arg(fn, "out");
    *out = nullptr;
    zmuon::config_context context;
    context.host_values = host_json ? host_json : "";
    auto cfg = zmuon::parse_config_text(config_json ? config_json : "",
                                        override_list(overrides, n_overrides), context);
    if (!cfg)
      return cfg.err();
    auto made = zmuon::engine::create(cfg->engine);
    if (!made)
      return made.err();
    auto handle = std::make_unique<zmuon_engine>();
    handle->eng = std::move(*made);
    auto hooks = zmuon::job_hooks::make(*handle->eng, *cfg);
    if (!hooks)
      return hooks.err();
    handle->job = std::move(*hooks);
    *out = handle.release();
    return {};
  });
}

int zmuon_engine_notes(const zmuon_engine* eng, const char** out) {
  if (!eng || !out)
    return fail(null_arg("zmuon_engine_notes", eng ? "out" : "eng"));
  *out = eng->job ? eng->job->notes().c_str() : "";
  return ZMUON_OK;
}

int zmuon_engine_next_lrs(const zmuon_engine* eng, float* muon_lr, float* adam_lr) {
  if (!eng || !muon_lr || !adam_lr)
    return fail(null_arg("zmuon_engine_next_lrs", !eng ? "eng" : !muon_lr ? "muon_lr" : "adam_lr"));
  const auto lrs = eng->eng->next_lrs();
  *muon_lr = lrs[0];
  *adam_lr = lrs[1];
  return ZMUON_OK;
}

int zmuon_engine_set_metrics_callback(zmuon_engine* eng, zmuon_metrics_callback callback,
                                      void* user) {
  const char* fn = "zmuon_engine_set_metrics_callback";
  if (!eng)
    return fail(null_arg(fn, "eng"));
  if (!eng->job)
    return fail(zmuon::error{zmuon::errc::bad_state, std::string(fn)
                                                         + ": the engine was not made by "
                                                           "zmuon_engine_create_with_host"});
  eng->job->set_callback([callback, user](const std::string& record) {
    if (callback)
      callback(record.c_str(), user);
  });
  return ZMUON_OK;
}

int zmuon_engine_log_loss(zmuon_engine* eng, double loss) {
  if (!eng)
    return fail(null_arg("zmuon_engine_log_loss", "eng"));
  if (eng->job)
    eng->job->set_loss(loss);
  return ZMUON_OK;
}

}  // extern "C"
