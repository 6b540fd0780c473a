/* zmuon's C ABI: the engine (zmuon/engine.hpp) behind an opaque handle, for hosts in C, Python
 * (ctypes), Rust, ... Every function returns a zmuon_status; on failure the thread's last error
 * (zmuon_last_error) holds a message naming what is wrong, and no output is written. Nothing is
 * thrown across this boundary. Buffers are fp32, row-major, and only read or written during the
 * call.
 *
 *   zmuon_engine* eng;
 *   zmuon_engine_create("{\"zmuon\": {\"ranks\": 1}}", NULL, 0, &eng);
 *   int64_t shape[2] = {128, 64};
 *   zmuon_engine_add_parameter(eng, "fc1.weight", shape, 2, ZMUON_GROUP_AUTO, 0, init, 128 * 64);
 *   zmuon_tensor g = {"fc1.weight", grad, 128 * 64, ZMUON_HOST};
 *   zmuon_engine_reduce(eng, 0, &g, 1);          // per rank, per micro-batch
 *   zmuon_step_info info;
 *   zmuon_engine_step(eng, &info);
 *   zmuon_tensor p = {"fc1.weight", param, 128 * 64, ZMUON_HOST};
 *   zmuon_engine_gather_params(eng, &p, 1);      // full parameters into the caller's buffers
 *   zmuon_engine_destroy(eng);
 *
 * Threads: zmuon_engine_reduce for different ranks may run on different threads at once; no
 * other call may overlap another on the same engine. After a failure that may leave the ranks
 * part of the way through a step (a timeout, a failed rank), every later call fails with
 * ZMUON_BAD_STATE naming it; on a process of a multi-process job that lost another process,
 * with ZMUON_COMM_FAILURE naming the lost node.
 */
#ifndef ZMUON_ZMUON_H
#define ZMUON_ZMUON_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define ZMUON_API __attribute__((visibility("default")))
#else
#define ZMUON_API
#endif

/* The same codes as zmuon::errc. */
typedef enum zmuon_status {
  ZMUON_OK = 0,
  ZMUON_INVALID_ARGUMENT = 1,    /* a value out of range, a null pointer, bad JSON, a bad key */
  ZMUON_UNKNOWN_PARAMETER = 2,   /* a name that was never registered */
  ZMUON_DUPLICATE_PARAMETER = 3, /* a name registered twice */
  ZMUON_SHAPE_MISMATCH = 4,      /* a buffer of the wrong size */
  ZMUON_BAD_STATE = 5,           /* a call out of order */
  ZMUON_COMM_FAILURE = 6,        /* a peer died, a collective failed */
  ZMUON_TIMEOUT = 7,             /* a request was not answered in time */
  ZMUON_IO_ERROR = 8,            /* a file could not be read or written */
  ZMUON_INTERNAL = 9,            /* a bug in zmuon */
  ZMUON_UNSUPPORTED = 10,        /* not available in this build/backend (e.g. device buffers) */
  ZMUON_DEVICE_FAILURE = 11      /* a CUDA, cuBLAS or NCCL call failed (the rank's GPU is lost) */
} zmuon_status;

/* Which optimizer a parameter uses; AUTO is the default rule (Muon for ndim >= 2 unless the
 * name contains "embed" or "lm_head"). */
typedef enum zmuon_group {
  ZMUON_GROUP_AUTO = 0,
  ZMUON_GROUP_MUON = 1,
  ZMUON_GROUP_ADAMW = 2
} zmuon_group;

/* zmuon_tensor.device: ZMUON_HOST for host memory, else a CUDA device ordinal. */
#define ZMUON_HOST (-1)

typedef struct zmuon_tensor {
  const char* name;
  void* data; /* fp32 elements; read by reduce, written by gather_params */
  int64_t numel;
  int32_t device; /* ZMUON_HOST or a CUDA device ordinal */
} zmuon_tensor;

typedef struct zmuon_step_info {
  uint64_t step;
  int32_t skipped;  /* 1: a non-finite gradient somewhere, nothing was applied */
  double grad_norm; /* global norm of the raw accumulated gradient */
  float clip_coef;  /* 1 = not clipped */
  float loss_scale; /* the scale the host used for this step */
  float next_loss_scale;
  int32_t micro_batches;
  int32_t ns_params;   /* Muon parameters orthogonalized, summed over ranks */
  int64_t ns_matrices; /* NS matrices (head blocks count one each), summed over ranks */
} zmuon_step_info;

typedef struct zmuon_engine zmuon_engine;

/* The message of the last failed call on this thread ("" if none); valid until the next failing
 * call on this thread. */
ZMUON_API const char* zmuon_last_error(void);
/* "0.1.0" */
ZMUON_API const char* zmuon_version(void);
/* The name of a status code ("invalid_argument"). */
ZMUON_API const char* zmuon_status_name(int status);

/* The library's log (zmuon/log.hpp): a lost node, a route through node 0. By default each
 * message is a line on stderr, prefixed "zmuon: ". The library never exits the process. */
typedef enum zmuon_log_level {
  ZMUON_LOG_ERROR = 0,
  ZMUON_LOG_WARN = 1,
  ZMUON_LOG_INFO = 2,
  ZMUON_LOG_DEBUG = 3,
  ZMUON_LOG_TRACE = 4
} zmuon_log_level;
/* Messages at `level` or more severe are logged (initially $ZMUON_LOG_LEVEL, else
 * ZMUON_LOG_INFO). ZMUON_INVALID_ARGUMENT outside [ZMUON_LOG_ERROR, ZMUON_LOG_TRACE]. */
ZMUON_API int zmuon_set_log_level(int level);
/* Sends every message logged to `callback` instead of stderr: a zmuon_log_level, one line
 * (valid during the call) and `user`. One call at a time, from whichever thread logs; it should
 * return quickly and not call zmuon. NULL restores stderr. */
typedef void (*zmuon_log_callback)(int level, const char* message, void* user);
ZMUON_API int zmuon_set_log_callback(zmuon_log_callback callback, void* user);

/* Creates an engine from a DeepSpeed-style JSON config (NULL or "": defaults) and
 * `n_overrides` "key.path=value" overrides. */
ZMUON_API int zmuon_engine_create(const char* config_json, const char* const* overrides,
                                  size_t n_overrides, zmuon_engine** out);
/* The same from a JSON file. */
ZMUON_API int zmuon_engine_create_from_file(const char* path, const char* const* overrides,
                                            size_t n_overrides, zmuon_engine** out);
/* One process of a multi-process job (engine::create_node), for hosts started by torchrun or
 * the like: `nodes` processes, this one `node_rank` in [0, nodes), running `ranks` ranks (one
 * per GPU under nccl); node 0 publishes the rendezvous at `master` ("HOST:PORT") and the others
 * find it there. Register the parameters, then zmuon_engine_start() joins the job, blocking
 * until every process has joined: all must bring the same config (zmuon.ranks aside) and
 * parameter table, otherwise every process fails naming the first difference. reduce() then
 * takes this process's ranks [first_rank, first_rank + ranks) of the job's world; step(),
 * gather_params() and the checkpoints are collectives every process calls in the same order.
 * Destroying the engine waits until every process is done (up to zmuon.timeout_ms).
 * The processes authenticate each other under TLS with the job's secret, read from
 * $ZMUON_JOB_SECRET or the file $ZMUON_JOB_SECRET_FILE (the same in every process; one that
 * is easy to guess is refused unless $ZMUON_WEAK_SECRET_OK=1: docs/SECURITY.md);
 * without one a job of two or more processes fails to start unless $ZMUON_INSECURE=1 (plain TCP
 * on loopback) or any-host (docs/SECURITY.md). */
ZMUON_API int zmuon_engine_create_node(const char* config_json, const char* const* overrides,
                                       size_t n_overrides, int32_t nodes, int32_t node_rank,
                                       int32_t ranks, const char* master, zmuon_engine** out);
/* Lays out the shards and starts the ranks (the first reduce or step does it otherwise); a
 * process made by zmuon_engine_create_node joins its job here. */
ZMUON_API int zmuon_engine_start(zmuon_engine* eng);
/* The first rank this process runs (0 unless it is one process of a multi-process job). */
ZMUON_API int zmuon_engine_first_rank(const zmuon_engine* eng, int32_t* out);
/* Sums `n` values (e.g. the loss of this process's share) over the processes of a multi-process
 * job, in place: every process calls it with its own and gets the sums. In one process the
 * values stay as they are. */
ZMUON_API int zmuon_engine_sum_over_nodes(zmuon_engine* eng, double* values, size_t n);
/* Stops the engine's ranks and frees the handle. NULL is fine. */
ZMUON_API void zmuon_engine_destroy(zmuon_engine* eng);

/* Ranks of the job (in-process ranks, or all processes' once a node has joined). */
ZMUON_API int zmuon_engine_world(const zmuon_engine* eng, int32_t* out);

/* Registers a parameter (before the first reduce or step). `init` (numel elements) may be NULL
 * for zeros, with numel 0 or the shape's element count; `heads` > 0 makes Muon orthogonalize
 * `heads` row blocks independently. */
ZMUON_API int zmuon_engine_add_parameter(zmuon_engine* eng, const char* name, const int64_t* shape,
                                         int32_t ndim, int32_t group, int64_t heads,
                                         const float* init, int64_t numel);
/* 1 when the registered parameter `name` uses Muon, 0 when it uses AdamW. */
ZMUON_API int zmuon_engine_param_uses_muon(const zmuon_engine* eng, const char* name, int32_t* out);

/* Hands over rank `rank`'s gradients of one micro-batch (parameters left out count as zero). */
ZMUON_API int zmuon_engine_reduce(zmuon_engine* eng, int32_t rank, const zmuon_tensor* grads,
                                  size_t n);
/* The same, stream-ordered for device gradients written on the CUDA stream `cuda_stream` (a
 * cudaStream_t; NULL: the default stream): read after the work queued there so far, and the work
 * queued there afterwards waits until they are read; returns without waiting for the GPU. A
 * stream on another GPU, or capturing a CUDA graph, is ZMUON_INVALID_ARGUMENT. */
ZMUON_API int zmuon_engine_reduce_on_stream(zmuon_engine* eng, int32_t rank,
                                            const zmuon_tensor* grads, size_t n, void* cuda_stream);
/* One micro-batch of every local rank at once: grads[i] (counts[i] tensors) for local rank
 * first_rank + i, `ranks` of them (this process's local ranks). Every rank's gradients are
 * checked before any is handed over; then each rank hands over on a thread of its own inside
 * the engine, within the bound on reduce buckets in flight (zmuon.max_buckets_in_flight), which
 * zmuon_engine_reduce rank after rank on one thread cannot keep with several local ranks. */
ZMUON_API int zmuon_engine_reduce_all(zmuon_engine* eng, const zmuon_tensor* const* grads,
                                      const size_t* counts, int32_t ranks);
/* Hands over rank `rank`'s part of one micro-batch's gradient that the host already averaged
 * over the ranks (DDP's all-reduce, FSDP2's reduce-scatter): no reduce-scatter runs. Each tensor
 * is the whole averaged gradient, or exactly the rank's shard (its elements of the flattened
 * tensor: under zmuon.shard_layout "rows", FSDP2's local tensor; an empty shard may be NULL).
 * Every rank hands over a micro-batch the same way (this or zmuon_engine_reduce). `cuda_stream`
 * as zmuon_engine_reduce_on_stream's, or NULL: read during the call. */
ZMUON_API int zmuon_engine_hand_over_reduced(zmuon_engine* eng, int32_t rank,
                                             const zmuon_tensor* grads, size_t n,
                                             void* cuda_stream);
/* zmuon_engine_hand_over's flags. REDUCED: as zmuon_engine_hand_over_reduced (else as
 * zmuon_engine_reduce). KEPT_UNTIL_STEP: the caller keeps every device gradient it hands over
 * unwritten and allocated until the next zmuon_engine_step returns (PyTorch's .grad read at
 * step()); where the rank's part needs no reduce-scatter (REDUCED, or a job of one rank) and
 * every gradient is in device memory under the nccl comm, the engine then reads them where they
 * lie during the step and the call returns without waiting for those reads; on the host backend
 * the same holds for host gradients. AHEAD_OF_STEP (with KEPT_UNTIL_STEP): handed over before
 * they are final (as a backward pass ends): nothing reads them until the next zmuon_engine_step
 * begins, and the caller may write them in place until then (zmuon_engine_step_on_stream reads
 * them after that stream's work). The rank's next hand-over, a checkpoint's save or load or a
 * state write withdraws it first (zmuon_engine_handed_over then says 0); ZMUON_UNSUPPORTED,
 * nothing handed over, where the step could not read them where they lie. */
#define ZMUON_HAND_OVER_REDUCED 1u
#define ZMUON_HAND_OVER_KEPT_UNTIL_STEP 2u
#define ZMUON_HAND_OVER_AHEAD_OF_STEP 4u
/* zmuon_engine_reduce_on_stream or zmuon_engine_hand_over_reduced (by `flags`), stream-ordered
 * on `cuda_stream`; an unknown flag is ZMUON_INVALID_ARGUMENT. */
ZMUON_API int zmuon_engine_hand_over(zmuon_engine* eng, int32_t rank, const zmuon_tensor* grads,
                                     size_t n, void* cuda_stream, uint32_t flags);
/* The micro-batches local rank `rank` has handed over in the open step, into *micro_batches (a
 * hand-over ahead of the step counts while it stands). */
ZMUON_API int zmuon_engine_handed_over(zmuon_engine* eng, int32_t rank, int32_t* micro_batches);
/* Begins the open step's reads of gradients handed over with AHEAD_OF_STEP, after `cuda_stream`'s
 * work, before the zmuon_engine_step_on_stream that follows: from this call on the caller may
 * no longer write them. Nothing where none was handed over so; a stream that cannot be waited
 * for (one capturing a CUDA graph, another GPU's) is refused by name. */
ZMUON_API int zmuon_engine_begin_step(zmuon_engine* eng, void* cuda_stream);
/* Writes local rank `rank`'s shard of the parameters named in `params` (buffers of the shard's
 * size) into their buffers: no collective. `cuda_stream` as
 * zmuon_engine_gather_params_on_stream's, or NULL: written during the call. */
ZMUON_API int zmuon_engine_shard_params(zmuon_engine* eng, int32_t rank, const zmuon_tensor* params,
                                        size_t n, void* cuda_stream);
/* Sets local rank `rank`'s shard of the parameters named in `params` (host memory, each the
 * whole tensor or the rank's shard alone) between steps, with no collective: a process that
 * holds only its shards (FSDP2) registers without values and loads them here. */
ZMUON_API int zmuon_engine_load_shard_params(zmuon_engine* eng, int32_t rank,
                                             const zmuon_tensor* params, size_t n);
/* Parameter `name`'s fp32 master itself, where this process runs one rank: out->data points
 * into the engine's own buffer (host memory, or memory of CUDA device out->device), valid until
 * zmuon_engine_destroy; out->name is `name`. The whole parameter in a job of one rank, else the
 * rank's shard (elements [rank * shard_len, + out->numel) of the flattened tensor, possibly
 * none), followed by the shard's padding up to shard_len elements (zmuon.shard_layout "rows":
 * ceil(rows / world) rows, FSDP2's padded shard). A tensor made a view of it is written in place by
 * each step (nothing to gather), and what the caller writes there between steps is what the next
 * step starts from. A process of several ranks: ZMUON_UNSUPPORTED. */
ZMUON_API int zmuon_engine_master(zmuon_engine* eng, const char* name, zmuon_tensor* out);
/* One optimizer step over everything handed over since the last one. `out` may be NULL. Returns
 * once the step's work has finished. */
ZMUON_API int zmuon_engine_step(zmuon_engine* eng, zmuon_step_info* out);
/* The same, stream-ordered on the CUDA stream `cuda_stream` (cudaStream_t; NULL: the default
 * stream), as PyTorch's optimizer steps: returns once the step is decided and its
 * device work enqueued (`out` is complete then), and the work queued on `cuda_stream` afterwards
 * waits for that work on the device. The engine's own reads of parameters and state wait
 * themselves. */
ZMUON_API int zmuon_engine_step_on_stream(zmuon_engine* eng, void* cuda_stream,
                                          zmuon_step_info* out);
/* Writes the full parameters named in `params` into their buffers. */
ZMUON_API int zmuon_engine_gather_params(zmuon_engine* eng, const zmuon_tensor* params, size_t n);
/* The same, stream-ordered for device buffers used on the CUDA stream `cuda_stream` (NULL: the
 * default stream): written after the work queued there so far, and the work queued there
 * afterwards waits until they are written; returns without waiting for the GPU. A stream on
 * another GPU, or capturing a CUDA graph, is ZMUON_INVALID_ARGUMENT. */
ZMUON_API int zmuon_engine_gather_params_on_stream(zmuon_engine* eng, const zmuon_tensor* params,
                                                   size_t n, void* cuda_stream);
/* The loss scale for the next step (1 without fp16). */
ZMUON_API int zmuon_engine_loss_scale(zmuon_engine* eng, float* out);
/* Constant learning rates from the next step on (a host-side schedule calls this each step).
 * A negative value keeps that group's current schedule. */
ZMUON_API int zmuon_engine_set_lr(zmuon_engine* eng, float muon_lr, float adam_lr);

/* Hyperparameter groups (engine::set_hparam_group / set_group_hparams), as torch's param groups:
 * each parameter steps with its group's values, read at every step. A group never set runs the
 * config's values with zmuon_engine_set_lr's rates. */
typedef enum zmuon_ns_variant {
  ZMUON_NS_STANDARD = 0,
  ZMUON_NS_GRAM = 1,
  ZMUON_NS_AUTO = 2
} zmuon_ns_variant;
typedef enum zmuon_adjust_lr {
  ZMUON_ADJUST_LR_ORIGINAL = 0,        /* sqrt(max(1, rows/cols)) */
  ZMUON_ADJUST_LR_MATCH_RMS_ADAMW = 1, /* 0.2 * sqrt(max(rows, cols)) */
  ZMUON_ADJUST_LR_SPECTRAL = 2,        /* sqrt(rows/cols): Dion's spectral_norm */
  ZMUON_ADJUST_LR_RMS = 3              /* 0.2 * sqrt(max(rows, cols)): Dion's rms_norm */
} zmuon_adjust_lr;
typedef struct zmuon_group_hparams {
  float lr;           /* of the group's Muon and AdamW parameters */
  float weight_decay; /* decoupled: p *= 1 - lr * weight_decay */
  float momentum;     /* Muon */
  int32_t nesterov;   /* Muon: 1 Nesterov, 0 plain momentum */
  float beta1, beta2; /* AdamW */
  float eps;          /* AdamW */
  int32_t ns_steps;   /* Muon's Newton-Schulz; the config's coefficient schedule stays while */
  float ns_coefficients[3]; /* ns_steps and ns_coefficients are the config's */
  float ns_eps;
  int32_t ns_variant; /* zmuon_ns_variant */
  int32_t adjust_lr;  /* zmuon_adjust_lr */
  float qk_clip_tau;  /* MuonClip's threshold for the group's query/key pairs; 0: off */
} zmuon_group_hparams;
/* Puts parameter `name` in group `group` (0 by default; [0, 4096)); before the first reduce or
 * step. Every process registers the same groups. */
ZMUON_API int zmuon_engine_set_hparam_group(zmuon_engine* eng, const char* name, int32_t group);
/* Group `group`'s values from the next step on (checked; a bad one changes nothing). */
ZMUON_API int zmuon_engine_set_group_hparams(zmuon_engine* eng, int32_t group,
                                             const zmuon_group_hparams* values);

/* Muon blocks (engine::set_muon_blocks), before the first reduce or step: `split_sizes` (n row
 * blocks summing to one matrix's rows, e.g. a fused QKV's {q, k, v}; NULL with n 0: one block)
 * with `split_heads` (n heads per block, 0: whole; may be NULL), and `view`: a 3-D parameter is
 * an expert stack [E, rows, cols] by default (ZMUON_VIEW_AUTO). */
typedef enum zmuon_matrix_view {
  ZMUON_VIEW_AUTO = 0,         /* ndim 3: expert stack; otherwise [shape[0], rest] */
  ZMUON_VIEW_EXPERT_STACK = 1, /* [E, rows, prod(rest)]: E matrices */
  ZMUON_VIEW_FLATTEN = 2       /* [shape[0], prod(rest)]: one matrix */
} zmuon_matrix_view;
ZMUON_API int zmuon_engine_set_muon_blocks(zmuon_engine* eng, const char* name,
                                           const int64_t* split_sizes, const int64_t* split_heads,
                                           size_t n, int32_t view);
/* The order the host holds Muon matrix `name`'s elements in (engine::set_box_order), before the
 * first reduce or step: n boxes of its matrix view [shape[0], prod(rest)] back to back, each
 * row-major, tiling it; `boxes` holds 4 values a box: row0, rows, col0, cols. n 0: row-major. */
ZMUON_API int zmuon_engine_set_box_order(zmuon_engine* eng, const char* name, const int64_t* boxes,
                                         size_t n);
/* MuonClip (Kimi K2): pairs query parameter `query` (query_heads heads of rows) with key `key`
 * (key_heads; GQA: dividing query_heads), before the first reduce or step. After each applied
 * step, a head whose largest logit over every rank's reports exceeds its group's qk_clip_tau has
 * its query and key rows scaled by sqrt(tau / max). */
ZMUON_API int zmuon_engine_add_qk_clip(zmuon_engine* eng, const char* query, const char* key,
                                       int64_t query_heads, int64_t key_heads);
/* Rank `rank`'s largest pre-softmax logit of one micro-batch per head of `query` (n =
 * query_heads values, finite or -inf for a head not computed on this rank); the step takes the
 * max over all reports since the last step. */
ZMUON_API int zmuon_engine_report_qk_logits(zmuon_engine* eng, int32_t rank, const char* query,
                                            const float* max_logits, size_t n);
/* A group's update rule beside its hyperparameters. Cautious weight decay (arXiv:2510.12402)
 * decays only the elements where the parameter and its update have the same sign: for Muon the
 * scaled orthogonalized update, for AdamW m_hat / (sqrt(v_hat) + eps). NorMuon (arXiv:2510.05491)
 * normalizes each row of the orthogonalized update by an EMA of its mean square, then restores
 * the update's Frobenius norm before the adjust_lr scale. */
typedef enum zmuon_muon_variant {
  ZMUON_VARIANT_MUON = 0,
  ZMUON_VARIANT_NORMUON = 1
} zmuon_muon_variant;
/* The rule of the group's non-Muon parameters (zmuon::scalar_algorithm, in its order). */
typedef enum zmuon_scalar_algorithm {
  ZMUON_ALGORITHM_ADAMW = 0, /* bias-corrected AdamW: lr, beta1, beta2, eps, weight_decay */
  ZMUON_ALGORITHM_LION = 1   /* Lion (arXiv:2302.06675): lr, beta1, beta2, weight_decay */
} zmuon_scalar_algorithm;
typedef struct zmuon_update_rule {
  int32_t cautious_weight_decay; /* 1: cautious (Muon and AdamW), 0: plain decoupled decay */
  int32_t variant;               /* zmuon_muon_variant */
  float normuon_beta2;           /* NorMuon's row second-moment EMA, in [0, 1) */
  float normuon_eps;             /* NorMuon's o / (sqrt(v) + eps), > 0 */
  int32_t algorithm;             /* zmuon_scalar_algorithm of the non-Muon parameters */
} zmuon_update_rule;
/* zmuon_engine_set_group_hparams with the group's update rule (`rule` NULL: the config's). */
ZMUON_API int zmuon_engine_set_group_rule(zmuon_engine* eng, int32_t group,
                                          const zmuon_group_hparams* values,
                                          const zmuon_update_rule* rule);

/* Where a step's time goes (engine::time_backend_calls / write_call_timeline): `on` 1 times
 * every compute-backend call from the next one on (on CUDA with two events on its stream), 0
 * stops. Off by default. write_call_timeline ends the timing period of every rank this process
 * runs and writes the calls timed in it to `path` as Chrome Trace Event JSON (open it in
 * ui.perfetto.dev): a process per rank, a row for the main stream and one per Newton-Schulz
 * lane. It fails while timing is off. */
ZMUON_API int zmuon_engine_time_calls(zmuon_engine* eng, int32_t on);
ZMUON_API int zmuon_engine_write_call_timeline(zmuon_engine* eng, const char* path);

/* Checkpoints (engine::save_checkpoint / load_checkpoint): every rank's shards of parameters,
 * momentum and Adam moments plus a manifest, written atomically under `dir`; loading reshards
 * onto this engine's world size. Only between steps. `step_out` (may be NULL) gets the step the
 * checkpoint was saved at; the next step() is that step + 1. */
ZMUON_API int zmuon_engine_save_checkpoint(zmuon_engine* eng, const char* dir);
ZMUON_API int zmuon_engine_load_checkpoint(zmuon_engine* eng, const char* dir, uint64_t* step_out);

/* The optimizer state by parameter name, without files (engine::read_state / write_state): what
 * a checkpoint holds, in the caller's host buffers. Per parameter its fp32 master, its Muon
 * momentum or AdamW moments and AdamW step count; per engine the step and the loss scaler. */
typedef enum zmuon_state_scope {
  ZMUON_STATE_FULL = 0, /* whole tensors; in a multi-process job a collective */
  ZMUON_STATE_LOCAL = 1 /* the elements this process's ranks hold; no collective */
} zmuon_state_scope;
typedef struct zmuon_state_info {
  uint64_t step;      /* steps done; the next step is step + 1 */
  int64_t adam_steps; /* AdamW steps applied */
  float loss_scale;   /* the dynamic loss scaler's state (DeepSpeed's counters) */
  int64_t scaler_iter;
  int64_t scaler_last_overflow_iter;
  int32_t scaler_hysteresis_left;
} zmuon_state_info;
typedef struct zmuon_param_state {
  const char* name;
  int64_t offset;    /* first element (of the flattened tensor) the buffers hold: 0 when full */
  int64_t numel;     /* elements each non-NULL buffer holds */
  float* param;      /* the fp32 master */
  float* momentum;   /* Muon parameters only, else NULL */
  float* exp_avg;    /* AdamW parameters only, else NULL */
  float* exp_avg_sq; /* AdamW parameters only, else NULL */
  int64_t adam_step; /* AdamW: the steps that touched it */
} zmuon_param_state;
/* Elements [*offset, *offset + *numel) of parameter `name` that read_state gives in `scope`. */
ZMUON_API int zmuon_engine_state_range(zmuon_engine* eng, const char* name, int32_t scope,
                                       int64_t* offset, int64_t* numel);
/* Fills each of the `n` named entries' non-NULL buffers (numel as zmuon_engine_state_range
 * says), its offset and AdamW step count, and `info` (may be NULL). A buffer of the wrong size,
 * or for a state the parameter does not keep, is an error before anything is written. */
ZMUON_API int zmuon_engine_read_state(zmuon_engine* eng, int32_t scope, zmuon_param_state* params,
                                      size_t n, zmuon_state_info* info);
/* Loads whole tensors (offset 0), or per parameter exactly this process's elements (offset and
 * numel as zmuon_engine_state_range gives them in ZMUON_STATE_LOCAL scope), from an engine of
 * any rank count: every registered parameter
 * once with the buffers its algorithm keeps (the others NULL), finite values, and `info`. All is
 * checked first: a bad state is an error naming it, and changes nothing. Only between steps; in
 * a multi-process job a collective, every process passing the same state. */
ZMUON_API int zmuon_engine_write_state(zmuon_engine* eng, const zmuon_param_state* params, size_t n,
                                       const zmuon_state_info* info);

/* NorMuon's row second moments by Muon parameter: `rows` values, one per row of its matrix view
 * (an expert stack [E, r, c]: E * r; zeros before any NorMuon step). read_row_moments fills
 * `values` (whole, read as read_state(ZMUON_STATE_FULL) reads; in a multi-process job a
 * collective); write_state_rows is zmuon_engine_write_state with the row moments of the `n_rows`
 * entries (the others zeros). */
typedef struct zmuon_row_moments {
  const char* name;
  float* values;
  int64_t rows;
} zmuon_row_moments;
ZMUON_API int zmuon_engine_read_row_moments(zmuon_engine* eng, zmuon_row_moments* entries,
                                            size_t n);
ZMUON_API int zmuon_engine_write_state_rows(zmuon_engine* eng, const zmuon_param_state* params,
                                            size_t n, const zmuon_state_info* info,
                                            const zmuon_row_moments* rows, size_t n_rows);

/* -- DeepSpeed configs: "auto" from the host, the notes, the scheduled rates, the metrics ------
 * An engine made from a config as zmuon_engine_create does, with `host_json` (NULL or "": none)
 * the host's values for the config's "auto" (an object: "host" ("python" lets the tensorboard,
 * wandb and comet sections through to the metrics callback), "lr", "muon_lr", "adam_lr",
 * "weight_decay", "momentum", "betas", "eps", "gradient_clipping", "micro_batch", "gas", "fp16",
 * "bf16", "reduce_bucket_size", "warmup_num_steps", "total_num_steps"). It keeps the config's
 * notes, runs its scheduler, and writes its csv_monitor and zmuon.metrics_file after each step. */
ZMUON_API int zmuon_engine_create_with_host(const char* config_json, const char* const* overrides,
                                            size_t n_overrides, const char* host_json,
                                            zmuon_engine** out);
/* The config's notes (keys accepted with no effect, "auto" resolved), one a line; "" when none.
 * Valid while the engine lives. */
ZMUON_API int zmuon_engine_notes(const zmuon_engine* eng, const char** out);
/* The learning rates the next step uses (the scheduler's, or zmuon_engine_set_lr's). */
ZMUON_API int zmuon_engine_next_lrs(const zmuon_engine* eng, float* muon_lr, float* adam_lr);
/* Each step's figures, a JSON object ("step", "samples", "loss", "grad_norm", "loss_scale",
 * "skipped", "lr": {"muon", "adamw"}, "step_ms", "ns_ms", "memory_bytes"), to `callback` during
 * zmuon_engine_step (NULL: none). Engines of zmuon_engine_create_with_host only. */
typedef void (*zmuon_metrics_callback)(const char* record_json, void* user);
ZMUON_API int zmuon_engine_set_metrics_callback(zmuon_engine* eng, zmuon_metrics_callback callback,
                                                void* user);
/* The host's mean loss of the step under way, for that step's record. */
ZMUON_API int zmuon_engine_log_loss(zmuon_engine* eng, double loss);

/* -- Newton-Schulz on its own (zmuon/orthogonalize.hpp), without an engine --------------------
 * Orthogonalizes the caller's matrices in place with a compute backend that keeps its workspace
 * across calls:
 *
 *   zmuon_orthogonalizer* ns;
 *   zmuon_orthogonalizer_create("host", 0, "{\"ns_steps\": 5}", &ns);
 *   int64_t shape[3] = {3, 256, 64};             // or {256, 64}
 *   zmuon_array x = {data, ZMUON_FLOAT32, 3, shape, ZMUON_HOST};
 *   zmuon_orthogonalize(ns, &x);
 *   zmuon_orthogonalizer_destroy(ns);
 *
 * Per matrix X: tall ones as their transpose, X / (||X||_F + 1e-7), then ns_steps iterations of
 * X <- a X + (b A + c A^2) X with A = X X^T (or its Gram form: ns_variant). fp32 arithmetic on
 * the host backend, bf16 with fp32 sums on cuda. Non-finite input is not checked: such a matrix
 * comes back all NaN. One orthogonalizer runs one call at a time. */

/* zmuon_array.dtype */
typedef enum zmuon_dtype { ZMUON_FLOAT32 = 0, ZMUON_BFLOAT16 = 1 } zmuon_dtype;

/* Contiguous row-major matrices: ndim 2, shape {rows, cols}, or ndim 3, shape {batch, rows,
 * cols}. On the cuda backend `data` is device memory on the orthogonalizer's GPU (device = that
 * ordinal); on the host backend host memory (device = ZMUON_HOST). */
typedef struct zmuon_array {
  void* data;
  int32_t dtype; /* zmuon_dtype */
  int32_t ndim;
  const int64_t* shape;
  int32_t device; /* ZMUON_HOST or a CUDA device ordinal */
} zmuon_array;

typedef struct zmuon_orthogonalizer zmuon_orthogonalizer;

/* A backend ("host", or "cuda" when built with it) on CUDA device `device` (ignored by "host"),
 * with the options in `ns_json`: an object of the config's Newton-Schulz keys ("ns_steps",
 * "ns_coefficients", "ns_schedule", "ns_variant", "ns_gram_restart"; NULL or "": the engine's
 * defaults). A misspelled key or a bad value is ZMUON_INVALID_ARGUMENT naming it, as in the
 * engine's config. */
ZMUON_API int zmuon_orthogonalizer_create(const char* backend, int32_t device, const char* ns_json,
                                          zmuon_orthogonalizer** out);
/* New options (the same JSON) for the calls that follow; on failure the old ones stay. */
ZMUON_API int zmuon_orthogonalizer_set_options(zmuon_orthogonalizer* ns, const char* ns_json);
/* NULL is fine. */
ZMUON_API void zmuon_orthogonalizer_destroy(zmuon_orthogonalizer* ns);
/* Orthogonalizes x's matrices in place. On cuda it returns once the result is written; the
 * caller must have finished writing x. */
ZMUON_API int zmuon_orthogonalize(zmuon_orthogonalizer* ns, const zmuon_array* x);
/* The same, ordered on the CUDA stream `cuda_stream` (a cudaStream_t; NULL: the default
 * stream) without waiting: after the work queued there so far, before the work queued there
 * afterwards. A stream on another GPU, or capturing a CUDA graph, is ZMUON_INVALID_ARGUMENT. The
 * host backend runs the call to its end and ignores the stream. */
ZMUON_API int zmuon_orthogonalize_on_stream(zmuon_orthogonalizer* ns, const zmuon_array* x,
                                            void* cuda_stream);

#ifdef __cplusplus
}
#endif

#endif /* ZMUON_ZMUON_H */
