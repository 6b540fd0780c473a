// Every message of the zmuon protocol (docs/DESIGN.md §1), in one place. Each carries `step` (and
// `micro`, `bucket`, `chunk` where they apply). Between the actors of one rank, messages carry
// metadata and views of buffers the sender owns, each view sharing its buffer's ownership
// (keep_alive) so that the memory outlives every message that points into it; only the caf comm
// backend's peer messages carry tensor payloads (they are what crosses processes).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "caf/atom.hpp"
#include "caf/deserializer.hpp"
#include "caf/meta/type_name.hpp"
#include "caf/serializer.hpp"

#include "zmuon/group_hparams.hpp"
#include "zmuon/rank_state.hpp"

namespace zmuon {

class device_buffer;  // kernels/compute.hpp
struct copy_piece;    // kernels/compute.hpp

/// Gradients read where the caller keeps them (device memory): a bucket's pieces, each from its
/// parameter's gradient to its offset in the bucket, read by the store's accumulate itself.
using gradient_pieces = std::shared_ptr<const std::vector<copy_piece>>;

// -- atoms ---------------------------------------------------------------------------------------
using scale_atom = caf::atom_constant<caf::atom("scale")>;        // ask the loss scaler its scale
using snapshot_atom = caf::atom_constant<caf::atom("snapshot")>;  // ask the store for its state
// ... the state a checkpoint keeps (no gradient)
using saved_state_atom = caf::atom_constant<caf::atom("savestate")>;
using params_atom = caf::atom_constant<caf::atom("params")>;  // ask the store for its params
using params_view_atom = caf::atom_constant<caf::atom("paramview")>;  // its params buffer itself
using scaler_state_atom = caf::atom_constant<caf::atom("scalerst")>;  // the loss scaler's counters

// -- buffers -------------------------------------------------------------------------------------
/// What keeps the memory behind a view allocated: the sender's buffer, shared with every message
/// that points into it. A request abandoned by its sender (a failed step, a timed-out engine
/// ending) then frees nothing that its receiver still reads or writes: the memory goes with the
/// last holder, the sender or the message. Null where the sender outlives every use by contract
/// (the store's own parameter buffer, asked for between steps).
using keep_alive = std::shared_ptr<const void>;

/// A view of `size` values owned by the sender, valid while `owner` lives: floats at `data`,
/// or, where a message says so (the Muon phase's u and update under bf16 transport), bf16 bits
/// at `bf16` with `data` null. Never leaves the process.
struct float_view {
  float* data = nullptr;
  int64_t size = 0;
  uint16_t* bf16 = nullptr;
  keep_alive owner = nullptr;
};

/// Gradient staging handed over by the host: immutable once sent, freed with its last reference.
using shared_floats = std::shared_ptr<const std::vector<float>>;

/// The element type an all-to-all moves (the Muon phase's gather and scatter may move bf16).
enum class wire_type : uint8_t { fp32, bf16 };
const char* wire_name(wire_type type);
inline int64_t element_bytes(wire_type type) {
  return type == wire_type::bf16 ? 2 : 4;
}

/// A run of `size` elements inside a collective's send or receive list: fp32 at `data`, or, in
/// an all-to-all of wire_type::bf16, bf16 bits at `bf16`.
struct segment {
  float* data = nullptr;
  int64_t size = 0;
  uint16_t* bf16 = nullptr;
  keep_alive owner = nullptr;  // the buffer it points into (float_view)
};

// -- collectives ---------------------------------------------------------------------------------
// params: the host's all-gather of the parameter shards between processes; host: an all-reduce of
// the host's values (the loss) between processes. Both run only between steps.
enum class collective_kind : uint8_t { reduce_scatter, vote, gather, scatter, params, host };
enum class reduce_op : uint8_t { sum, max };
/// "reduce_scatter", "vote", ... (a static string).
const char* kind_name(collective_kind kind);
std::string to_string(collective_kind kind);
std::string to_string(reduce_op op);

/// Names one collective; every rank derives the same tags in the same order.
struct collective_tag {
  collective_kind kind = collective_kind::reduce_scatter;
  uint64_t step = 0;
  int32_t micro = 0;
  int32_t index = 0;  // bucket or chunk

  auto key() const { return std::make_tuple(kind, step, micro, index); }
  bool operator<(const collective_tag& o) const { return key() < o.key(); }
  bool operator==(const collective_tag& o) const { return key() == o.key(); }
};
std::string to_string(const collective_tag& tag);

/// reduce-scatter (mean): `in` holds world * count floats, rank-major; this rank's mean lands in
/// `out` (count floats). `out` may be this rank's own part of `in` (in + rank * count): in place.
struct reduce_scatter_req {
  collective_tag tag;
  const float* in = nullptr;
  float* out = nullptr;
  int64_t count = 0;
  keep_alive owner = nullptr;  // the buffers `in` and `out` point into (float_view)
};

/// all-reduce of a few doubles (the vote: overflow flags and the gradient's sum of squares).
struct all_reduce_req {
  collective_tag tag;
  reduce_op op = reduce_op::sum;
  std::vector<double> values;
};

/// Grouped send/recv (all-to-all-v): sends[p] go to rank p, recvs[p] come from rank p, each
/// list in the order both sides derive from the plan; every segment holds `elem` elements.
struct all_to_all_req {
  collective_tag tag;
  std::vector<std::vector<segment>> sends;
  std::vector<std::vector<segment>> recvs;
  wire_type elem = wire_type::fp32;
};

/// The owners of the request's segments, taken out of them (the pointers stay): a handler that
/// holds them in a local releases the buffers when it returns, before CAF sends its answer.
inline std::vector<keep_alive> take_owners(all_to_all_req& req) {
  std::vector<keep_alive> out;
  for (auto* lists : {&req.sends, &req.recvs})
    for (auto& list : *lists)
      for (auto& s : list)
        if (s.owner)
          out.push_back(std::move(s.owner));
  return out;
}

struct comm_done {
  collective_tag tag;
};

struct all_reduce_result {
  collective_tag tag;
  std::vector<double> values;
};

/// caf comm backend, between the comm actors of two ranks: one rank's contribution, in fp32
/// (`data`) or, for an all-to-all of wire_type::bf16, as bf16 bits (`bf16`).
struct peer_floats {
  collective_tag tag;
  int32_t src = 0;
  std::vector<float> data;
  std::vector<uint16_t> bf16 = {};
};

struct peer_doubles {
  collective_tag tag;
  int32_t src = 0;
  std::vector<double> data;
};

// -- host -> reducer, coordinator -> reducer, reducer -> store -----------------------------------
/// One bucket of one micro-batch's gradient on one rank, packed rank-major for reduce-scatter.
struct micro_grads {
  uint64_t step = 0;
  int32_t micro = 0;
  int32_t bucket = 0;
  // In host memory, or (device gradients under the nccl comm) in the rank's backend's memory,
  // device_size floats. The reducer owns the bucket once handed over and reduces it in place.
  std::shared_ptr<std::vector<float>> data;
  std::shared_ptr<device_buffer> device_data = nullptr;
  int64_t device_size = 0;
  // This rank's part alone, of a gradient the host has already averaged over the ranks
  // (engine::hand_over_reduced): added as it is, no reduce-scatter.
  bool reduced = false;
  // Instead of data: a reduced bucket (device_size floats) as pieces of the caller's gradients
  // (in the rank's backend's memory), which the store reads in its accumulate's pass (no packed
  // copy).
  gradient_pieces pieces = nullptr;
  // The pieces are read only once the step begins (engine::hand_over ahead of the step): the
  // caller may still write them in place until then.
  bool at_step = false;

  int64_t size() const { return data ? static_cast<int64_t>(data->size()) : device_size; }
};

/// All buckets of `step` handed over so far must land before the reply.
struct flush {
  uint64_t step = 0;
};

struct flush_done {
  uint64_t step = 0;
  int32_t micros = 0;  // micro-batches accumulated in this step
};

/// Add a reduced bucket slice to the accumulated gradient shard.
struct accumulate {
  uint64_t step = 0;
  int32_t micro = 0;
  int32_t bucket = 0;
  float_view slice;
  bool from_host = true;  // slice is host memory (caf comm) or the store backend's (nccl)
  // Instead of slice: the bucket read from the caller's gradients.
  gradient_pieces pieces = nullptr;
  // The pieces are read only by the step's first reader (micro_grads::at_step).
  bool at_step = false;
};

struct ack {
  uint64_t step = 0;
};

// -- loss scaler ---------------------------------------------------------------------------------
/// Coordinator -> loss scaler: vote on overflow for `step`. `chunks_ahead`: the step's Muon
/// momentum goes ahead of the vote (muon_momentum writes = spare), the calls of chunks
/// [0, chunks_ahead) sent without waiting for its answer.
struct check_overflow {
  uint64_t step = 0;
  int32_t chunks_ahead = 0;
};

/// Loss scaler -> store: scan the accumulated gradient shard. `chunks_ahead` (from
/// check_overflow): where the store left the Muon gradients' scan to the momentum calls, the
/// scan waits until those chunks' calls are enqueued, scans the other chunks' Muon gradients
/// itself, and sums them all with the buckets'.
struct scan_grads {
  uint64_t step = 0;
  int32_t chunks_ahead = 0;
};

struct grad_scan {
  uint64_t step = 0;
  bool nonfinite = false;
  double sum_squares = 0;  // of the accumulated (scaled) gradient shard
};

struct overflow_report {
  uint64_t step = 0;
  bool overflow = false;
  float scale = 1;       // the scale the host used for this step
  float next_scale = 1;  // the scale for the next step
  // All ranks' sum of squares of the accumulated (still scaled) gradient, from the same vote;
  // meaningful only without overflow.
  double sum_squares = 0;
};

// -- coordinator -> store ------------------------------------------------------------------------
/// Overflow: zero the gradients; parameters, momentum and Adam moments stay untouched.
struct discard_grads {
  uint64_t step = 0;
};

/// The step applies: multiply the accumulated gradient by `factor` = clip / (loss scale *
/// micro-batches), and keep the step's values for the messages after it. `groups[g]`:
/// hyperparameter group g's values (param_layout::hparam_group), one per group of the plan.
/// `touched[i]`: 0 where no rank handed parameter i a gradient in this step; such a parameter keeps
/// its value, its momentum, its moments and its step count. Sent once per applied step, before any
/// other of the step's messages below.
struct unscale_clip {
  uint64_t step = 0;
  float factor = 1;
  std::shared_ptr<const std::vector<group_hparams>> groups = nullptr;
  std::vector<uint8_t> touched = {};
};

/// Where muon_momentum writes the new momentum: over the momentum (`both`: it and u), or into
/// the store's spare momentum (`spare`: u, and the new momentum beside the old, so that
/// Newton-Schulz can start before the vote says the step applies; the spare becomes the
/// momentum when the step finishes applied, and a refused step leaves the momentum as it was).
/// The same bits either way.
enum class momentum_writes : uint8_t { both, spare };

/// Momentum update of one chunk's local shards; the update source u goes to `out` (fp32 or
/// rounded to bf16 bits). An untouched parameter keeps its momentum; its u is its momentum.
struct muon_momentum {
  uint64_t step = 0;
  int32_t chunk = 0;
  float_view out;
  momentum_writes writes = momentum_writes::both;
};

/// Apply one chunk's orthogonalized update `update` under each group's rule (p = p*(1 - lr*wd)
/// - lr*scale*o). fp32 arrives scaled; bf16 bits arrive unscaled, and the store scales each
/// parameter.
struct apply_muon {
  uint64_t step = 0;
  int32_t chunk = 0;
  float_view update;
};

/// The rule's transform after Newton-Schulz (NorMuon's row normalization) of the NS blocks
/// this rank owns in one chunk, `full` being its owner buffer after Newton-Schulz (fp32 or bf16
/// bits): updates their row moments; fp32 blocks then take their scale. Sent only in a step
/// that is applied, where some such block's rule has a transform and its parameter is touched.
struct normuon_step {
  uint64_t step = 0;
  int32_t chunk = 0;
  float_view full;
};

/// MuonClip: scale `n` elements of the parameter shard from `offset` by `factor`.
struct clip_range {
  int64_t offset = 0;
  int64_t n = 0;
  float factor = 1;
};

/// Coordinator -> store, after the step's update: the rank's part of the clipped query and key
/// heads (MuonClip, docs/DESIGN.md §2).
struct qk_clip_scale {
  uint64_t step = 0;
  std::vector<clip_range> ranges = {};
};

/// The non-Muon rule (AdamW) on every non-Muon shard, with the step's values.
struct adamw_step {
  uint64_t step = 0;
};

/// End of an applied step: zero the gradients. `when_done`: answered once the step's device
/// work has finished; otherwise at once (the host orders its own stream after that work).
struct finish_step {
  uint64_t step = 0;
  bool when_done = true;
};

/// Host -> store: the gradients read where the caller keeps them (a hand-over kept until the
/// step) copied into the store's own buffer, before a step() that failed before it began
/// returns: the caller may write or free them from then on. Answered once the copies are
/// enqueued (the host then waits for the rank's backend).
struct copy_in_grads {
  uint64_t step = 0;  // the open step
};

/// Host -> store, as a step whose gradients were handed over ahead of it begins (after the
/// step's stream): what the step's first read would enqueue (the buckets' scans) enqueued now,
/// one hop before the coordinator's first message. No answer.
struct begin_reads {
  uint64_t step = 0;  // the step beginning
};

/// Host -> store: set this rank's parameter shard (initial values).
struct load_params {
  uint64_t step = 0;  // the values hold before this step
  shared_floats shard;
};

/// The store's whole state, copied (tests, checkpoints, reading parameters back).
using store_snapshot = rank_state;

// -- a rank's GPU stream -> the actor that enqueued the work
// -----------------------------------------
/// Sent from the compute backend's completion callback (compute_backend::when_done): everything
/// the actor enqueued before `what` (of `step`, chunk `index`) has finished. On the host backend
/// it is sent at once. This is how GPU completion reaches an actor without a scheduler thread
/// waiting on the GPU.
enum class gpu_event : uint8_t {
  u_on_host,    // coordinator: chunk's u copied to its host mirror (caf comm on a GPU)
  ns_on_host,   // coordinator: chunk's NS done and copied to the host mirror
  scan_landed,  // store: the oldest pending scan's result is on the host
  step_done,    // store: the step's last kernels have finished
};

struct gpu_done {
  uint64_t step = 0;
  gpu_event what = gpu_event::step_done;
  int32_t index = 0;
};

/// Host -> store: replace the whole optimizer state (a checkpoint being loaded); the gradient is
/// zeroed. Sizes must match the rank's buffers.
struct load_state {
  uint64_t step = 0;  // the checkpoint's step
  std::shared_ptr<const rank_state> state;
};

// -- host -> loss scaler (checkpoints) -----------------------------------------------------------
/// Host -> loss scaler: continue from a saved state.
struct restore_scaler {
  uint64_t step = 0;
  loss_scale_snapshot state;
};

// -- host -> coordinator -------------------------------------------------------------------------
/// `groups[g]`: the values of hyperparameter group g (param_layout::hparam_group) for this step;
/// a group beyond the list, or an empty list, runs the engine options'. `touched[i]`: 0 where no
/// rank handed parameter i a gradient in this step (it is left as it is); empty: all touched.
/// Every rank gets the same request.
struct step_request {
  uint64_t step = 0;
  std::vector<group_hparams> groups = {};
  std::vector<uint8_t> touched = {};
  /// MuonClip: this rank's largest attention logit of the step per query head (plan::qk_values,
  /// -inf where none was reported); empty when the plan has no pair.
  std::vector<float> qk_logits = {};
  /// Answered once the step's work is enqueued, not finished (engine::step(cuda_stream)).
  bool enqueued = false;
};

struct step_result {
  uint64_t step = 0;
  bool skipped = false;
  double grad_norm = 0;  // global norm of the raw (unscaled) accumulated gradient
  float clip_coef = 1;   // factor applied to the gradient (1 = not clipped)
  float loss_scale = 1;  // scale used for this step
  float next_loss_scale = 1;
  int32_t micros = 0;
  int32_t ns_params = 0;    // Muon parameters this rank orthogonalized in this step
  int64_t ns_matrices = 0;  // matrices (head blocks count one each) this rank orthogonalized
};

// -- inspect() -----------------------------------------------------------------------------------
// Views and shared buffers are local to one process: their inspect() shows only the size.

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, collective_tag& x) {
  return f(caf::meta::type_name("collective_tag"), x.kind, x.step, x.micro, x.index);
}

#define ZMUON_INSPECT(type, ...)                                   \
  template <class Inspector>                                       \
  typename Inspector::result_type inspect(Inspector& f, type& x) { \
    return f(caf::meta::type_name(#type), __VA_ARGS__);            \
  }

ZMUON_INSPECT(float_view, x.size)
ZMUON_INSPECT(reduce_scatter_req, x.tag, x.count)
ZMUON_INSPECT(all_reduce_req, x.tag, x.op, x.values)
ZMUON_INSPECT(all_to_all_req, x.tag)
ZMUON_INSPECT(comm_done, x.tag)
ZMUON_INSPECT(all_reduce_result, x.tag, x.values)
ZMUON_INSPECT(micro_grads, x.step, x.micro, x.bucket, x.reduced, x.at_step)
ZMUON_INSPECT(flush, x.step)
ZMUON_INSPECT(flush_done, x.step, x.micros)
ZMUON_INSPECT(accumulate, x.step, x.micro, x.bucket, x.slice, x.from_host, x.at_step)
ZMUON_INSPECT(ack, x.step)
ZMUON_INSPECT(check_overflow, x.step, x.chunks_ahead)
ZMUON_INSPECT(scan_grads, x.step, x.chunks_ahead)
ZMUON_INSPECT(grad_scan, x.step, x.nonfinite, x.sum_squares)
ZMUON_INSPECT(overflow_report, x.step, x.overflow, x.scale, x.next_scale, x.sum_squares)
ZMUON_INSPECT(discard_grads, x.step)
ZMUON_INSPECT(normuon_step, x.step, x.chunk, x.full)
ZMUON_INSPECT(muon_momentum, x.step, x.chunk, x.out, x.writes)
ZMUON_INSPECT(apply_muon, x.step, x.chunk, x.update)
ZMUON_INSPECT(adamw_step, x.step)
ZMUON_INSPECT(finish_step, x.step, x.when_done)
ZMUON_INSPECT(clip_range, x.offset, x.n, x.factor)
ZMUON_INSPECT(qk_clip_scale, x.step, x.ranges)
ZMUON_INSPECT(gpu_done, x.step, x.what, x.index)
ZMUON_INSPECT(copy_in_grads, x.step)
ZMUON_INSPECT(begin_reads, x.step)
ZMUON_INSPECT(load_params, x.step)
ZMUON_INSPECT(store_snapshot, x.params, x.grads, x.momentum, x.exp_avg, x.exp_avg_sq, x.adam_steps,
              x.adam_param_steps, x.row_moments)
ZMUON_INSPECT(load_state, x.step)
ZMUON_INSPECT(loss_scale_snapshot, x.scale, x.iter, x.last_overflow_iter, x.hysteresis_left)
ZMUON_INSPECT(restore_scaler, x.step, x.state)
// A group's scalars (the NS options are not shown; the request never leaves its process).
ZMUON_INSPECT(group_hparams, x.muon.lr, x.muon.momentum, x.muon.nesterov, x.muon.weight_decay,
              x.adamw.lr, x.adamw.beta1, x.adamw.beta2, x.adamw.eps, x.adamw.weight_decay)
ZMUON_INSPECT(step_request, x.step, x.groups, x.touched, x.qk_logits, x.enqueued)
// The table is shared within the process: shown by its size.
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, unscale_clip& x) {
  auto groups = static_cast<uint64_t>(x.groups ? x.groups->size() : 0);
  return f(caf::meta::type_name("unscale_clip"), x.step, x.factor, groups, x.touched);
}
ZMUON_INSPECT(step_result, x.step, x.skipped, x.grad_norm, x.clip_coef, x.loss_scale,
              x.next_loss_scale, x.micros, x.ns_params, x.ns_matrices)

#undef ZMUON_INSPECT

// peer_floats and peer_doubles cross processes with the caf backend: their payloads are written
// as raw blocks, bit for bit. CAF 0.17 would otherwise serialize each number through its
// pack754, one by one (~30 MB/s; docs/DECISIONS.md), which also never returns for an
// infinity (it halves it until it is below 2) and does not keep a NaN: an overflowed step's
// vote carries both.
template <class Inspector>
using if_not_serializing =
    std::enable_if_t<!std::is_base_of<caf::serializer, Inspector>::value
                         && !std::is_base_of<caf::deserializer, Inspector>::value,
                     typename Inspector::result_type>;
caf::error inspect(caf::serializer& f, peer_floats& x);
caf::error inspect(caf::deserializer& f, peer_floats& x);
template <class Inspector>
if_not_serializing<Inspector> inspect(Inspector& f, peer_floats& x) {
  auto bytes = static_cast<uint64_t>(x.data.size() * sizeof(float) + x.bf16.size() * 2);
  return f(caf::meta::type_name("peer_floats"), x.tag, x.src, bytes);
}
caf::error inspect(caf::serializer& f, peer_doubles& x);
caf::error inspect(caf::deserializer& f, peer_doubles& x);
template <class Inspector>
if_not_serializing<Inspector> inspect(Inspector& f, peer_doubles& x) {
  return f(caf::meta::type_name("peer_doubles"), x.tag, x.src, x.data);
}

}  // namespace zmuon
