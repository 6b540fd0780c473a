// zmuon-launch --local-nodes K: the K nodes of one job as K processes of this executable on
// 127.0.0.1, for tests and for users on one machine.
#pragma once

#include <string>
#include <vector>

namespace zmuon::example {

/// Starts node 0 with `--master 127.0.0.1:0` (a free port) and a rendezvous file, then, once it
/// listens, nodes 1..K-1 with the port it got. Each gets `args` (this process's arguments without
/// --local-nodes) plus --nodes/--node-rank/--master; --save-params goes to node 0 only. Prints
/// "zmuon-launch: node N pid P" for each. Waits for all; once one fails, the others get
/// `grace_ms` to end on their own (they notice the loss), then are killed. Never hangs.
/// Returns 0 when every node exits 0, else the first failure's exit code, or 3 (a node lost) when
/// the first to fail was killed by a signal.
/// `node_devices`, when not empty, holds each node's CUDA_VISIBLE_DEVICES (node_visible_devices):
/// node n runs with that value in its environment instead of the launcher's.
int run_local_nodes(int nodes, const std::vector<std::string>& args, long long join_timeout_ms,
                    long long grace_ms, const std::vector<std::string>& node_devices = {});

/// The GPUs of local node `node` of `nodes` that run `ranks_per_node` ranks each, as a
/// CUDA_VISIBLE_DEVICES value: the node-th run of ranks_per_node entries of `visible` (the
/// launcher's own CUDA_VISIBLE_DEVICES, comma-separated indices or UUIDs; null when unset: the
/// indices 0 .. device_count-1). Empty when there are fewer GPUs than ranks (the nodes then
/// share them, as the caf comm allows; the nccl comm refuses it by name).
std::string node_visible_devices(const char* visible, int device_count, int nodes,
                                 int ranks_per_node, int node);

/// `argv[1..]` without `--local-nodes K` / `--local-nodes=K`.
std::vector<std::string> args_without_local_nodes(int argc, char** argv);

}  // namespace zmuon::example
