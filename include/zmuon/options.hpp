// Optimizer and engine options: the numerical contract of docs/DESIGN.md §2, with its defaults.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace zmuon {

/// How the Muon update is scaled (docs/DESIGN.md §2; the arithmetic: muon_rule::scale in
/// src/kernels/muon_rule.hpp). Named by `adjust_lr_rule_names` (enum order); the C ABI passes
/// the enum value.
enum class adjust_lr_rule : uint8_t {
  original,         // sqrt(max(1, rows/cols))
  match_rms_adamw,  // 0.2 * sqrt(max(rows, cols))
  spectral,         // sqrt(rows/cols): Dion's adjust_lr_spectral_norm (no max with 1)
  rms,              // 0.2 * sqrt(max(rows, cols)): Dion's adjust_lr_rms_norm
};
inline constexpr const char* adjust_lr_rule_names[] = {"original", "match_rms_adamw", "spectral",
                                                       "rms"};
inline constexpr int kAdjustLrRules =
    static_cast<int>(sizeof(adjust_lr_rule_names) / sizeof(adjust_lr_rule_names[0]));

/// What the Muon phase's gather (u) and scatter (the orthogonalized update) carry.
enum class muon_transport : uint8_t {
  automatic,  // NS's own precision: bf16 with the cuda backend (bf16 NS), fp32 with host
  bf16,       // 2 bytes per element, rounded to nearest even, on every rank and backend
  fp32,       // 4 bytes per element: the exact reference
};

/// How Newton-Schulz is evaluated (both compute the same polynomial of X, docs/DESIGN.md §2).
enum class ns_variant : uint8_t {
  standard,   // per step A = X X^T; B = b*A + c*A*A; X = a*X + B*X
  gram,       // iterate on the small Gram matrix R = X X^T and apply the product Q of the
              // steps' polynomials to X once at the end (kernels/ns_variants.hpp); matrices
              // whose long side is below kGramMinAspect times the short one run `standard`
  automatic,  // the engine's default: on the cuda backend `gram` for batches with enough work
              // that it was measured faster (gpu_automatic_variant, kernels/ns_variants.hpp),
              // else `standard`; `gram` on the host (kHostAutomaticVariant), where no launch
              // overhead offsets its fewer FLOPs
};

/// How every parameter is cut into the ranks' shards (docs/DESIGN.md §3).
enum class shard_layout : uint8_t {
  flat,  // ceil(numel / world) elements a rank: the least padding
  rows,  // whole dim-0 slices, ceil(shape[0] / world) a rank: FSDP2's Shard(0), so that a
         // process's shard of a parameter is its FSDP2 local tensor
};

/// Newton-Schulz iteration parameters.
struct ns_options {
  int steps = 5;
  std::array<float, 3> coefficients{3.4445f, -4.7750f, 2.0315f};  // (a, b, c) of NS5
  /// Optional per-iteration coefficients (e.g. Polar Express, polar_express_schedule() in
  /// kernels/ns_variants.hpp); when non-empty its size must equal `steps` and it replaces
  /// `coefficients`.
  std::vector<std::array<float, 3>> schedule;
  float eps = 1e-7f;
  ns_variant variant = ns_variant::standard;
  /// Gram variant only: the Gram matrix is recomputed from X every this many steps (0: never),
  /// the remedy of the Polar Express paper (arXiv:2505.16932, Appendix J) for the accumulated
  /// product Q growing ill-conditioned in low precision; 1 is the standard iteration. The cuda
  /// backend (bf16) takes 1..3 (kGramMaxBlockBf16, kernels/ns_variants.hpp).
  int gram_restart = 3;
};

inline ns_options automatic_ns() {
  ns_options ns;
  ns.variant = ns_variant::automatic;
  return ns;
}

/// Which update the Muon parameters take (docs/DESIGN.md §2): the transform after
/// Newton-Schulz of the group's rule (src/kernels/muon_rule.hpp), which the backends apply in
/// compute_backend::post_ns. Named by `muon_variant_names` (enum order); the C ABI passes the
/// enum value.
enum class muon_variant : uint8_t {
  muon,     // the orthogonalized momentum, scaled by adjust_lr
  normuon,  // NorMuon (arXiv:2510.05491): the orthogonalized momentum normalized per row by an
            // EMA of its rows' mean squares, its Frobenius norm restored, then scaled
};
inline constexpr const char* muon_variant_names[] = {"muon", "normuon"};
inline constexpr int kMuonVariants =
    static_cast<int>(sizeof(muon_variant_names) / sizeof(muon_variant_names[0]));

struct muon_options {
  float lr = 0.02f;
  float momentum = 0.95f;
  bool nesterov = true;
  float weight_decay = 0.0f;
  adjust_lr_rule adjust_lr = adjust_lr_rule::original;
  /// The plain NS5 of docs/DESIGN.md §2 with the variant left to the backend
  /// (ns_variant::automatic); a bare ns_options{} (the kernels' API) is `standard`.
  ns_options ns = automatic_ns();
  muon_transport transport = muon_transport::automatic;  // gather / scatter element type
  /// MuonClip's threshold tau (Kimi K2, arXiv:2507.20534) for the group's query/key pairs
  /// (engine::add_qk_clip); 0 = off. A head whose step max logit exceeds tau is scaled down.
  float qk_clip_tau = 0.0f;
  /// Cautious weight decay (arXiv:2510.12402): decay only where p * update >= 0.
  bool cautious_weight_decay = false;
  muon_variant variant = muon_variant::muon;
  float normuon_beta2 = 0.95f;  // NorMuon's row second-moment EMA
  float normuon_eps = 1e-8f;    // NorMuon's o / (sqrt(v) + eps)
};

/// The update rule of the parameters that do not take Muon (docs/DESIGN.md §2). Its arithmetic
/// is in src/kernels/scalar_rules.hpp. Groups name it by `scalar_algorithm_names` (enum order);
/// the C ABI passes the enum value.
enum class scalar_algorithm : uint8_t {
  adamw,  // bias-corrected AdamW, decoupled weight decay
  lion,   // Lion (arXiv:2302.06675): the sign of an interpolated momentum; lr, betas, decay
};
inline constexpr const char* scalar_algorithm_names[] = {"adamw", "lion"};
inline constexpr int kScalarAlgorithms =
    static_cast<int>(sizeof(scalar_algorithm_names) / sizeof(scalar_algorithm_names[0]));

/// The non-Muon group's values; `algorithm` reads lr, betas, weight_decay (and AdamW eps).
struct adamw_options {
  float lr = 3e-4f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-10f;
  float weight_decay = 0.0f;
  /// Cautious weight decay (arXiv:2510.12402): decay only where p * update >= 0.
  bool cautious_weight_decay = false;
  scalar_algorithm algorithm = scalar_algorithm::adamw;
};

/// Dynamic fp16 loss scaling, DeepSpeed's defaults. `loss_scale > 0` means a static scale.
struct fp16_options {
  bool enabled = false;
  float loss_scale = 0.0f;
  int initial_scale_power = 16;
  int loss_scale_window = 1000;
  int hysteresis = 2;
  float min_loss_scale = 1.0f;
  float scale_factor = 2.0f;
};

/// The longest timeout (engine_options::timeout_ms, zmuon.heartbeat_timeout_ms): 30 days, far
/// below what overflows a deadline on std::chrono's clocks.
inline constexpr int64_t kMaxTimeoutMs = int64_t{30} * 24 * 3600 * 1000;

/// The most ranks one process runs (engine::create's world, create_node's ranks; the config's
/// zmuon.ranks): each is four actors and a comm, and starting thousands took minutes.
inline constexpr int kMaxRanksPerProcess = 1024;

struct engine_options {
  int world = 4;                             // in-process ranks
  float gradient_clipping = 0.0f;            // max global norm of the raw gradient; 0 = off
  int64_t reduce_bucket_size = 500'000'000;  // elements per reduce bucket and per Muon chunk
  bool per_head_muon = true;                 // honour `heads` given at registration
  shard_layout layout = shard_layout::flat;  // the shards' cut (zmuon.shard_layout)
  fp16_options fp16;
  muon_options muon;
  adamw_options adamw;
  std::string compute = "host";  // compute backend: host | cuda
  // On cuda, the GPU of local rank 0 (zmuon.device): local rank i runs on GPU first_device + i,
  // modulo the visible GPUs (a process of a job with every GPU visible names its own).
  int first_device = 0;
  // Communication backend: caf | nccl | auto. auto is nccl where every rank has a GPU of its
  // own on the cuda backend (nccl built in), and caf otherwise: in one process, a GPU for each
  // rank; in a multi-process job, the rendezvous decides for all nodes from the GPUs each brings
  // (their UUIDs: one per rank, none listed twice). engine::options() shows the choice. caf
  // moves device memory through the host, which on one GPU costs far more than the step
  // (docs/PERFORMANCE.md).
  std::string comm = "auto";
  int64_t timeout_ms = 60'000;  // a request not answered in this time is an error (<= 30 days)
  // The message trace (docs/DESIGN.md §9) goes into this directory; empty: the environment's
  // ZMUON_TRACE, else off.
  std::string trace_dir;
  // With the trace on, every compute-backend call is a `compute` span too (on CUDA each call is
  // then timed with two events). Off: the messages only (benchmarks that time the step traced).
  bool trace_compute_calls = true;

  // reduce() keeps at most this many of a rank's reduce buckets handed to its reducer and not yet
  // landed in the store (it waits for the oldest first), which bounds the buckets' memory (host
  // or device input, the reducer's output); 0 = unbounded. Applies when the engine drives one
  // local rank (one process per GPU, the launcher's processes): a host that drives several ranks
  // calls reduce() for them one after another, and a bucket lands only once every rank handed it
  // over, so there the buckets stay in flight until step().
  int max_buckets_in_flight = 2;

  // Newton-Schulz before the vote's answer (zmuon.momentum_before_vote): auto | on | off. Where
  // on, a step that can only be refused by a non-finite gradient (one rank in all, no clipping,
  // no fp16 loss scale, no NorMuon) computes each chunk's u, and its new momentum into a spare
  // buffer (4 bytes a Muon parameter), and starts its Newton-Schulz while the vote is on its
  // way; the spare becomes the momentum, and the update is applied, once the vote says the step
  // applies. The vote's scan of the Muon gradients then comes from those momentum passes.
  // auto: on for the cuda backend, where the vote's trip through the host would leave the GPU
  // idle.
  std::string momentum_before_vote = "auto";
};

}  // namespace zmuon
