// The zmuon engine: one process, `world` in-process ranks, each a group of four actors.
// The host registers its parameters, hands over each rank's gradients per micro-batch, and
// asks for a step. Errors are returned, never thrown.
//
//   auto eng = zmuon::engine::create(opts);            // expected<unique_ptr<engine>>
//   (*eng)->add_parameter({"fc1.weight", {128, 64}}, init);
//   for (k in micro-batches) (*eng)->reduce_all({grads_of(0, k), grads_of(1, k), ...});
//     // or for (r in ranks) (*eng)->reduce(r, grads_of(r, k)): the bucket window needs one rank
//   auto res = (*eng)->step();                        // expected<step_info>
//   auto params = (*eng)->parameters();               // expected<tensor_map>
//
// From a JSON config and the caller's own buffers (no tensor_map in between):
// create_from_json(), reduce(rank, vector<tensor_view>), gather_params(vector<tensor_span>).
// The C ABI (zmuon/zmuon.h) and the Python binding sit on these.
//
// Threads: reduce() for different ranks may run on different threads at once (a host thread
// per rank; the first calls may race to start the engine; reduce_all() does that itself). Every
// other call, and reduce() for one rank, must not overlap another call on the same engine.
//
// A failure that may leave the ranks part of the way through a step (a timeout, a rank's step
// failing, a backend failure while handing over) stops the engine: every later call is refused
// with errc::bad_state naming that failure (a new engine can load a checkpoint).
#pragma once

#include <array>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "zmuon/call_times.hpp"
#include "zmuon/config.hpp"
#include "zmuon/group_hparams.hpp"
#include "zmuon/memory.hpp"
#include "zmuon/options.hpp"
#include "zmuon/param.hpp"
#include "zmuon/rank_state.hpp"
#include "zmuon/status.hpp"
#include "zmuon/tensor.hpp"

namespace zmuon {

/// What one optimizer step did (identical on every rank; NS counts are summed over ranks).
struct step_info {
  uint64_t step = 0;
  bool skipped = false;       // a non-finite gradient on some rank: nothing was applied
  double grad_norm = 0;       // global norm of the raw accumulated gradient
  float clip_coef = 1;        // factor the gradient was clipped by (1 = not clipped)
  float loss_scale = 1;       // scale the host used for this step
  float next_loss_scale = 1;  // scale for the next step
  int micro_batches = 0;
  int ns_params = 0;        // Muon parameters orthogonalized, summed over ranks
  int64_t ns_matrices = 0;  // NS matrices (head blocks count one each), summed over ranks
};

using lr_schedule = std::function<float(uint64_t step)>;

struct plan;        // plan/plan.hpp (internal): where every parameter's shards live
struct node_setup;  // node/node_setup.hpp

/// How a process joins a multi-process job as one of its nodes (engine::create_node): the
/// launcher's --nodes, --node-rank and --master for an embedder started by torchrun or the like.
struct join_options {
  int nodes = 1;      // processes of the job
  int node_rank = 0;  // this process's, in [0, nodes)
  /// HOST:PORT of the rendezvous, which node 0 publishes (port 0: a free port, written to
  /// `rendezvous_file`) and the other nodes find.
  std::string master = "127.0.0.1:29500";
  int ranks = 1;  // ranks this process runs (one per GPU under the nccl comm)
  /// What every process must agree on besides the parameter table (the job's config as JSON
  /// text); the first difference is named on every process.
  std::string job = "null";
  int64_t join_timeout_ms = 60'000;
  int64_t heartbeat_timeout_ms = 10'000;  // a process silent this long is lost
  std::string rendezvous_file;            // node 0 writes "HOST:PORT" here once it listens
  /// Where the other processes reach this one directly (jobs of three or more processes).
  /// Empty: $ZMUON_NODE_HOST, else the master's host when that is a loopback address, else
  /// this machine's host name; unreachable there, its traffic goes through node 0.
  std::string host;
};

/// What load_checkpoint found.
struct checkpoint_info {
  std::string path;    // the checkpoint's directory
  uint64_t step = 0;   // steps done when it was saved; the next step() is step + 1
  int world = 0;       // the world size that saved it
  std::string config;  // the config JSON given to save_checkpoint ("null" when none)
};

/// One parameter's optimizer state (engine::read_state / write_state): elements
/// [offset, offset + count) of each flattened tensor, the whole tensor when read in full.
struct param_state {
  std::string name;
  int64_t offset = 0;
  std::vector<float> param;       // the fp32 master
  std::vector<float> momentum;    // Muon; empty for AdamW
  std::vector<float> exp_avg;     // AdamW; empty for Muon
  std::vector<float> exp_avg_sq;  // AdamW; empty for Muon
  int64_t adam_step = 0;          // AdamW: the steps that touched it (bias correction)
  // Muon: NorMuon's row second moments, one per row of the matrix view (an expert stack
  // [E, r, c]: E * r), zeros until a NorMuon step. Each NS block's rows are held by the block's
  // owner rank. Read whole: every block's (over the processes too); read local: the blocks of
  // this process's ranks (zeros for the others), empty where it owns none. Write: empty means
  // zeros; each rank takes its blocks' rows.
  std::vector<float> row_moments = {};
};

/// The whole optimizer state, without files: what a checkpoint holds.
struct optimizer_state {
  uint64_t step = 0;       // steps done (skipped ones included)
  int64_t adam_steps = 0;  // AdamW steps applied
  loss_scale_snapshot scaler;
  std::vector<param_state> params;  // read: in registration order; write: any order, each once
};

/// What read_state returns.
enum class state_scope {
  full,   // whole tensors; in a multi-process job a collective every process calls
  local,  // the elements this process's ranks hold (all of them in one process); no collective
};

class engine {
public:
  /// Checks the options (world size, NS schedule, backend names) and starts the actor system.
  static expected<std::unique_ptr<engine>> create(const engine_options& opts);

  /// Creates an engine from a DeepSpeed-style JSON config given as text (empty: the defaults)
  /// and "key.path=value" overrides (zmuon/config.hpp). `zmuon.ranks` in-process ranks.
  /// (One rank of a multi-process job, joined through the launcher's rendezvous, is the
  /// multi-process launch issue's to add here.)
  static expected<std::unique_ptr<engine>> create_from_json(
      const std::string& json_text, const std::vector<std::string>& overrides = {});

  /// The same from the JSON file at `path`.
  static expected<std::unique_ptr<engine>> create_from_file(
      const std::string& path, const std::vector<std::string>& overrides = {});

  /// One node of a multi-process job: `opts.world` is the job's world and this process runs only
  /// `node`'s ranks. reduce(), snapshot() take this node's global ranks; parameters() and
  /// sum_over_nodes() are collectives that every node calls in the same order.
  static expected<std::unique_ptr<engine>> create(const engine_options& opts,
                                                  const node_setup& node);
  /// One process of a multi-process job, joined when it starts (start(), or the first call that
  /// needs the ranks): register the parameters first, since every process must bring the same
  /// table and `join.job`. This process then runs ranks [first_rank(), first_rank() + ranks) of
  /// world() over all processes; reduce() takes those ranks, and step(), parameters(),
  /// gather_params(), checkpoints and sum_over_nodes() are collectives every process calls in
  /// the same order. Comm "auto" is nccl when every rank of the job has a GPU of its own.
  /// Destroying it waits (up to the join timeout) until every process is done.
  static expected<std::unique_ptr<engine>> create_node(const engine_options& opts,
                                                       const join_options& join);
  ~engine();
  engine(const engine&) = delete;
  engine& operator=(const engine&) = delete;

  /// Registers a parameter with its initial values (empty: zeros). Only before the first
  /// reduce() or step().
  error add_parameter(const param_spec& spec, const std::vector<float>& init = {});

  /// Lays out the shards and starts the ranks, as the first reduce() or step() would; a process
  /// made by create_node() joins its job here (blocking until every process has joined).
  error start();

  /// Hands over rank `rank`'s gradient of one micro-batch: full tensors by name. Parameters
  /// left out count as zero. Unknown names and wrong sizes are errors and change nothing.
  /// Returns once the gradient is packed into reduce buckets; with one local rank it first waits
  /// until fewer than engine_options::max_buckets_in_flight of the rank's buckets are unlanded
  /// (errc::timeout after timeout_ms, naming the bucket).
  error reduce(int rank, const tensor_map& grads);

  /// The same from the caller's buffers (read during the call, not kept). A name given twice, a
  /// null pointer or a wrong size is an error that changes nothing; a device buffer is
  /// errc::unsupported unless the build and backend support device buffers.
  error reduce(int rank, const std::vector<tensor_view>& grads);

  /// The same, stream-ordered for device gradients written on the caller's CUDA stream
  /// `cuda_stream` (a cudaStream_t, nullptr for the default stream; PyTorch's
  /// torch.cuda.current_stream().cuda_stream): the engine reads them after the work queued there
  /// so far, with no need to synchronize first, and the work queued there afterwards (the next
  /// backward pass) waits on the device until they are read. Under the nccl comm reduce() then
  /// does not wait for the GPU; the caf comm copies them to host memory during the call, after
  /// that work. Host buffers are read during the call, as above. A stream on another GPU than
  /// the rank's, or one capturing a CUDA graph (the engine's work cannot be captured), is
  /// errc::invalid_argument before anything is read or counted.
  error reduce(int rank, const std::vector<tensor_view>& grads, void* cuda_stream);

  /// Hands over local rank `rank`'s part of one micro-batch's gradient that the host has already
  /// averaged over the ranks (DDP's all-reduce, FSDP2's reduce-scatter): no reduce-scatter runs,
  /// the rank's shard is added as it is. Each view is the whole averaged gradient (the engine
  /// reads the rank's shard of it) or exactly the rank's shard (the elements local_range gives
  /// for that rank alone: under shard_layout::rows, FSDP2's local tensor). Every rank hands
  /// over a micro-batch the same way (this or reduce()); checks and errors as reduce()'s.
  error hand_over_reduced(int rank, const std::vector<tensor_view>& grads);
  /// The same, stream-ordered for device gradients on the caller's CUDA stream (as reduce()).
  error hand_over_reduced(int rank, const std::vector<tensor_view>& grads, void* cuda_stream);

  /// reduce() (`reduced` false) or hand_over_reduced() (true), stream-ordered on `cuda_stream`,
  /// for a caller that keeps every device gradient it hands over unwritten and allocated until
  /// the next step() returns (`kept_until_step`: PyTorch's .grad read at step()). Where the
  /// rank's part needs no reduce-scatter (hand_over_reduced, or a job of one rank) and every
  /// gradient is in device memory under the nccl comm, the step reads them where they lie (the
  /// scan, the momentum and the non-Muon rule), and the call returns without reading them: no
  /// packed copy, no wait. A step() refused before it begins (a bad learning rate) copies them
  /// in before it returns. Otherwise as reduce() / hand_over_reduced(). On the host backend
  /// (a job of one rank, or `reduced`) the step reads host gradients where they lie too.
  ///
  /// `ahead_of_step` (with kept_until_step): the gradients are handed over before they are
  /// final, at the end of a backward pass, and nothing reads them before the next step()
  /// begins; until then the caller may still write them in place. step(cuda_stream) then reads
  /// them after that stream's work (step() without a stream: after the hand-over's). The next
  /// hand-over of the rank, a checkpoint's save or load, or write_state first withdraws such a
  /// hand-over (it then counts as never made), so a caller whose gradients moved hands over
  /// again. errc::unsupported, and nothing handed over, where the step could not read them
  /// where they lie.
  error hand_over(int rank, const std::vector<tensor_view>& grads, void* cuda_stream, bool reduced,
                  bool kept_until_step, bool ahead_of_step = false);
  /// The micro-batches local rank `rank` has handed over in the open step (a hand-over ahead of
  /// the step counts while it stands).
  expected<int> handed_over(int rank);
  /// Begins the open step's reads of gradients handed over ahead of it, after `cuda_stream`'s
  /// work (nullptr: the default stream; ignored on the host backend), before the step() call
  /// that follows: from this call on the caller may no longer write them. Lets the reads run
  /// while the caller prepares the step (zmuon.Muon.step()'s checks). Nothing where no
  /// hand-over was made ahead; a stream that cannot be waited for is refused by name.
  error begin_step(void* cuda_stream);

  /// One micro-batch of every local rank at once: grads[i] is local rank first_rank() + i's.
  /// Every rank's gradients are checked first (nothing is handed over if one is wrong); then each
  /// rank hands over on a thread of its own, so that the ranks pack in parallel and the bound on
  /// buckets in flight (max_buckets_in_flight) holds with several local ranks too (one thread
  /// calling reduce() rank after rank cannot keep it: a bucket lands only once every rank handed
  /// it over). With one local rank this is reduce().
  error reduce_all(const std::vector<tensor_map>& grads);
  error reduce_all(const std::vector<std::vector<tensor_view>>& grads);

  /// One optimizer step over everything handed over since the last step. Every rank must have
  /// handed over the same number of micro-batches (at least one). Returns once the step's work
  /// has finished.
  expected<step_info> step();
  /// The same, stream-ordered on the caller's CUDA stream (cudaStream_t; null: the default
  /// stream), as torch.optim's steps are: it returns once the step is decided (the vote) and its
  /// device work enqueued, and the work queued on `cuda_stream` from then on waits for that work
  /// on the device. The host's reads (parameters(), snapshot(), checkpoints) wait themselves.
  expected<step_info> step(void* cuda_stream);

  /// The full fp32 parameters, gathered from the shards of all ranks.
  expected<tensor_map> parameters();

  /// Gathers the full fp32 parameters named in `out` into the caller's buffers (for the forward
  /// pass). Any subset of the registered parameters, each of its full size. In a multi-process
  /// job a collective; the other processes' shards come through host memory.
  error gather_params(const std::vector<tensor_span>& out);
  /// The same, stream-ordered for device buffers used on the caller's CUDA stream `cuda_stream`
  /// (a cudaStream_t, nullptr for the default stream): the engine writes them after the work
  /// queued there so far (which may still read the old values), and the work queued there
  /// afterwards (the next forward pass) waits on the device until they are written; no waiting
  /// on the host. A stream on another GPU than a rank's, or one capturing a CUDA graph, is
  /// errc::invalid_argument before anything is written. Host buffers are written during the
  /// call, as above.
  error gather_params(const std::vector<tensor_span>& out, void* cuda_stream);
  /// Writes local rank `rank`'s shard of the fp32 parameters named in `out` (each buffer of
  /// that shard's size: local_range's elements for the rank alone; under shard_layout::rows
  /// FSDP2's local tensor) into the caller's buffers: no collective. Device buffers as
  /// gather_params().
  error shard_params(int rank, const std::vector<tensor_span>& out);
  error shard_params(int rank, const std::vector<tensor_span>& out, void* cuda_stream);
  /// Sets local rank `rank`'s shard of the fp32 parameters named in `in` (each view the whole
  /// tensor or the rank's shard alone, as hand_over_reduced takes them; host memory) between
  /// steps: an FSDP2 process registers its parameters without values and loads its local
  /// tensors here, so that no process holds a whole parameter. No collective.
  error load_shard_params(int rank, const std::vector<tensor_view>& in);
  /// Parameter `name`'s fp32 master itself, where this process runs one rank: its place in
  /// the store's own buffer (host memory, or device memory on the cuda backend: `space` and
  /// `device` say which), valid until the engine ends. The whole parameter in a job of one
  /// rank; else the rank's shard of it, elements [rank * shard_len, + valid) of the flattened
  /// tensor (FSDP2's local shard under the rows layout), possibly empty, followed by the
  /// shard's padding up to shard_len (rows layout: ceil(rows / world) rows). A caller that makes
  /// its tensor a view of it has the step write the tensor in place (nothing to gather), and
  /// its own writes between steps are the values the next step starts from; the engine
  /// writes it only inside step() and the loads (load_state, load_checkpoint,
  /// load_shard_params), each done when it returns. A process of several ranks:
  /// errc::unsupported.
  expected<tensor_span> master_of(const std::string& name);
  /// Sums host values (e.g. the loss) over the processes of a multi-process job, each passing
  /// the sum over its own ranks; in one process, returns `values`.
  expected<std::vector<double>> sum_over_nodes(const std::vector<double>& values);

  /// A copy of one rank's shards, once every bucket it was handed has landed.
  expected<rank_state> snapshot(int rank);

  /// Saves every rank's state (parameters, momentum, Adam moments, AdamW and loss-scaler
  /// counters, the step) under `dir` (checkpoint/checkpoint.hpp: per-rank safetensors, a
  /// manifest with a CRC-32 per file, atomic writes). `config_json` (JSON text) is stored in the
  /// manifest. Only between steps (no micro-batch handed over). In a multi-process job it is a
  /// collective: each node writes its own ranks' files, the first node the manifest and `latest`
  /// once all are on disk, and every node returns the same outcome (an error naming the node that
  /// failed); `dir` must be a directory every node sees.
  error save_checkpoint(const std::string& dir, const std::string& config_json = "null");

  /// Restores the state saved under `dir` (a checkpoint directory, or one holding `latest`),
  /// resharding when it was saved with another world size. The same parameters (names, shapes,
  /// Muon or AdamW) must be registered. Only between steps. Errors name what is wrong. In a
  /// multi-process job a collective: every node reads the checkpoint and keeps its own ranks'
  /// part; a node that cannot read it, or reads another step's, fails the load on every node.
  expected<checkpoint_info> load_checkpoint(const std::string& dir);

  /// The optimizer state by parameter name, out of the ranks' shards (the checkpoint's
  /// resharding, checkpoint/shards.hpp, without files). Only between steps.
  expected<optimizer_state> read_state(state_scope scope = state_scope::full);
  /// Loads full tensors (as read_state(full) gives them, from an engine of any world size), or
  /// per parameter exactly this process's elements (read_state(local)'s, param_state::offset):
  /// every registered parameter once, with the state its algorithm keeps, finite values. All
  /// is checked before anything changes; a bad state is an error naming what is wrong. In a
  /// multi-process job a collective: every process passes the same state and keeps its ranks'
  /// part; one that refuses it fails the load on every process.
  error write_state(const optimizer_state& state);
  /// Elements [first, second) of parameter `name`'s flattened tensor that this process's ranks
  /// hold (what read_state(local) gives).
  expected<std::pair<int64_t, int64_t>> local_range(const std::string& name);

  /// Steps done so far (0 for a fresh engine, the checkpoint's step after load_checkpoint).
  uint64_t last_step() const;

  /// The loss scale the host multiplies its next loss by (1 without fp16).
  expected<float> loss_scale();

  /// Learning-rate schedules (default: the constant lr of the options) of the hyperparameter
  /// groups never given set_group_hparams.
  void set_lr_schedules(lr_schedule muon_lr, lr_schedule adam_lr);

  /// How Muon cuts registered parameter `name` into Newton-Schulz blocks (param_spec's
  /// split_sizes, split_heads and view; heads given at registration then apply inside each
  /// block). Only before the first reduce() or step(); a bad layout changes nothing.
  error set_muon_blocks(const std::string& name, const std::vector<int64_t>& split_sizes,
                        const std::vector<int64_t>& split_heads = {},
                        matrix_view view = matrix_view::automatic);
  /// The order the host holds Muon matrix `name`'s elements in: `boxes` of its matrix view back
  /// to back, each row-major, tiling it (param_spec::boxes; empty: row-major). Each rank's shard
  /// is then a run of that order (e.g. one box), read and written where the host keeps it;
  /// Newton-Schulz runs on the natural matrix. One NS block only: no heads, split sizes, expert
  /// stack or MuonClip pair. Only before the first reduce() or step(); a bad order changes
  /// nothing.
  error set_box_order(const std::string& name, const std::vector<matrix_box>& boxes);
  /// MuonClip (Kimi K2, arXiv:2507.20534): pairs query parameter `query` ([query_heads * d,
  /// ...]) with key parameter `key` ([key_heads * d, ...]; GQA: key_heads divides query_heads).
  /// After each applied step, a head whose largest logit exceeds its group's
  /// muon_options::qk_clip_tau has its query rows and its key rows scaled by sqrt(tau / max).
  /// Only before the first reduce() or step(); every process registers the same pairs.
  error add_qk_clip(const std::string& query, const std::string& key, int64_t query_heads,
                    int64_t key_heads);
  /// Local rank `rank`'s largest pre-softmax logit of one micro-batch for each head of query
  /// `query` (query_heads values: finite, or -inf for a head not computed on this rank). The step
  /// clips by the max over every report of every rank and process since the last step; a rank
  /// may report any number of times (or never).
  error report_qk_logits(int rank, const std::string& query, const std::vector<float>& max_logits);
  /// Puts parameter `name` in hyperparameter group `group` (param_spec::hparam_group); only
  /// before the first reduce() or step(). Every process registers the same groups.
  error set_hparam_group(const std::string& name, int group);
  /// Group `group`'s values from the next step on, until set again: each parameter steps with
  /// its group's (a Muon parameter with `values.muon`, an AdamW one with `values.adamw`; the
  /// NS options too). Checked as the options are; a bad value changes nothing. A group never
  /// set runs the options' values, its lr from the schedules. Every process of a
  /// multi-process job sets the same values before the same step.
  error set_group_hparams(int group, const group_hparams& values);
  /// The values group `group` runs with at step `step`.
  group_hparams group_values(int group, uint64_t step) const;
  /// Steps this engine skipped for a non-finite gradient (not counted across a checkpoint load):
  /// a DeepSpeed scheduler advances on applied steps only.
  uint64_t skipped_steps() const;
  /// The learning rates the next step() uses: {Muon, AdamW}.
  std::array<float, 2> next_lrs() const;

  /// Memory held by local rank `rank`'s compute backend (zmuon/memory.hpp); the peak counts
  /// from the last reset_peak_memory() (benchmarks: the transient memory of a step).
  expected<memory_stats> memory(int rank) const;
  void reset_peak_memory();

  /// Timing of the compute backends' calls (zmuon/call_times.hpp), for benchmarks: off by
  /// default; switches every local rank's backend, now or once the engine starts. On CUDA each
  /// timed call adds two events to the rank's streams.
  void time_backend_calls(bool on);
  /// Local rank `rank`'s sums since the last take (waits for timed GPU work still running).
  expected<call_times> take_backend_call_times(int rank);
  /// The calls that local rank `rank`'s last take_backend_call_times summed, one span each, by
  /// start (zmuon/call_times.hpp): a timeline of that period.
  expected<std::vector<call_span>> backend_call_spans(int rank) const;
  /// Takes the timing period of every local rank (as take_backend_call_times does) and writes
  /// its calls to `path` as call_timeline_json; an error while timing is off.
  error write_call_timeline(const std::string& path);

  int world() const;
  /// The ranks this process runs: [first_rank(), first_rank() + local_ranks()).
  int first_rank() const;
  int local_ranks() const;
  /// The partition plan once the engine has started (after the first reduce/step), else null.
  const plan* layout() const;
  const engine_options& options() const;

private:
  engine();
  /// `window`: the bound on the rank's unlanded buckets (0: none).
  /// `reduced`: hand_over_reduced's; `kept_until_step`, `ahead_of_step`: hand_over's.
  error reduce_views(int rank, const std::vector<tensor_view>& grads,
                     std::optional<void*> caller_stream, size_t window, bool reduced = false,
                     bool kept_until_step = false, bool ahead_of_step = false);
  /// `shard_of` >= 0: shard_params of that rank.
  error gather_params_on(const std::vector<tensor_span>& out, std::optional<void*> caller_stream,
                         int shard_of = -1);
  struct impl;
  std::unique_ptr<impl> impl_;

  /// step() (no stream: answered once the work has finished) and step(cuda_stream).
  expected<step_info> run_step(std::optional<void*> cuda_stream);
  friend struct engine_access;  // the engine's internal hooks (src/engine/)
};

}  // namespace zmuon
