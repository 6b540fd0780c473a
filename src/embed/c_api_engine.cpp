// The C ABI: an engine made, started and ended; its parameters registered.
#include "embed/c_api.hpp"

#include <string>
#include "config/config.hpp"
#include "plan/plan.hpp"

using namespace zmuon::c_abi;
using zmuon::errc;

extern "C" {

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
  return on_engine(fn, eng, [&]() -> zmuon::error { return eng->eng->start(); });
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
  return on_engine(fn, eng, [&]() -> zmuon::error {
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

}  // extern "C"
