// The C ABI: checkpoints, and the optimizer state by parameter name.
#include "embed/c_api.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <string>

#include "plan/plan.hpp"

using namespace zmuon::c_abi;
using zmuon::errc;

extern "C" {

int zmuon_engine_save_checkpoint(zmuon_engine* eng, const char* dir) {
  const char* fn = "zmuon_engine_save_checkpoint";
  return on_engine(fn, eng, [&]() -> zmuon::error {
    if (!dir)
      return null_arg(fn, "dir");
    return eng->eng->save_checkpoint(dir);
  });
}

int zmuon_engine_load_checkpoint(zmuon_engine* eng, const char* dir, uint64_t* step_out) {
  const char* fn = "zmuon_engine_load_checkpoint";
  return on_engine(fn, eng, [&]() -> zmuon::error {
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
  return on_engine(fn, eng, [&]() -> zmuon::error {
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
  return on_engine(fn, eng, [&]() -> zmuon::error {
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

}  // extern "C"
