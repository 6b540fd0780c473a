// The compute-backend interface: every numerical kernel the engine runs, on buffers that the
// backend allocated (host memory for `host`, device memory for `cuda`). Kernels are enqueued in
// call order; `synchronize()` waits for all of them. The host backend runs each call to the end.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "kernels/muon_rule.hpp"
#include "kernels/scalar_rules.hpp"
#include "zmuon/call_times.hpp"
#include "zmuon/memory.hpp"
#include "zmuon/options.hpp"
#include "zmuon/param.hpp"
#include "zmuon/status.hpp"

namespace zmuon {

/// A buffer of floats owned by a backend; freed by the backend that made it (the release
/// function may hold what it needs, e.g. the stream a stream-ordered free goes to).
class device_buffer {
public:
  using release_fn = std::function<void(float*)>;
  device_buffer() = default;
  device_buffer(float* data, int64_t size, release_fn release)
      : data_(data, std::move(release)), size_(size) {}

  float* data() { return data_.get(); }
  const float* data() const { return data_.get(); }
  int64_t size() const { return size_; }

private:
  std::unique_ptr<float, release_fn> data_{nullptr, [](float*) {}};
  int64_t size_ = 0;
};

/// Thread-safe counters behind memory_stats, shared by a backend and its buffers' release
/// functions (a buffer may be released on any thread, and after its backend is gone).
class memory_meter {
public:
  void allocated(int64_t bytes) {
    const int64_t now = in_use_.fetch_add(bytes) + bytes;
    int64_t seen = peak_.load();
    while (now > seen && !peak_.compare_exchange_weak(seen, now)) {
    }
  }
  void released(int64_t bytes) { in_use_.fetch_sub(bytes); }
  void reset_peak() { peak_.store(in_use_.load()); }
  memory_stats read() const { return memory_stats{in_use_.load(), peak_.load(), 0}; }

private:
  std::atomic<int64_t> in_use_{0};
  std::atomic<int64_t> peak_{0};
};

/// Result of the fused non-finite scan: whether any element is inf/NaN and the sum of squares
/// (in double) of the finite case.
struct scan_result {
  bool nonfinite = false;
  double sum_squares = 0.0;
};

/// A parameter's part of a call over several parameters (the store's calls, one per Muon chunk
/// or for all AdamW parameters): its offset in the buffers laid out like the parameter shards
/// (params, grads) and in those laid out like the optimizer state (momentum, Adam moments, and a
/// chunk's u or update, which begin at the chunk's first state offset, `origin`), its length,
/// its Muon update scale, and where its gradient is read when not in the gradient buffer.
struct param_slice {
  int64_t shard_offset = 0;
  int64_t state_offset = 0;
  int64_t n = 0;
  float scale = 1.0f;
  // The slice's n gradient elements where the caller keeps them (the store's gradient read in
  // place); null: at shard_offset in the gradient buffer the call is given.
  const float* grad = nullptr;
};

/// Where a call over several parameters reads slice `s`'s gradient: its own, or `g`'s (null
/// where neither is given: a call that reads no gradient, or a store that allocated no buffer
/// because every slice has its own).
inline const float* grad_of(const param_slice& s, const float* g) {
  return s.grad != nullptr ? s.grad : g != nullptr ? g + s.shard_offset : nullptr;
}

/// One of the copies of copy_pieces(): `n` floats from `src` (a buffer of the backend) to
/// `dst_offset` in the destination.
struct copy_piece {
  const float* src = nullptr;
  int64_t dst_offset = 0;
  int64_t n = 0;
};

/// One of the copies of copy_spans(): `n` floats from `src` to `dst`, both memory the backend
/// reaches (its buffers, or on CUDA any device memory).
struct copy_span {
  const float* src = nullptr;
  float* dst = nullptr;
  int64_t n = 0;
};

/// What accumulate_scanned() writes into its destination: the source, the sum of both, or zeros.
enum class accumulate_mode { copy, add, zero };

/// Scans kept per part of a buffer (the store's gradient buckets), each taken by the call that
/// last wrote its part, so that the whole buffer's scan needs no pass of its own
/// (compute_backend::accumulate_scanned, scan_parts_async). Made by the backend that fills it.
class part_scans {
public:
  virtual ~part_scans() = default;
  int parts() const { return parts_; }

protected:
  explicit part_scans(int parts) : parts_(parts) {}

private:
  int parts_;
};

/// part_scans kept in host memory, one scan_result a part: compute_backend's default, which the
/// host backend uses.
class host_part_scans final : public part_scans {
public:
  explicit host_part_scans(int parts) : part_scans(parts), scans(static_cast<size_t>(parts)) {}
  std::vector<scan_result> scans;
};

/// Where a call also keeps the scan of the gradient it reads (its non-finite flag and sum of
/// squares): part `part` of `scans` (made by the same backend), which the call writes (`first`)
/// or adds to (a later call of the same part). No scans: the call scans nothing.
struct scan_into {
  part_scans* scans = nullptr;
  int part = 0;
  bool first = true;
};

/// The Muon phase's u or update: fp32 at `f32`, or bf16 bits at `bf16` (bf16 transport).
struct fp32_or_bf16 {
  float* f32 = nullptr;
  uint16_t* bf16 = nullptr;
};

class compute_backend {
public:
  virtual ~compute_backend() = default;

  virtual std::string name() const = 0;
  /// True when this backend's buffers live in device memory (the host cannot dereference them).
  virtual bool device_memory() const { return false; }
  /// The CUDA device ordinal of that memory; -1 for host memory.
  virtual int device() const { return -1; }

  // -- memory ----------------------------------------------------------------------------------
  /// A zero-filled buffer of n floats.
  virtual device_buffer allocate(int64_t n) = 0;
  /// A buffer of n floats whose contents are unspecified, for a caller that writes all of them
  /// before anything reads them (a device backend skips the zero fill's pass over the memory).
  virtual device_buffer allocate_for_overwrite(int64_t n) { return allocate(n); }
  virtual void copy_from_host(float* dst, const float* host_src, int64_t n) = 0;
  virtual void copy_to_host(float* host_dst, const float* src, int64_t n) = 0;
  virtual void copy(float* dst, const float* src, int64_t n) = 0;
  /// copy() of each piece into dst (a bucket packed from many parameters' gradients); the
  /// pieces' destinations do not overlap. The CUDA backend copies up to 64 pieces a kernel.
  virtual void copy_pieces(float* dst, const std::vector<copy_piece>& pieces) {
    for (const copy_piece& p : pieces)
      copy(dst + p.dst_offset, p.src, p.n);
  }
  /// copy() of each span (the destinations do not overlap each other or a source): one
  /// parameter shard to each of many caller buffers. The CUDA backend copies up to 64 spans a
  /// kernel instead of a cudaMemcpyAsync each.
  virtual void copy_spans(const std::vector<copy_span>& spans) {
    for (const copy_span& s : spans)
      copy(s.dst, s.src, s.n);
  }
  virtual void fill_zero(float* x, int64_t n) = 0;
  /// A matrix of `cols` columns, of elements `elem_bytes` wide (4: fp32, 2: bf16), from `boxes`
  /// of it back to back, each row-major (src), into its row-major order (dst); to_boxes: the
  /// other way. The boxes tile the matrix (param_spec::boxes); dst and src do not overlap.
  virtual void copy_boxes(void* dst, const void* src, int64_t cols,
                          const std::vector<matrix_box>& boxes, int elem_bytes, bool to_boxes) = 0;
  /// dst (a buffer of this backend) += host_src (pageable host memory, reusable on return):
  /// through a staging buffer when the backend's memory is device memory.
  void add_from_host(float* dst, const float* host_src, int64_t n) {
    if (!device_memory())
      return add(dst, host_src, n);
    device_buffer staged = allocate_for_overwrite(n);
    copy_from_host_async(staged.data(), host_src, n);  // pageable: copied out before it returns
    add(dst, staged.data(), n);
  }

  // -- element-wise ----------------------------------------------------------------------------
  /// dst += src
  virtual void add(float* dst, const float* src, int64_t n) = 0;
  /// x *= factor (unscale and clip scaling)
  virtual void scale(float* x, int64_t n, float factor) = 0;
  /// Non-finite scan fused with the sum of squares of x.
  virtual scan_result scan(const float* x, int64_t n) = 0;
  /// Frobenius norm of x (double accumulation).
  virtual double frobenius_norm(const float* x, int64_t n) = 0;
  /// EMA momentum and the update source:
  ///   m = beta*m + (1-beta)*g;   u = nesterov ? (1-beta)*g + beta*m : m
  virtual void momentum(float* m, const float* g, float* u, int64_t n, float beta,
                        bool nesterov) = 0;
  /// Decoupled weight decay and the Muon update: p = p*(1 - lr*wd) - lr*scale*o.
  virtual void apply_update(float* p, const float* o, int64_t n, float lr, float scale,
                            float weight_decay) = 0;
  /// apply_update() with cautious weight decay (arXiv:2510.12402; Dion's
  /// muon_update_post_orthogonalize): p = p - lr*wd*p*[p*o >= 0] - lr*scale*o. `o` is the
  /// orthogonalized (NorMuon: normalized) update; scale > 0 leaves its sign alone.
  virtual void apply_update_cautious(float* p, const float* o, int64_t n, float lr, float scale,
                                     float weight_decay) = 0;
  /// What follows Newton-Schulz under `rule` (kernels/muon_rule.hpp), in place on `batch`
  /// row-major [rows, cols] orthogonalized blocks of x: the rule's transform, then x *= factor
  /// (no pass when factor is 1). The transform of muon_variant::normuon is NorMuon's row
  /// normalization (arXiv:2510.05491, Algorithm 1; Dion's normuon.py), with v the blocks'
  /// batch*rows row moments:
  ///   v = beta2*v + (1-beta2)*mean_j(o_ij^2);  o_ij /= sqrt(v_i) + eps;
  ///   then each block times ||o_before||_F / max(||o_after||_F, 1e-8) (Dion's rescale).
  /// Plain Muon has none (v unused, may be null).
  virtual void post_ns(float* x, float* v, int64_t batch, int64_t rows, int64_t cols,
                       const muon_rule& rule, float factor) = 0;
  /// The non-Muon rule `args.algorithm` (kernels/scalar_rules.hpp) on one shard: p, its
  /// gradient g, its first and second moments m and v (a rule may leave v alone).
  virtual void scalar_update(float* p, const float* g, float* m, float* v, int64_t n,
                             const scalar_args& args) = 0;

  // -- bf16 transport (the Muon phase's gather and scatter, kernels/bf16.hpp) -------------------
  /// dst[i] = bf16 bits of src[i], rounded to nearest even (NaN stays NaN, no flush to zero).
  virtual void to_bf16(uint16_t* dst, const float* src, int64_t n) = 0;
  /// dst[i] = src[i] as fp32 (exact).
  virtual void from_bf16(float* dst, const uint16_t* src, int64_t n) = 0;

  // -- Newton-Schulz ---------------------------------------------------------------------------
  /// Orthogonalizes `batch` row-major [rows, cols] matrices (back to back in x) in place: tall
  /// ones as wide, each over (||X||_F + eps), then `ns.steps` times A = X X^T; B = b*A + c*A*A;
  /// X = a*X + B*X (or its Gram form, ns.variant: kernels/ns_variants.hpp). One count a matrix.
  virtual void newton_schulz(float* x, int64_t batch, int64_t rows, int64_t cols,
                             const ns_options& ns) = 0;

  // -- the same on bf16 operands (the Muon phase under bf16 transport) -------------------------
  // Each equals its fp32 call with the bf16 operand widened (from_bf16) or the result rounded
  // (to_bf16), bit for bit. These defaults do exactly that through a temporary; the CUDA backend
  // converts inside its kernels, so that no fp32 copy of a chunk's u, matrices or update exists.
  /// momentum() with u written as bf16 bits.
  virtual void momentum_to_bf16(float* m, const float* g, uint16_t* u, int64_t n, float beta,
                                bool nesterov) {
    device_buffer wide = allocate_for_overwrite(n);
    momentum(m, g, wide.data(), n, beta, nesterov);
    to_bf16(u, wide.data(), n);
  }
  /// apply_update() with o read from bf16 bits.
  virtual void apply_update_bf16(float* p, const uint16_t* o, int64_t n, float lr, float scale,
                                 float weight_decay) {
    device_buffer wide = allocate_for_overwrite(n);
    from_bf16(wide.data(), o, n);
    apply_update(p, wide.data(), n, lr, scale, weight_decay);
  }
  // -- the same over several parameters at once -----------------------------------------------
  // Each equals its per-parameter call made for every slice in order, bit for bit; these
  // defaults make those calls. The CUDA backend runs a whole chunk in one kernel, so that a
  // table of many small parameters is not bound by launches (one call instead of one a
  // parameter).
  /// momentum() / momentum_to_bf16() per slice: the momentum read at m + state_offset and the
  /// new one written at m_out + state_offset (m_out == m: in place; else the two do not
  /// overlap), the gradient at grad_of(s, g), u at state_offset - origin; with `scan`, the
  /// scan of the slices' gradients kept as that part (scan_parts_async sums it with the
  /// others). This default copies m into m_out first and runs the calls there.
  virtual void momentum_slices(const float* m, float* m_out, const float* g, fp32_or_bf16 u,
                               int64_t origin, const std::vector<param_slice>& slices, float beta,
                               bool nesterov, scan_into scan) {
    if (scan.scans != nullptr)
      scan_slices(g, slices, scan);
    for (const param_slice& s : slices) {
      float* ms = m_out + s.state_offset;
      if (m_out != m)
        copy(ms, m + s.state_offset, s.n);
      if (u.f32 != nullptr) {
        momentum(ms, grad_of(s, g), u.f32 + (s.state_offset - origin), s.n, beta, nesterov);
      } else {
        momentum_to_bf16(ms, grad_of(s, g), u.bf16 + (s.state_offset - origin), s.n, beta,
                         nesterov);
      }
    }
  }
  /// The Muon update of a chunk's parameters under `rule`, the one place where a backend
  /// applies it: per slice, p at shard_offset takes the rule's decay (rule.decay) and
  /// -lr*scale*o with the slice's scale, o at state_offset - origin (fp32, or bf16 bits
  /// widened). This default makes apply_update() / apply_update_bf16() /
  /// apply_update_cautious() a slice.
  virtual void muon_update_slices(float* p, fp32_or_bf16 o, int64_t origin,
                                  const std::vector<param_slice>& slices, const muon_rule& rule) {
    for (const param_slice& s : slices) {
      const int64_t at = s.state_offset - origin;
      if (rule.decay == decay_mask::cautious) {
        if (o.f32 != nullptr) {
          apply_update_cautious(p + s.shard_offset, o.f32 + at, s.n, rule.lr, s.scale,
                                rule.weight_decay);
          continue;
        }
        device_buffer wide = allocate_for_overwrite(s.n);
        from_bf16(wide.data(), o.bf16 + at, s.n);
        apply_update_cautious(p + s.shard_offset, wide.data(), s.n, rule.lr, s.scale,
                              rule.weight_decay);
      } else if (o.f32 != nullptr) {
        apply_update(p + s.shard_offset, o.f32 + at, s.n, rule.lr, s.scale, rule.weight_decay);
      } else {
        apply_update_bf16(p + s.shard_offset, o.bf16 + at, s.n, rule.lr, s.scale,
                          rule.weight_decay);
      }
    }
  }
  /// scalar_update() per slice: p at shard_offset, the gradient at grad_of(s, g), m and v at
  /// state_offset.
  virtual void scalar_update_slices(float* p, const float* g, float* m, float* v,
                                    const std::vector<param_slice>& slices,
                                    const scalar_args& args) {
    for (const param_slice& s : slices)
      scalar_update(p + s.shard_offset, grad_of(s, g), m + s.state_offset, v + s.state_offset, s.n,
                    args);
  }

  /// newton_schulz() on bf16 bits, in place.
  virtual void newton_schulz_bf16(uint16_t* x, int64_t batch, int64_t rows, int64_t cols,
                                  const ns_options& ns) {
    const int64_t n = batch * rows * cols;
    device_buffer wide = allocate_for_overwrite(n);
    from_bf16(wide.data(), x, n);
    newton_schulz(wide.data(), batch, rows, cols, ns);
    to_bf16(x, wide.data(), n);
  }

  /// Waits until everything enqueued so far has finished, the completions it queued (when_done's
  /// callbacks, scan_async's results) included.
  virtual void synchronize() = 0;

  // -- a caller's CUDA stream (reduce() of device gradients written there) ---------------------
  /// The work enqueued from now on waits, on the device, for the work queued so far on the
  /// caller's stream `stream` (a cudaStream_t; nullptr is the default stream). A backend without
  /// device memory runs each call when it is made: nothing to order.
  virtual void wait_for_stream(void* stream) { (void)stream; }
  /// Why `stream` cannot be waited for here (on another device, or capturing a CUDA graph, into
  /// which the engine's own work would be drawn), or no error. Checked before wait_for_stream.
  virtual error check_caller_stream(void* stream) {
    (void)stream;
    return {};
  }
  /// The work queued on `stream` from now on waits, on the device, for the work enqueued here
  /// so far.
  virtual void make_stream_wait(void* stream) { (void)stream; }

  // -- completion without waiting (what the actors use, so that no scheduler thread waits) -------
  /// Calls `done` once everything enqueued so far has finished, without waiting: at once on the
  /// host backend; on CUDA from the backend's completion thread (completion_watcher.hpp), in the
  /// order asked, so `done` may only send a message.
  virtual void when_done(std::function<void()> done) { done(); }
  /// scan() without waiting: `*out` holds the result once `landed` runs (at once on the host
  /// backend; on CUDA from the completion thread as soon as the scan itself has finished, not
  /// after the Newton-Schulz lanes as when_done's callback would), so `landed` may only send a
  /// message.
  virtual void scan_async(const float* x, int64_t n, scan_result* out,
                          std::function<void()> landed) {
    *out = scan(x, n);
    landed();
  }

  // -- scans kept per part (the store's gradient buckets) ---------------------------------------
  /// Room for the scans of `parts` parts, each a zero part until written.
  virtual std::unique_ptr<part_scans> make_part_scans(int parts);
  /// dst = src, dst += src or dst = 0 (`mode`; src unused for zero), and the scan of dst's new
  /// values kept as part `part` of `scans` (made by this backend), in the same pass.
  virtual void accumulate_scanned(float* dst, const float* src, int64_t n, accumulate_mode mode,
                                  part_scans& scans, int part) = 0;
  /// accumulate_scanned() of a source packed from `pieces` (copy_pieces(); zero where no piece
  /// lands) into dst's n elements. The default packs into a buffer first; the CUDA backend
  /// reads the pieces in the accumulate's own pass.
  virtual void accumulate_pieces_scanned(float* dst, int64_t n,
                                         const std::vector<copy_piece>& pieces,
                                         accumulate_mode mode, part_scans& scans, int part);
  /// The scan that accumulate_pieces_scanned(dst, n, pieces, copy, ...) keeps as part `part`,
  /// bit for bit, with nothing written: dst is only where that copy would go, and only its
  /// alignment is read, so it need not be memory (the store's gradient read where the caller
  /// keeps it, with no buffer allocated). The default copies into a buffer of its own; the
  /// CUDA backend runs that copy's kernel without its stores.
  virtual void scan_pieces(const float* dst, int64_t n, const std::vector<copy_piece>& pieces,
                           part_scans& scans, int part);
  /// The scans of parts [0, parts) together, as scan() of the whole buffer would give them up
  /// to the order of the sum (fixed: part by part), without waiting: `*out` holds the result
  /// once `landed` runs (as scan_async's).
  virtual void scan_parts_async(part_scans& scans, int parts, scan_result* out,
                                std::function<void()> landed);
  /// Zero-filled host memory that the async copies below may use (pinned on CUDA).
  virtual device_buffer allocate_host(int64_t n) { return allocate(n); }
  /// The same, unspecified values, for a user that writes every element first (no fill).
  virtual device_buffer allocate_host_for_overwrite(int64_t n) { return allocate_host(n); }
  /// Copies between this backend's buffers and allocate_host() memory, enqueued without waiting
  /// (on the host backend: done at once).
  virtual void copy_to_host_async(float* host_dst, const float* src, int64_t n) {
    copy_to_host(host_dst, src, n);
  }
  virtual void copy_from_host_async(float* dst, const float* host_src, int64_t n) {
    copy_from_host(dst, host_src, n);
  }

  /// Newton-Schulz matrices orthogonalized by this backend so far (for the once-per-step test).
  int64_t ns_matrix_count() const { return ns_matrices_; }

  // -- memory accounting (benchmarks: peak transient memory of a step) -------------------------
  virtual memory_stats memory() const { return meter_->read(); }
  /// Starts a new peak from what is in use now (e.g. the persistent state, before a step).
  void reset_peak_memory() { meter_->reset_peak(); }

  // -- call timing (benchmarks: a step's device time by phase; the message trace) -------------
  /// Off by default. On, every call that does work records when it ran, under its name
  /// (call_times.hpp); switching it on starts a new period.
  virtual void time_calls(bool on);
  bool timing_calls() const { return timing_.load(); }
  /// Each call's count, summed time and busy time since the period began, then a new period;
  /// waits for timed work still running.
  virtual call_times take_call_times();
  /// The spans that the last take_call_times() summed, by start (at most kKeptSpans of them: a
  /// period's later calls are summed but not kept).
  std::vector<call_span> last_call_spans() const;
  static constexpr size_t kKeptSpans = size_t{1} << 16;
  /// While timing: the host span [start_ns, now) of an engine call named `name` on the caller's
  /// thread, in the timeline (last_call_spans, track call_span::kHostTrack) beside the backend's
  /// calls; not in the call times, not in the trace.
  void time_host_call(const char* name, int64_t start_ns);
  /// Now on the host's steady clock, in ns.
  static int64_t steady_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

  /// One call as the message trace records it: its name, its track (call_span::track) and its
  /// times on the host's steady clock in ns (trace::now_ns's clock).
  struct traced_call {
    const char* name;
    int track;
    int64_t start_ns;
    int64_t end_ns;
  };
  using call_sink = std::function<void(const traced_call&)>;
  /// Hands every call that does work to `sink` once its time is known: on the host as it
  /// returns; on CUDA once its work has run (read at a later call, at take_call_times or
  /// read_traced_calls, and at the backend's end), from its device events mapped onto the
  /// host's clock. Set it before the backend's first call; while it is set calls are timed
  /// whether or not time_calls is on.
  void trace_calls(call_sink sink) { sink_ = std::move(sink); }
  /// Hands the calls whose work has run to the sink now, without waiting for the others (CUDA;
  /// the host's are handed over as they return).
  virtual void read_traced_calls() {}

  /// Asks the calls that can run long on the calling thread (the host's Newton-Schulz
  /// iterations) to end early, leaving garbage in their outputs: for an engine stopping after a
  /// timeout, whose results nobody will read, so that stopping does not wait the computation
  /// out. Any thread; not undone. (CUDA work is enqueued and ends on its own.)
  void cancel() { cancelled_.store(true, std::memory_order_relaxed); }
  bool cancelled() const { return cancelled_.load(std::memory_order_relaxed); }

protected:
  /// The host default of a slice call's `scan`: the scan of each slice's gradient
  /// (grad_of(s, g)), kept as that part of host_part_scans.
  void scan_slices(const float* g, const std::vector<param_slice>& slices, scan_into scan);
  /// Whether calls are timed: for the call times or for the trace.
  bool timing_or_tracing() const { return timing_.load() || sink_ != nullptr; }
  /// One call ran from start_ns to end_ns (steady_ns's clock) on `track` (call_span).
  void add_call(const char* name, int64_t start_ns, int64_t end_ns, int track = 0);
  /// Times a call that runs to its end on the calling thread (the host backend's), when timing
  /// or tracing.
  class scoped_call_timer {
  public:
    scoped_call_timer(compute_backend& be, const char* name)
        : be_(be.timing_or_tracing() ? &be : nullptr),
          name_(name),
          start_ns_(be_ != nullptr ? steady_ns() : 0) {}
    scoped_call_timer(const scoped_call_timer&) = delete;
    scoped_call_timer& operator=(const scoped_call_timer&) = delete;
    ~scoped_call_timer() {
      if (be_ != nullptr)
        be_->add_call(name_, start_ns_, steady_ns());
    }

  private:
    compute_backend* be_;
    const char* name_;
    int64_t start_ns_;
  };

  int64_t ns_matrices_ = 0;
  std::shared_ptr<memory_meter> meter_ = std::make_shared<memory_meter>();

private:
  std::atomic<bool> timing_{false};
  std::atomic<bool> cancelled_{false};
  mutable std::mutex times_mutex_;
  int64_t epoch_ns_ = steady_ns();  // where the timing period began
  call_sink sink_;
  /// Per call name: the spans not yet summed, and what earlier spans summed to (spans are folded
  /// into it in batches, so that a long period keeps little).
  struct spans {
    std::vector<std::pair<double, double>> open;
    call_time folded;
  };
  std::map<std::string, spans> spans_;
  std::vector<call_span> period_spans_;  // this period's, in the order they were read
  std::vector<call_span> last_spans_;    // the period last taken
};

/// Adds `spans` (start, end; emptied) to `into`: their count, their summed length and the length
/// of their union, the time during which at least one of them ran (call_time::busy_ms).
void fold_call_spans(std::vector<std::pair<double, double>>& spans, call_time& into);

/// The backend named `name` ("host", or "cuda" when built with CUDA), or an error naming the
/// backends that exist.
expected<std::unique_ptr<compute_backend>> make_compute_backend(const std::string& name);
/// The same on device ordinal `device` (ignored by the host backend).
expected<std::unique_ptr<compute_backend>> make_compute_backend(const std::string& name,
                                                                int device);
/// The host backend's BLAS threads when `concurrent` ranks run Newton-Schulz at once on `cores`
/// cores: the cores shared out, at least 1 (several ranks' NS at once with a BLAS thread per core
/// each would oversubscribe the cores; on 2 cores, 4 ranks: 8.5 s per GPT-2 step instead of 12.3).
int host_blas_threads(int concurrent, int cores);
/// Sets the host backend's BLAS threads (process-wide) for `local_ranks` ranks in this process,
/// with as many cores as the machine has, unless OPENBLAS_NUM_THREADS, GOTO_NUM_THREADS or
/// OMP_NUM_THREADS says otherwise; returns the count it set, or 0 when it left it alone.
int share_host_blas_threads(int local_ranks);

/// How many devices backend `name` can use: visible GPUs for cuda (0 without any), 1 for host.
int compute_device_count(const std::string& name);

/// The devices of backend `name` by a name unique to each physical device, in device order: the
/// visible GPUs' UUIDs for cuda ("GPU-8c0d..."), none for host. Two processes that list the same
/// id share that GPU.
std::vector<std::string> compute_device_ids(const std::string& name);

}  // namespace zmuon
