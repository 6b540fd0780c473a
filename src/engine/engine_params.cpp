// engine::parameters / gather_params: the full parameters out of the ranks' shards, into a
// tensor_map or the caller's buffers (host, or device buffers on the cuda backend; in one process
// straight from the stores' buffers, in a multi-process job over the ranks' NCCL comms into
// device buffers or else over the caf comms: engine_collectives.cpp).
#include <algorithm>
#include <cstring>
#include <optional>

#include "engine/impl.hpp"
#include "engine/job.hpp"
#include "engine/registry.hpp"
#include "engine/views.hpp"
#include "plan/ownership.hpp"

namespace zmuon {

namespace {

/// The caller's buffers by parameter index (index_views's), and how to order the copies.
struct targets {
  std::vector<float*> at;  // null: not asked for
  std::vector<bool> on_device;
  std::vector<bool> whole;  // the whole tensor, else one rank's shard
  std::optional<void*> caller_stream;
  bool ordered = false;  // device buffers written in the caller's stream order

  bool any(bool device) const {
    return std::find(on_device.begin(), on_device.end(), device) != on_device.end();
  }
};

/// gather_params in a multi-process job, a collective: every process calls it. Where every
/// process asks for every parameter into device buffers and the ranks run nccl, the shards go
/// there over NCCL; otherwise over the caf comms, through host memory.
error gather_over_nodes(engine& eng, engine_job& job, const plan& pl, const targets& t) {
  const bool every_on_device =
      std::find(t.at.begin(), t.at.end(), nullptr) == t.at.end() && !t.any(false);
  auto votes = eng.sum_over_nodes({every_on_device && !job.rank_comms.empty() ? 1.0 : 0.0});
  if (!votes)
    return votes.err();
  if ((*votes)[0] == static_cast<double>(job.node_first_ranks.size()))
    return job.gather_over_nccl(pl, t.at, t.caller_stream);
  auto full = job.gather_between_nodes(pl);
  if (!full)
    return full.err();
  return on_backend("gather_params", job.first_rank, [&] {
    compute_backend& be = *job.ranks[0].backend;
    if (t.ordered)  // the caller's queued work reads the old values first
      be.wait_for_stream(*t.caller_stream);
    for (size_t i = 0; i < pl.params.size(); ++i) {
      if (!t.at[i])
        continue;
      const std::vector<float>& v = full->at(pl.params[i].name);
      if (t.on_device[i])
        be.copy_from_host(t.at[i], v.data(), static_cast<int64_t>(v.size()));
      else
        std::memcpy(t.at[i], v.data(), v.size() * sizeof(float));
    }
    be.synchronize();
  });
}

/// Rank `r`'s shard of every asked parameter copied out of its store into `t`.
error copy_shard(engine_job& job, const plan& pl, const targets& t, int r) {
  const int local = r - job.first_rank;
  std::vector<float> shard;
  float_view device_shard;  // the store's own buffer, when a device buffer is asked for
  if (t.any(true)) {
    auto view = job.ask<float_view>(job.ranks[local].store, params_view_atom::value);
    if (!view)
      return view.err();
    device_shard = *view;
  }
  if (t.any(false)) {
    auto host = job.ask<std::vector<float>>(job.ranks[local].store, params_atom::value);
    if (!host)
      return host.err();
    shard = std::move(*host);
  }
  compute_backend& be = *job.ranks[local].backend;
  return on_backend("gather_params", r, [&] {
    std::vector<copy_span> spans;  // to device buffers: one copy_spans call
    for (size_t i = 0; i < pl.params.size(); ++i) {
      const auto& p = pl.params[i];
      int64_t n = valid_len(p, r);
      if (!t.at[i] || n <= 0)
        continue;
      float* to = t.at[i] + (t.whole[i] ? r * p.shard_len : 0);
      if (t.on_device[i])
        spans.push_back({device_shard.data + p.shard_offset, to, n});
      else
        std::memcpy(to, shard.data() + p.shard_offset, n * sizeof(float));
    }
    if (!t.ordered) {
      be.copy_spans(spans);
      be.synchronize();  // the caller may use its buffers when this returns
      return;
    }
    // Between the caller's work on its stream: after what is queued there (which may still
    // read the old values), before what is queued there next. No waiting on the host.
    be.wait_for_stream(*t.caller_stream);
    be.copy_spans(spans);
    be.make_stream_wait(*t.caller_stream);
  });
}

}  // namespace

expected<tensor_map> engine::parameters() {
  auto& d = *impl_;
  auto& job = *d.job;
  auto& reg = *d.registry;
  if (auto err = d.start())
    return err;
  if (job.multi_node())
    return job.gather_between_nodes(*reg.pl);
  tensor_map out;
  std::vector<tensor_span> spans;
  for (const auto& p : reg.pl->params) {
    auto& v = out[p.name];
    v.resize(p.numel);
    spans.push_back({p.name, v.data(), p.numel});
  }
  if (auto err = gather_params(spans))
    return err;
  return out;
}

error engine::gather_params(const std::vector<tensor_span>& out) {
  return gather_params_on(out, std::nullopt);
}

error engine::gather_params(const std::vector<tensor_span>& out, void* cuda_stream) {
  return gather_params_on(out, cuda_stream);
}

error engine::shard_params(int rank, const std::vector<tensor_span>& out) {
  return gather_params_on(out, std::nullopt, rank);
}

error engine::shard_params(int rank, const std::vector<tensor_span>& out, void* cuda_stream) {
  return gather_params_on(out, cuda_stream, rank);
}

expected<tensor_span> engine::master_of(const std::string& name) {
  auto& d = *impl_;
  auto& job = *d.job;
  if (auto err = d.start())
    return err;
  const auto& pl = *d.registry->pl;
  const int i = pl.find(name);
  if (i < 0)
    return error{errc::unknown_parameter, "master_of(): no parameter '" + name + "'"};
  if (job.local != 1)
    return error{errc::unsupported, "master_of(): this process runs " + std::to_string(job.local)
                                        + " ranks: the master of '" + name
                                        + "' has no one place in it"};
  const int rank = job.first_rank;
  auto view = job.ask<float_view>(job.ranks[0].store, params_view_atom::value);
  if (!view)
    return view.err();
  const compute_backend& be = *job.ranks[0].backend;
  const auto& p = pl.params[i];
  tensor_span out{name, view->data + p.shard_offset, valid_len(p, rank)};
  if (be.device_memory()) {
    out.space = memory_space::cuda;
    out.device = be.device();
  }
  return out;
}

error engine::load_shard_params(int rank, const std::vector<tensor_view>& in) {
  auto& d = *impl_;
  auto& job = *d.job;
  auto& reg = *d.registry;
  if (auto err = d.start())
    return err;
  const auto& pl = *reg.pl;
  if (rank < job.first_rank || rank >= job.first_rank + job.local)
    return {errc::invalid_argument, "load_shard_params(): rank " + std::to_string(rank)
                                        + " is not one of this process's ranks ["
                                        + std::to_string(job.first_rank) + ", "
                                        + std::to_string(job.first_rank + job.local) + ")"};
  std::vector<const float*> source;
  std::vector<bool> on_device, whole;
  if (auto err =
          index_views(pl, job.opts, in, "values of", "values for", source, on_device, rank, &whole))
    return err;
  for (size_t i = 0; i < pl.params.size(); ++i)
    if (on_device[i])
      return {errc::unsupported, "load_shard_params(): the values of '" + pl.params[i].name
                                     + "' are in device memory: give host memory"};
  const auto& store = job.ranks[rank - job.first_rank].store;
  auto shard = job.ask<std::vector<float>>(store, params_atom::value);
  if (!shard)
    return shard.err();
  for (size_t i = 0; i < pl.params.size(); ++i) {
    const auto& p = pl.params[i];
    const int64_t n = valid_len(p, rank);
    if (source[i] && n > 0)
      std::memcpy(shard->data() + p.shard_offset, source[i] + (whole[i] ? rank * p.shard_len : 0),
                  n * sizeof(float));
  }
  auto values = std::make_shared<std::vector<float>>(std::move(*shard));
  auto done = job.ask<ack>(store, load_params{job.step, std::move(values)});
  return done ? error{} : done.err();
}

error engine::gather_params_on(const std::vector<tensor_span>& out,
                               std::optional<void*> caller_stream, int shard_of) {
  auto& d = *impl_;
  auto& job = *d.job;
  if (auto err = d.start())
    return err;
  const auto& pl = *d.registry->pl;
  const bool one_shard = shard_of >= 0;
  if (one_shard && (shard_of < job.first_rank || shard_of >= job.first_rank + job.local))
    return {errc::invalid_argument, "shard_params(): rank " + std::to_string(shard_of)
                                        + " is not one of this process's ranks ["
                                        + std::to_string(job.first_rank) + ", "
                                        + std::to_string(job.first_rank + job.local) + ")"};
  // 1. Everything is checked before anything is written.
  targets t;
  if (auto err = index_views(pl, job.opts, out, "buffer for", "buffer for", t.at, t.on_device,
                             shard_of, &t.whole))
    return err;
  for (size_t i = 0; one_shard && i < pl.params.size(); ++i)
    if (t.at[i] && t.whole[i] && valid_len(pl.params[i], shard_of) != pl.params[i].numel)
      return {errc::shape_mismatch,
              "shard_params(): the buffer for '" + pl.params[i].name
                  + "' has the whole tensor's size; it takes rank " + std::to_string(shard_of)
                  + "'s shard, " + std::to_string(valid_len(pl.params[i], shard_of)) + " elements"};
  t.caller_stream = caller_stream;
  t.ordered = caller_stream && t.any(true);
  for (int i = 0; t.ordered && i < job.local; ++i)  // before anything is read or written
    if (auto err = job.ranks[i].backend->check_caller_stream(*caller_stream))
      return {err.code(),
              "gather_params(): rank " + std::to_string(job.first_rank + i) + ": " + err.message()};
  // 2. Over the processes (a collective), or each asked rank's shard copied out of its store.
  if (job.multi_node() && !one_shard)
    return gather_over_nodes(*this, job, pl, t);
  for (int r = one_shard ? shard_of : 0; r < (one_shard ? shard_of + 1 : pl.world); ++r)
    if (auto err = copy_shard(job, pl, t, r))
      return err;
  return {};
}
}  // namespace zmuon
