// zmuon-launch: the main job. Trains the example model on synthetic data on the CPU backend,
// with N in-process ranks, or as one node of a multi-process job (--nodes, --node-rank, --master;
// --local-nodes K runs K nodes on 127.0.0.1), and shows each step. Options: defaults < --config
// FILE < --set key.path=value < flags (config/config.hpp).
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <unistd.h>
#include <CLI/CLI.hpp>

#include "base/log.hpp"
#include "checkpoint/safetensors.hpp"
#include "config/cli_hints.hpp"
#include "config/config.hpp"
#include "kernels/compute.hpp"
#include "node/node.hpp"
#include "node/node_setup.hpp"
#include "step_report.hpp"
#include "zmuon-launch/faults.hpp"
#include "zmuon-launch/local_nodes.hpp"
#include "zmuon-launch/progress.hpp"
#include "zmuon-launch/train.hpp"
#include "zmuon/version.hpp"

namespace {

// Whether the rank count was chosen: a --ranks/--ranks-per-node flag or --set (both arrive as
// zmuon.ranks overrides) or zmuon.ranks in the config file.
bool ranks_given(const std::string& config_path, const std::vector<std::string>& sets) {
  for (const auto& s : sets)
    if (s.rfind("zmuon.ranks=", 0) == 0)
      return true;
  if (config_path.empty())
    return false;
  auto j = zmuon::read_json_file(config_path);  // a bad file: the config's own check says why
  return j && j->is_object() && j->contains("zmuon") && (*j)["zmuon"].is_object()
         && (*j)["zmuon"].contains("ranks");
}

// The launcher's own defaults, over job_config's and under any config file: the example model
// trains with AdamW lr 3e-3 (docs/DECISIONS.md; the engine's default is 3e-4), unless the file or
// an override gives lr or adam_lr (DeepSpeed's lr is both groups').
nlohmann::json launcher_defaults(const std::string& config_path = "",
                                 const std::vector<std::string>& sets = {}) {
  for (const auto& s : sets)
    if (s.rfind("optimizer.params.lr=", 0) == 0 || s.rfind("optimizer.params.adam_lr=", 0) == 0)
      return nlohmann::json::object();
  if (!config_path.empty())
    if (auto j = zmuon::read_json_file(config_path); j && j->is_object()) {
      const auto* p = j->contains("optimizer") && (*j)["optimizer"].is_object()
                              && (*j)["optimizer"].contains("params")
                          ? &(*j)["optimizer"]["params"]
                          : nullptr;
      if (p && p->is_object() && (p->contains("lr") || p->contains("adam_lr")))
        return nlohmann::json::object();
    }
  return {{"optimizer", {{"params", {{"adam_lr", 3e-3}}}}}};
}

// CLI::NonNegativeNumber's message prints DBL_MAX in full.
const CLI::Validator non_negative(
    [](std::string& text) {
      double x = std::strtod(text.c_str(), nullptr);  // not a number: the conversion reports it
      return x >= 0 || std::isnan(x) ? std::string() : "must be >= 0, got " + text;
    },
    "NONNEGATIVE");

// CLI::PositiveNumber's likewise.
const CLI::Validator positive(
    [](std::string& text) {
      double x = std::strtod(text.c_str(), nullptr);
      return x > 0 || std::isnan(x) ? std::string() : "must be > 0, got " + text;
    },
    "POSITIVE");

// A uint64_t flag: CLI11 takes -1 (wrapped) and 2^64 (saturated) for one.
const CLI::Validator whole_u64(
    [](std::string& text) {
      errno = 0;
      const bool digits =
          !text.empty() && text.size() <= 20
          && std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
      if (digits)
        std::strtoull(text.c_str(), nullptr, 10);
      return digits && errno != ERANGE
                 ? std::string()
                 : "must be a whole number from 0 to 18446744073709551615, got " + text;
    },
    "UINT64");

// Exit codes: 2 for bad input (flags, config, nodes that disagree, a listener that refuses this
// node's credentials), 3 when a node of the job was lost, 1 for other failures.
constexpr int exit_bad_input = 2;
constexpr int exit_node_lost = 3;

/// The multi-process flags.
struct node_flags {
  int nodes = 1;
  int node_rank = 0;
  std::string master = "127.0.0.1:29500";
  int local_nodes = 0;
  std::string rendezvous_file;
  std::string host;  // node_options::host
  std::string secret_file;
  bool weak_secret_ok = false;  // node_options::weak_secret_ok
  bool insecure = false;
  bool insecure_any_host = false;
  std::string test_certificate;  // tests: "expired" or "foreign" (node_options::certificate)
};

/// An error on stderr, after the prefix the launcher set ("zmuon-launch[node 1]: ").
void say(const std::string& what) {
  ZMUON_LOG_ERROR(what);
}

/// How long a node's process may still run once the job lost a node (its loop unblocks at once:
/// the collectives in flight fail) before the launcher ends it.
constexpr std::chrono::seconds loss_grace{5};

/// The exit code run_node_job decided, or -1 while it runs.
std::atomic<int> node_exit_code{-1};

/// Ends the process should it still run `loss_grace` after the job ended (`end` set: a node was
/// lost), with the code decided by then, else 3. The library never ends the process; the
/// launcher does, so that a call still blocked somewhere never becomes a hang.
void end_process_after_loss(std::shared_ptr<const zmuon::job_end> end) {
  std::thread([end = std::move(end)] {
    while (end->wait(std::chrono::hours(1)).empty()) {
    }
    std::this_thread::sleep_for(loss_grace);
    const int decided = node_exit_code.load();
    say("still running " + std::to_string(loss_grace.count()) + " s after the job ended; exiting");
    std::fflush(nullptr);
    std::_Exit(decided >= 0 ? decided : exit_node_lost);
  }).detach();
}

int save(zmuon::engine& eng, const zmuon::example::train_options& topts, const std::string& path) {
  auto params = eng.parameters();  // a collective on a node: every node calls it
  if (!params) {
    say(params.err().to_string());
    return 1;
  }
  if (path.empty())
    return 0;
  std::vector<zmuon::named_tensor> tensors;
  for (const auto& spec : zmuon::example::param_table(topts.model))
    tensors.push_back({spec.name, spec.shape, params->at(spec.name)});
  if (auto err = zmuon::write_safetensors(path, tensors, {{"producer", "zmuon-launch"}})) {
    say(err.to_string());
    return 1;
  }
  std::printf("saved %zu parameters to %s\n", tensors.size(), path.c_str());
  return 0;
}

/// What each checkpoint records of the job, and what a resume compares with the saved run's.
std::string checkpoint_settings(const zmuon::job_config& job,
                                const zmuon::example::train_options& topts) {
  const nlohmann::json settings{{"config", zmuon::config_json(job)}, {"seed", topts.seed}};
  return settings.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

/// Restores the checkpoint in `dir` (every node of a job calls it: it is a collective there);
/// `lead` says from where, and names each setting that differs from the saved run's: allowed (a
/// new learning rate, another world size), but said, since a different seed, for one, means
/// other data from here on than the saved run would have seen. Returns the exit status on
/// failure, 0 on success; a fault flag whose step the resumed run has passed is bad input.
int resume_from(zmuon::engine& eng, const std::string& dir, const std::string& settings, bool lead,
                int steps) {
  auto info = eng.load_checkpoint(dir);
  if (!info) {
    say("cannot resume: " + info.err().to_string());
    return 1;
  }
  if (auto err = zmuon::example::check_faults_after_resume(zmuon::armed_faults(eng), info->step)) {
    say(err.message());
    return exit_bad_input;
  }
  if (!lead)
    return 0;
  std::printf("resumed from %s at step %llu (saved by %d ranks)\n", info->path.c_str(),
              static_cast<unsigned long long>(info->step), info->world);
  std::fflush(stdout);                                          // before the notes on stderr
  const auto saved = zmuon::parse_json_text(info->config, "");  // the manifest's: user input
  if (saved && saved->is_object())
    for (const std::string& change : zmuon::json_changes(*saved, nlohmann::json::parse(settings)))
      ZMUON_LOG_WARN("resuming with a setting the saved run did not have: " + change);
  if (info->step >= static_cast<uint64_t>(steps))
    ZMUON_LOG_WARN("the checkpoint is at step " + std::to_string(info->step) + " and --steps is "
                   + std::to_string(steps) + ": no step is left to train");
  return 0;
}

/// One node of a multi-process job. The node and the engine are the caller's, so that it can
/// guard their shutdown.
int run_node_job(const zmuon::job_config& job, zmuon::example::train_options topts,
                 const node_flags& nf, const std::string& save_params, const std::string& resume,
                 std::unique_ptr<zmuon::node>& nd, std::unique_ptr<zmuon::engine>& eng) {
  auto master = zmuon::parse_host_port(nf.master);
  if (!master) {
    say(master.err().message());
    return exit_bad_input;
  }
  zmuon::node_options nopts;
  nopts.nodes = nf.nodes;
  nopts.node_rank = nf.node_rank;
  nopts.master_host = master->first;
  nopts.master_port = master->second;
  nopts.ranks = job.engine.world;
  auto secret = zmuon::read_job_secret(nf.secret_file);
  if (!secret) {
    say(secret.err().message());
    return exit_bad_input;
  }
  nopts.secret = *secret;
  nopts.secret_from = zmuon::job_secret_source(nf.secret_file);
  nopts.weak_secret_ok = nf.weak_secret_ok;
  if (nf.insecure || nf.insecure_any_host)
    nopts.transport = nf.insecure_any_host ? zmuon::node_transport::insecure_any_host
                                           : zmuon::node_transport::insecure_loopback;
  if (nf.test_certificate == "expired")
    nopts.certificate = zmuon::test_certificate::expired;
  else if (nf.test_certificate == "foreign")
    nopts.certificate = zmuon::test_certificate::foreign_ca;
  nopts.rendezvous_file = nf.rendezvous_file;
  nopts.host = nf.host;
  nopts.join_timeout_ms = job.engine.timeout_ms;
  nopts.heartbeat_timeout_ms = job.heartbeat_timeout_ms;
  zmuon::choose_comm(nopts, job.engine.compute, job.engine.comm, job.engine.first_device);
  // What every node must agree on: the config (but this node's rank count) and the host loop
  // (a resume is a collective: every node loads the checkpoint, or none).
  auto agreed = zmuon::config_json(job);
  agreed["zmuon"].erase("ranks");
  agreed["launch"] = {{"steps", topts.steps}, {"seed", topts.seed}, {"resume", resume}};
  auto joined = zmuon::node::join(
      nopts, zmuon::table_lines(zmuon::example::param_table(topts.model)), agreed.dump());
  if (!joined) {
    say(joined.err().message());
    auto code = joined.err().code();
    return code == zmuon::errc::invalid_argument ? exit_bad_input
           : code == zmuon::errc::comm_failure   ? exit_node_lost
                                                 : 1;
  }
  nd = std::move(*joined);
  end_process_after_loss(nd->end());
  zmuon::engine_options eopts = job.engine;
  eopts.world = nd->world();
  auto created = zmuon::engine::create(eopts, nd->setup());
  if (!created) {
    say(created.err().to_string());
    return exit_bad_input;
  }
  eng = std::move(*created);
  if (auto err = zmuon::example::register_model(*eng, topts)) {
    say(err.to_string());
    return exit_bad_input;
  }
  bool lead = nf.node_rank == 0;
  topts.checkpoint_config = checkpoint_settings(job, topts);
  if (!resume.empty())
    if (int rc = resume_from(*eng, resume, topts.checkpoint_config, lead, topts.steps))
      return rc;
  if (lead)
    std::printf(
        "zmuon-launch: %d nodes, %d ranks, gas %d, micro-batch %d, global batch %d, "
        "%d steps%s, comm %s\n",
        nf.nodes, eopts.world, topts.gas, topts.micro_batch,
        eopts.world * topts.gas * topts.micro_batch, topts.steps,
        topts.fp16 ? ", fp16 loss scaling" : "", eng->options().comm.c_str());
  std::printf("zmuon-launch: %s joined\n", nd->name().c_str());
  std::fflush(stdout);
  zmuon::example::step_report report(*eng, job, lead);
  if (auto err = report.open()) {
    say(err.message());
    return 1;
  }
  zmuon::example::progress show(topts.steps, ::isatty(STDOUT_FILENO) != 0);
  auto records = zmuon::example::train(
      *eng, topts,
      [&](const auto& rec) {
        auto shown = report.finished(rec, topts.steps);
        if (!shown)
          say(shown.err().message());
        if (lead && shown && *shown)
          show.step(rec);
      },
      [&](int step) {
        report.started();
        nd->step_started(step);
      });
  show.done();
  int code = records ? save(*eng, topts, save_params) : 1;
  if (!records || code != 0) {
    std::string own = records ? "saving the parameters failed" : records.err().to_string();
    std::string lost = nd->explain_failure(own);
    if (!lost.empty()) {  // the supervisor said which node, rank and step
      // A failure of this node's own (a file it could not write) is said as well; a
      // collective's failure or timeout is the lost node's consequence.
      auto code = records ? zmuon::errc::none : records.err().code();
      if (code != zmuon::errc::none && code != zmuon::errc::comm_failure
          && code != zmuon::errc::timeout)
        say(own);
      return exit_node_lost;
    }
    say(own);
    return 1;
  }
  if (auto err = nd->finish()) {
    say(err.message());
    return exit_node_lost;
  }
  return 0;
}

int run_node(const zmuon::job_config& job, const zmuon::example::train_options& topts,
             const node_flags& nf, const std::string& save_params, const std::string& resume) {
  std::unique_ptr<zmuon::node> nd;
  std::unique_ptr<zmuon::engine> eng;
  zmuon::set_log_prefix("zmuon-launch[node " + std::to_string(nf.node_rank) + "]: ");
  int code = run_node_job(job, topts, nf, save_params, resume, nd, eng);
  node_exit_code = code;
  // Shutting down waits for every actor; should one not stop (a peer vanished mid-message),
  // the process still ends, with the job's exit code.
  std::thread([code] {
    std::this_thread::sleep_for(std::chrono::seconds(10));
    say("shutdown did not finish within 10 s; exiting");
    std::fflush(nullptr);
    std::_Exit(code);
  }).detach();
  eng.reset();  // before the node: the engine runs on the node's actor system
  nd.reset();
  return code;
}

int run(int argc, char** argv) {
  // The flags write here (its values are the defaults --help shows); only those given are used.
  zmuon::job_config flags = *zmuon::parse_config(launcher_defaults());
  zmuon::example::train_options topts;
  topts.steps = 30;
  std::string config_path;
  std::vector<std::string> sets;
  std::string save_params;
  node_flags nf;
  CLI::App app{
      "zmuon-launch: train the example model with Muon under ZeRO-3 (in-process ranks, "
      "or one node of a multi-process job)"};
  app.footer(
      "Precedence: the defaults shown < --config FILE < --set (in order) < the flags above, each "
      "a shorthand for the config key in its description.\nConfig keys: "
      "examples/zmuon_config.json (DeepSpeed's shape with the engine's defaults; unknown keys are "
      "errors); DeepSpeed's own keys, \"auto\" and the migration: docs/CONFIG.md.\nTwo nodes: on "
      "host A `zmuon-launch --nodes 2 --node-rank 0 --master A:29500 "
      "--ranks-per-node 2`, on host B the same with --node-rank 1; one machine: --local-nodes 2."
      "\nExit codes: 0 done, 1 failed, 2 bad input (flags, config, nodes that disagree), 3 a node "
      "of the job was lost (the message names it, its ranks and its step).");
  app.add_option("--config", config_path,
                 "DeepSpeed-style JSON config (see examples/zmuon_config.json)")
      ->type_name("FILE");
  app.add_option("--set", sets,
                 "override one config key, e.g. --set optimizer.params.momentum=0.9; the value is "
                 "JSON, else a string; null restores the default; repeatable")
      ->type_name("KEY.PATH=VALUE")
      ->allow_extra_args(false);
  // Each flag and the config key it sets.
  auto* ranks =
      app.add_option("--ranks", flags.engine.world, "number of ranks in this process (zmuon.ranks)")
          ->capture_default_str()
          ->check(CLI::Range(1, 1024));
  std::vector<std::pair<CLI::Option*, std::string>> flag_keys{
      {ranks, "zmuon.ranks"},
      {app.add_option(
              "--ranks-per-node", flags.engine.world,
              "ranks of this node (zmuon.ranks; the same as --ranks; with --backend cuda the "
              "default is one rank per visible GPU)")
           ->check(CLI::Range(1, 1024))
           ->excludes(ranks),
       "zmuon.ranks"},
      {app.add_option("--gas", flags.gas,
                      "gradient accumulation steps, micro-batches per step "
                      "(gradient_accumulation_steps)")
           ->capture_default_str()
           ->check(CLI::Range(1, 1 << 20)),
       "gradient_accumulation_steps"},
      {app.add_option("--micro-batch", flags.micro_batch,
                      "samples per rank per micro-batch (train_micro_batch_size_per_gpu)")
           ->capture_default_str()
           ->check(CLI::Range(1, 1 << 20)),
       "train_micro_batch_size_per_gpu"},
      {app.add_option("--lr", flags.engine.muon.lr, "Muon learning rate (optimizer.params.muon_lr)")
           ->capture_default_str()
           ->check(non_negative),
       "optimizer.params.muon_lr"},
      {app.add_option("--adam-lr", flags.engine.adamw.lr,
                      "AdamW learning rate, embeddings and biases (optimizer.params.adam_lr)")
           ->capture_default_str()
           ->check(non_negative),
       "optimizer.params.adam_lr"},
      {app.add_option("--weight-decay", flags.engine.muon.weight_decay,
                      "decoupled weight decay, Muon and AdamW (optimizer.params.weight_decay)")
           ->capture_default_str()
           ->check(non_negative),
       "optimizer.params.weight_decay"},
      {app.add_option("--clip", flags.engine.gradient_clipping,
                      "max global gradient norm, 0 = off (gradient_clipping)")
           ->capture_default_str()
           ->check(non_negative),
       "gradient_clipping"},
      {app.add_option("--bucket-size", flags.engine.reduce_bucket_size,
                      "elements per reduce bucket and Muon chunk "
                      "(zero_optimization.reduce_bucket_size)")
           ->capture_default_str()
           ->check(positive),
       "zero_optimization.reduce_bucket_size"},
      {app.add_option("--backend", flags.engine.compute,
                      "compute backend: host | cuda (zmuon.backend)")
           ->capture_default_str()
           ->check(CLI::IsMember({"host", "cuda"})),
       "zmuon.backend"},
      {app.add_option("--comm", flags.engine.comm,
                      "communication backend: auto (nccl on cuda when every rank of the job has "
                      "a GPU of its own, else caf) | caf (any world, ranks may share a GPU) | "
                      "nccl (one GPU per rank) (zmuon.comm)")
           ->capture_default_str()
           ->check(CLI::IsMember({"auto", "caf", "nccl"})),
       "zmuon.comm"},
  };
  auto* fp16 = app.add_flag("--fp16", flags.engine.fp16.enabled,
                            "fp16 loss scaling on the host, DeepSpeed's dynamic rules "
                            "(fp16.enabled=true)");
  bool strict = false;
  app.add_flag("--strict", strict,
               "every config note is an error: a DeepSpeed key with no effect in zmuon, an "
               "\"auto\" resolved (zmuon.strict=true)");
  app.add_option("--steps", topts.steps, "optimizer steps")
      ->capture_default_str()
      ->check(non_negative);
  app.add_option("--seed", topts.seed, "seed of the model init and the synthetic data")
      ->capture_default_str()
      ->check(whole_u64);
  app.add_option("--save-params", save_params,
                 "write the final full parameters (fp32, by name) to this safetensors file");
  std::string trace_dir;
  auto* trace = app.add_option("--trace", trace_dir,
                               "record every message of every rank into DIR, one JSON Lines file "
                               "per rank; read it with zmuon-trace (zmuon.trace)")
                    ->type_name("DIR");
  auto* nodes = app.add_option("--nodes", nf.nodes, "nodes (processes) of the job")
                    ->capture_default_str()
                    ->check(CLI::Range(1, 4096));
  auto* node_rank = app.add_option("--node-rank", nf.node_rank, "this node's rank in [0, --nodes)")
                        ->capture_default_str()
                        ->check(non_negative);
  auto* master =
      app.add_option("--master", nf.master,
                     "HOST:PORT where node 0 publishes the rendezvous and the others find it "
                     "(node 0 with port 0: a free port, printed)")
          ->capture_default_str();
  app.add_option("--host", nf.host,
                 "the address the other nodes reach this one at, for connections of their own "
                 "(jobs of 3+ nodes; default: $ZMUON_NODE_HOST, else --master's host when it is "
                 "a loopback address, else this machine's host name)");
  app.add_option("--local-nodes", nf.local_nodes,
                 "run the job as this many node processes on 127.0.0.1 (each with the other "
                 "flags; --save-params goes to node 0)")
      ->check(CLI::Range(1, 64))
      ->excludes(nodes)
      ->excludes(node_rank)
      ->excludes(master);
  app.add_option("--secret-file", nf.secret_file,
                 "the job's secret (its first line, 16+ bytes, a file only you may read): the "
                 "nodes authenticate each other with it under TLS (default: $ZMUON_JOB_SECRET, "
                 "else the file $ZMUON_JOB_SECRET_FILE; --local-nodes makes one of its own)")
      ->type_name("FILE");
  std::string new_secret;
  app.add_option("--new-secret", new_secret,
                 "write a new secret (32 random bytes as 64 hex digits, mode 0600) to FILE, "
                 "which must not exist, and exit")
      ->type_name("FILE");
  app.add_flag("--weak-secret-ok", nf.weak_secret_ok,
               "accept a secret that is too easy to guess (short, repeating, a small alphabet) "
               "with a warning ($ZMUON_WEAK_SECRET_OK=1)");
  app.add_flag("--insecure", nf.insecure,
               "no secret, no TLS: plain TCP, on loopback addresses only ($ZMUON_INSECURE=1)");
  app.add_flag("--insecure-any-host", nf.insecure_any_host,
               "no secret, no TLS: plain TCP on any address; anyone who reaches the ports can "
               "join, read or stop the job ($ZMUON_INSECURE=any-host)");
  app.add_option("--rendezvous-file", nf.rendezvous_file)->group("");  // --local-nodes' own
  app.add_option("--test-certificate", nf.test_certificate)  // tests: a certificate to refuse
      ->check(CLI::IsMember({"expired", "foreign"}))
      ->group("");
  app.add_option("--model-hidden", topts.model.hidden)->group("");  // tests: another model
  auto* save_ckpt =
      app.add_option("--save-checkpoint", topts.checkpoint_dir,
                     "save a checkpoint under DIR every --every steps (DIR/latest names the "
                     "newest; the two newest are kept)")
          ->type_name("DIR");
  auto* every = app.add_option("--every", topts.checkpoint_every, "steps between checkpoints")
                    ->check(positive)
                    ->needs(save_ckpt);
  save_ckpt->needs(every);
  std::string resume;
  app.add_option("--resume", resume,
                 "continue from the checkpoint in DIR (its `latest`, or DIR itself) up to --steps; "
                 "the world size may differ from the one that saved")
      ->type_name("DIR");
  zmuon::example::fault_flags faults;
  zmuon::example::add_fault_flags(app, faults);
  std::string log_level;
  app.add_option("--log-level", log_level,
                 "the least severe messages on stderr: error | warn | info | debug | trace "
                 "(default: $ZMUON_LOG_LEVEL, else info)")
      ->check(CLI::IsMember({"error", "warn", "info", "debug", "trace"}));
  app.set_version_flag("--version", std::string("zmuon-launch ") + zmuon::version(),
                       "print the version and exit");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return zmuon::parse_failure(app, e);  // --help 0, a bad flag 2 (bad input)
  }
  if (!log_level.empty())
    zmuon::set_log_level(*zmuon::parse_log_level(log_level));
  if (!new_secret.empty()) {
    if (auto err = zmuon::write_new_secret(new_secret)) {
      say(err.message());
      return exit_bad_input;
    }
    std::printf("wrote a new secret to %s (mode 0600): give every node --secret-file %s\n",
                new_secret.c_str(), new_secret.c_str());
    return 0;
  }

  // The flags given become the last overrides, so the config's checks apply to them too.
  for (const auto& [option, key] : flag_keys)
    if (option->count() > 0)
      sets.push_back(key + "=" + option->results().back());
  if (fp16->count() > 0)
    sets.push_back(flags.engine.fp16.enabled ? "fp16.enabled=true" : "fp16.enabled=false");
  if (trace->count() > 0)
    sets.push_back("zmuon.trace=" + nlohmann::json(trace_dir).dump());
  zmuon::config_context context;  // what "auto" resolves from: the job
  context.total_steps = topts.steps;
  context.strict = strict;
  context.world = std::max(1, nf.nodes > 1 ? nf.nodes : nf.local_nodes) * [&] {
    zmuon::config_context lenient = context;
    lenient.strict = false;
    auto ranks =
        zmuon::load_config(config_path, sets, launcher_defaults(config_path, sets), lenient);
    return ranks ? ranks->engine.world : 1;  // a bad config: its own check says why below
  }();
  auto job = zmuon::load_config(config_path, sets, launcher_defaults(config_path, sets), context);
  if (!job) {
    say("config error: " + job.err().message());
    return 2;
  }
  if (nf.node_rank == 0 && nf.local_nodes == 0)  // --local-nodes: node 0's process says them
    for (const auto& note : job->notes)
      ZMUON_LOG_WARN("note: " + note);
  job->engine.trace_dir = job->trace;
  // --local-nodes on GPUs: node n sees its own run of the visible GPUs (CUDA_VISIBLE_DEVICES),
  // ranks-per-node of them (by default the GPUs shared out evenly), so that its ranks do not
  // land on node 0's GPUs.
  std::vector<std::string> node_devices;
  if (job->engine.compute == "cuda" && nf.local_nodes > 0) {
    const int gpus = zmuon::compute_device_count("cuda");
    const int per_node =
        ranks_given(config_path, sets) ? job->engine.world : std::max(1, gpus / nf.local_nodes);
    for (int n = 0; n < nf.local_nodes; ++n)
      node_devices.push_back(zmuon::example::node_visible_devices(
          std::getenv("CUDA_VISIBLE_DEVICES"), gpus, nf.local_nodes, per_node, n));
    if (std::find(node_devices.begin(), node_devices.end(), "") != node_devices.end())
      node_devices.clear();  // fewer GPUs than ranks: every node sees them all
  }
  if (job->engine.compute == "cuda" && !ranks_given(config_path, sets)) {
    // On GPUs, one rank per visible GPU unless --ranks, --ranks-per-node or zmuon.ranks says.
    int gpus = zmuon::compute_device_count("cuda");
    job->engine.world = gpus > 0 ? gpus : 1;
  }
  // Into the launch options, so that a node of a multi-process job arms them too.
  if (auto err =
          zmuon::example::apply_fault_flags(faults, static_cast<uint64_t>(topts.steps), job->gas,
                                            topts.checkpoint_every, topts.faults)) {
    say(err.message());
    return exit_bad_input;
  }
  zmuon::engine_options eopts = job->engine;
  topts.gas = job->gas;
  topts.micro_batch = job->micro_batch;
  topts.fp16 = eopts.fp16.enabled;
  if (nf.local_nodes > 0)
    return zmuon::example::run_local_nodes(
        nf.local_nodes, zmuon::example::args_without_local_nodes(argc, argv), eopts.timeout_ms,
        job->heartbeat_timeout_ms + 10'000, node_devices);
  if (nf.nodes > 1)
    return run_node(*job, topts, nf, save_params, resume);
  if (nf.node_rank != 0) {
    say("--node-rank " + std::to_string(nf.node_rank) + " needs --nodes > "
        + std::to_string(nf.node_rank));
    return exit_bad_input;
  }
  auto eng = zmuon::engine::create(eopts);
  if (!eng) {
    say(eng.err().to_string());
    return 2;
  }
  if (auto err = zmuon::example::register_model(**eng, topts)) {
    say(err.to_string());
    return 2;
  }
  topts.checkpoint_config = checkpoint_settings(*job, topts);
  if (!resume.empty())
    if (int rc = resume_from(**eng, resume, topts.checkpoint_config, true, topts.steps))
      return rc;
  std::printf(
      "zmuon-launch: %d ranks, gas %d, micro-batch %d, global batch %d, %d steps%s, comm "
      "%s\n",
      eopts.world, topts.gas, topts.micro_batch, eopts.world * topts.gas * topts.micro_batch,
      topts.steps, topts.fp16 ? ", fp16 loss scaling" : "", (*eng)->options().comm.c_str());
  zmuon::example::step_report report(**eng, *job, true);
  if (auto err = report.open()) {
    say(err.message());
    return 1;
  }
  zmuon::error report_failed;
  zmuon::example::progress show(topts.steps, ::isatty(STDOUT_FILENO) != 0);
  auto records = zmuon::example::train(
      **eng, topts,
      [&](const auto& rec) {
        auto shown = report.finished(rec, topts.steps);
        if (!shown && !report_failed)
          report_failed = shown.err();
        if (shown && *shown)
          show.step(rec);
      },
      [&](int) { report.started(); });
  show.done();
  if (!records || report_failed) {
    say(records ? report_failed.message() : records.err().to_string());
    return 1;
  }
  return save_params.empty() ? 0 : save(**eng, topts, save_params);
}

}  // namespace

int main(int argc, char** argv) {
  zmuon::set_log_prefix("zmuon-launch: ");  // a node's own: run_node
  return run(argc, argv);
}
