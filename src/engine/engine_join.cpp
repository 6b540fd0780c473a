// engine::create_node: an embedder's process as one node of a multi-process job (torchrun and
// the like start the processes; zmuon-launch --nodes is the launcher's own way). The engine joins
// the job when it starts, with the parameter table registered by then, through the same node
// (rendezvous, supervisor, connected caf comms) that zmuon-launch uses.
#include "engine/impl.hpp"
#include "engine/job.hpp"
#include "node/node.hpp"

namespace zmuon {

expected<std::unique_ptr<engine>> engine::create_node(const engine_options& opts,
                                                      const join_options& join) {
  if (join.nodes < 1)
    return error{errc::invalid_argument,
                 "a job has at least one node (nodes is " + std::to_string(join.nodes) + ")"};
  if (join.node_rank < 0 || join.node_rank >= join.nodes)
    return error{errc::invalid_argument, "node rank " + std::to_string(join.node_rank)
                                             + " is outside [0, " + std::to_string(join.nodes)
                                             + ")"};
  if (join.ranks < 1 || join.ranks > kMaxRanksPerProcess)
    return error{errc::invalid_argument, "a process runs 1 to "
                                             + std::to_string(kMaxRanksPerProcess) + " ranks (got "
                                             + std::to_string(join.ranks) + ")"};
  auto master = parse_host_port(join.master);
  if (!master)
    return master.err();
  std::unique_ptr<engine> eng(new engine());
  auto& d = *eng->impl_;
  auto& job = *d.job;
  job.opts = opts;
  job.opts.world = join.ranks;  // the job's world once joined
  job.local = join.ranks;
  node_options nopts;
  nopts.nodes = join.nodes;
  nopts.node_rank = join.node_rank;
  nopts.master_host = master->first;
  nopts.master_port = master->second;
  nopts.ranks = join.ranks;
  nopts.rendezvous_file = join.rendezvous_file;
  nopts.host = join.host;
  nopts.join_timeout_ms = join.join_timeout_ms;
  nopts.heartbeat_timeout_ms = join.heartbeat_timeout_ms;
  nopts.quiet = true;
  choose_comm(nopts, opts.compute, opts.comm, opts.first_device);
  job.join_job = [&job, nopts,
                  secret = join.job](const std::vector<param_spec>& table) -> expected<node_setup> {
    auto joined = node::join(nopts, table_lines(table), secret);
    if (!joined)
      return joined.err();
    std::shared_ptr<node> nd(std::move(*joined));
    job.step_started = [nd](uint64_t step) { nd->step_started(step); };
    job.leave_job = [nd] { (void)nd->finish(); };
    return nd->setup();
  };
  return eng;
}

}  // namespace zmuon
