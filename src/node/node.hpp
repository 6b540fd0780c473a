// One node of a multi-process job (zmuon-launch --nodes N --node-rank R --master HOST:PORT): the
// node's actor system with CAF's middleman, its ranks' comm actors, the rendezvous (node 0
// publishes it, every node joins it) and the node supervisor. What comes out is a node_setup for
// engine::create: this node's ranks, connected to every other node's.
//
//   auto n = node::join(opts, table_lines, job_json);   // blocks until every node has joined
//   auto eng = engine::create(engine_opts_with((*n)->world()), (*n)->setup());
//   ... each step: (*n)->step_started(s); ...
//   (*n)->finish();                                      // barrier: every node is done
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "node/node_setup.hpp"
#include "node/tls_credentials.hpp"
#include "zmuon/param.hpp"
#include "zmuon/status.hpp"

namespace zmuon {

struct node_options {
  int nodes = 1;
  int node_rank = 0;
  std::string master_host = "127.0.0.1";
  uint16_t master_port = 0;     // node 0 with port 0: a free port, printed and written to the file
  int ranks = 1;                // ranks this node runs
  std::string rendezvous_file;  // node 0 writes "HOST:PORT" here once it listens (--local-nodes)
  int64_t join_timeout_ms = 60'000;
  int64_t heartbeat_timeout_ms = 10'000;
  bool quiet = false;  // no "listening on" line, no line per node that arrives
  /// Where the other nodes reach this one directly (jobs of three or more nodes; node 0 is
  /// reached at --master). Empty: $ZMUON_NODE_HOST, else the master's host when that is a
  /// loopback address (every node on one machine), else this machine's host name. A node that
  /// cannot be reached there is reached through node 0 (with a warning).
  std::string host;
  /// Node 0 only, for the nccl comm backend: makes the unique id (the bytes of ncclGetUniqueId)
  /// that the rendezvous hands to every node (node_setup::nccl_unique_id).
  std::function<std::string()> nccl_unique_id;
  /// Node 0 only (comm "auto"): make that id only if every rank of the job has a GPU of its own
  /// (every node's `gpus` one per rank, no GPU listed twice); otherwise the job runs caf.
  bool nccl_only_on_own_gpus = false;
  /// The GPUs this node's ranks would run on under nccl (join_request::gpus).
  std::vector<std::string> gpus;
  /// TLS with mutual authentication from `secret` (docs/SECURITY.md), or plain TCP where asked
  /// for. An empty secret: $ZMUON_JOB_SECRET, else the file $ZMUON_JOB_SECRET_FILE, else plain
  /// TCP if $ZMUON_INSECURE says so, else join refuses to start. A secret too easy to guess is
  /// refused (check_job_secret) unless `weak_secret_ok` or $ZMUON_WEAK_SECRET_OK=1.
  node_transport transport = node_transport::tls;
  std::string secret;
  std::string secret_from;      // where `secret` came from, for messages ("the file 'F'")
  bool weak_secret_ok = false;  // --weak-secret-ok
  test_certificate certificate = test_certificate::valid;  // tests only: a bad certificate
};

/// The scheduler threads of a node of `ranks` ranks: at least the cores, two a rank (a rank's
/// coordinator and store may both compute inside handlers, the host backend's NS for seconds),
/// plus two, so that the node supervisor's heartbeats always find a free thread.
size_t node_scheduler_threads(int ranks);

class node {
public:
  /// Starts the actor system, publishes the rendezvous (node 0), joins it with this node's
  /// parameter table (one line per parameter) and job config (JSON, equal on every node) and
  /// starts the supervisor. Errors: the rendezvous cannot be published or reached in time, or
  /// the nodes disagree (the message names the first difference).
  static expected<std::unique_ptr<node>> join(const node_options& opts,
                                              const std::vector<std::string>& table,
                                              const std::string& job);
  ~node();
  node(const node&) = delete;
  node& operator=(const node&) = delete;

  node_setup setup() const;
  int world() const;
  /// "node 1 (ranks 2-3)"
  std::string name() const;
  /// Why the job ended, once it has (a lost node); readable from any thread.
  std::shared_ptr<const job_end> end() const;

  /// Tells the supervisor (and, through heartbeats, the other nodes) the step this node is in.
  void step_started(uint64_t step);

  /// After an error of the host loop: the loss of another node that caused it (waiting a moment
  /// for it to be noticed); otherwise "" and the other nodes are told that this node failed.
  std::string explain_failure(const std::string& own_error);

  /// The end-of-job barrier: returns once every node has called it, or with the error of a lost
  /// node.
  error finish();

private:
  node();
  struct impl;
  std::unique_ptr<impl> impl_;
};

/// The parameter table as the rendezvous compares it: one line per parameter
/// ("fc1.weight [128, 64] automatic, heads 0").
std::vector<std::string> table_lines(const std::vector<param_spec>& table);

/// Sets `opts` up for the job's compute backend and comm (`opts.ranks` set): on cuda under comm
/// nccl or auto, node 0 makes the NCCL id (for auto only when every rank of the job has a GPU of
/// its own) and the node brings the GPUs its ranks would use (compute_device_ids from
/// `first_device` on). Nothing otherwise, or without NCCL built in.
void choose_comm(node_options& opts, const std::string& compute, const std::string& comm,
                 int first_device);

/// Whether a TCP connection to host:port opens within `timeout` (it is closed at once): a door
/// behind a firewall that drops the handshake costs this long, not the system's minutes.
bool tcp_reachable(const std::string& host, uint16_t port, std::chrono::milliseconds timeout);

/// "HOST:PORT" -> host and port (0..65535); an error names what is wrong.
expected<std::pair<std::string, uint16_t>> parse_host_port(const std::string& text);

}  // namespace zmuon
