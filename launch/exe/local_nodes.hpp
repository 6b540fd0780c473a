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
/// Returns 0 when every node exits 0, else the first failure's exit code (128 + signal if
/// killed).
int run_local_nodes(int nodes, const std::vector<std::string>& args, long long join_timeout_ms,
                    long long grace_ms);

/// `argv[1..]` without `--local-nodes K` / `--local-nodes=K`.
std::vector<std::string> args_without_local_nodes(int argc, char** argv);

}  // namespace zmuon::example
