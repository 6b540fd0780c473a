// The C ABI: a Python host's hooks: an engine from the host's values, its config notes, the next
// learning rates, the metrics callback and the loss.
#include "embed/c_api.hpp"

#include <string>
#include "config/config.hpp"

using namespace zmuon::c_abi;
using zmuon::errc;

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
