// The host's collectives between the processes of a multi-process job (engine_job's
// gather_between_nodes behind parameters(), and sum_over_nodes), over the ranks' caf comms; and
// gather_params' all-to-all into device buffers over the ranks' NCCL comms.
#include <cstring>

#include "engine/impl.hpp"
#include "engine/job.hpp"
#include "engine/views.hpp"
#include "plan/ownership.hpp"

namespace zmuon {

error engine_job::shards_to_node_leaders(const plan& p, const std::vector<comm_actor>& via,
                                         const std::vector<float*>& shards,
                                         const std::vector<float*>& target,
                                         const keep_alive& owner) {
  auto is_leader = [&](int rank) {
    return std::find(node_first_ranks.begin(), node_first_ranks.end(), rank)
           != node_first_ranks.end();
  };
  collective_tag tag{collective_kind::params, step, 0, host_collectives++};
  caf::scoped_actor self{*sys};
  using handle = decltype(self->request(via[0], timeout(), all_to_all_req{}));
  std::vector<handle> pending;
  for (int i = 0; i < local; ++i) {
    all_to_all_req req{tag, std::vector<std::vector<segment>>(p.world),
                       std::vector<std::vector<segment>>(p.world)};
    for (size_t k = 0; k < p.params.size(); ++k)
      for (int peer = 0; peer < p.world && target[k]; ++peer) {
        const auto& q = p.params[k];
        int64_t n = valid_len(q, first_rank + i);
        if (n > 0 && is_leader(peer))
          req.sends[peer].push_back(segment{shards[i] + q.shard_offset, n, nullptr, owner});
        int64_t m = valid_len(q, peer);
        if (m > 0 && i == 0)
          req.recvs[peer].push_back(segment{target[k] + peer * q.shard_len, m, nullptr, owner});
      }
    pending.push_back(self->request(via[i], timeout(), std::move(req)));
  }
  error failed;
  for (auto& h : pending)
    h.receive([](comm_done&) {},
              [&](caf::error& err) {
                if (!failed)
                  failed = from_caf_error(err);
              });
  return failed;
}

expected<tensor_map> engine_job::gather_between_nodes(const plan& pl) {
  // The stores' shards and the full parameters, in host memory shared with the requests: after a
  // timeout the comms may still hold them (and write what arrives late).
  struct buffers {
    std::vector<std::vector<float>> shards, full;
  };
  auto bufs = std::make_shared<buffers>();
  std::vector<float*> shards;
  for (auto& r : ranks) {
    auto shard = ask<std::vector<float>>(r.store, params_atom::value);
    if (!shard)
      return shard.err();
    bufs->shards.push_back(std::move(*shard));
    shards.push_back(bufs->shards.back().data());
  }
  std::vector<float*> target;
  for (const auto& q : pl.params) {
    bufs->full.emplace_back(q.numel);
    target.push_back(bufs->full.back().data());
  }
  if (auto err = shards_to_node_leaders(pl, comms, shards, target, bufs))
    return err;
  tensor_map out;  // every comm has answered: nothing writes the buffers any more
  for (size_t k = 0; k < pl.params.size(); ++k)
    out[pl.params[k].name] = std::move(bufs->full[k]);
  return out;
}

error engine_job::gather_over_nccl(const plan& pl, const std::vector<float*>& target,
                                   std::optional<void*> caller_stream) {
  std::vector<float*> shards;  // the stores' own device buffers
  for (auto& r : ranks) {
    auto view = ask<float_view>(r.store, params_view_atom::value);
    if (!view)
      return view.err();
    shards.push_back(view->data);
  }
  // The buffers may still be read by the caller's queued work: the copies wait for it.
  for (int i = 0; caller_stream && i < local; ++i)
    if (auto err = on_backend("gather_params", first_rank + i,
                              [&] { ranks[i].backend->wait_for_stream(*caller_stream); }))
      return err;
  if (auto err = shards_to_node_leaders(pl, rank_comms, shards, target, nullptr))
    return err;
  // Enqueued on the ranks' streams: the caller's buffers are written once they have run.
  for (int i = 0; i < local; ++i)
    if (auto err = on_backend("gather_params", first_rank + i, [&] {
          if (!caller_stream)
            ranks[i].backend->synchronize();
          else if (i == 0)
            ranks[i].backend->make_stream_wait(*caller_stream);
        }))
      return err;
  return {};
}

expected<std::vector<double>> engine::sum_over_nodes(const std::vector<double>& values) {
  auto& d = *impl_;
  auto& job = *d.job;
  if (!job.multi_node())
    return values;
  if (auto err = d.start())
    return err;
  // The first local rank contributes the values, the others zeros.
  collective_tag tag{collective_kind::host, job.step, 0, job.host_collectives++};
  caf::scoped_actor self{*job.sys};
  using handle = decltype(self->request(job.comms[0], job.timeout(), all_reduce_req{}));
  std::vector<handle> pending;
  for (int i = 0; i < job.local; ++i)
    pending.push_back(
        self->request(job.comms[i], job.timeout(),
                      all_reduce_req{tag, reduce_op::sum,
                                     i == 0 ? values : std::vector<double>(values.size(), 0.0)}));
  std::vector<double> sum;
  error failed;
  for (size_t i = 0; i < pending.size(); ++i)
    pending[i].receive(
        [&](all_reduce_result& res) {
          if (i == 0)
            sum = std::move(res.values);
        },
        [&](caf::error& err) {
          if (!failed)
            failed = from_caf_error(err);
        });
  if (failed)
    return failed;
  return sum;
}

}  // namespace zmuon
