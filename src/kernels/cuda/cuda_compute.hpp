// The CUDA compute backend (docs/DESIGN.md §5): buffers in device memory, element-wise kernels of
// our own, Newton-Schulz with cuBLAS bf16 GEMMs. Every call enqueues on the backend's one stream
// in call order; calls that hand a value back (scan, frobenius_norm, copy_to_host) wait for it.
//
// Errors: a failing CUDA or cuBLAS call throws gpu::failure (kernels/cuda/check.hpp), whose
// err() is a zmuon::error naming the call, the CUDA error, file and line; the compute_backend
// interface returns no errors, so callers catch at their boundary (gpu::to_error converts).
// After a sticky CUDA error (an illegal access) the device context is unusable for the process.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "kernels/compute.hpp"
#include "kernels/cuda/completion_watcher.hpp"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/gram_newton_schulz.hpp"
#include "kernels/cuda/newton_schulz.hpp"
#include "kernels/cuda/owners.hpp"
#include "kernels/cuda/stream_set.hpp"

namespace zmuon::gpu {

class pinned_cache;

/// part_scans in device memory: kMaxReduceBlocks partial results a part (part_scans.cu).
class device_part_scans final : public part_scans {
public:
  explicit device_part_scans(int parts)
      : part_scans(parts),
        sums(int64_t{parts} * kMaxReduceBlocks),
        flags(int64_t{parts} * kMaxReduceBlocks) {}
  device_array<double> sums;
  device_array<int> flags;
};

/// `scans` as the CUDA backend's, with part `part` in it; else a failure naming `call`.
device_part_scans& device_scans_of(part_scans& scans, int part, const char* call);

class cuda_compute final : public compute_backend {
public:
  /// A backend on `device` (an ordinal); throws gpu::failure when that device is unusable.
  explicit cuda_compute(int device);
  ~cuda_compute() override;

  std::string name() const override { return "cuda"; }
  bool device_memory() const override { return true; }

  device_buffer allocate(int64_t n) override;
  device_buffer allocate_for_overwrite(int64_t n) override;
  /// Both host copies return once the host buffer may be reused or read: they wait.
  void copy_from_host(float* dst, const float* host_src, int64_t n) override;
  void copy_to_host(float* host_dst, const float* src, int64_t n) override;
  /// dst and src must not overlap (cudaMemcpy's rule; the host backend allows it).
  void copy(float* dst, const float* src, int64_t n) override;
  void copy_spans(const std::vector<copy_span>& spans) override;
  /// One cudaMemcpy2DAsync a box.
  void copy_boxes(void* dst, const void* src, int64_t cols, const std::vector<matrix_box>& boxes,
                  int elem_bytes, bool to_boxes) override;
  void copy_pieces(float* dst, const std::vector<copy_piece>& pieces) override;
  void fill_zero(float* x, int64_t n) override;

  void add(float* dst, const float* src, int64_t n) override;
  void scale(float* x, int64_t n, float factor) override;
  scan_result scan(const float* x, int64_t n) override;
  double frobenius_norm(const float* x, int64_t n) override;
  void momentum(float* m, const float* g, float* u, int64_t n, float beta, bool nesterov) override;
  void apply_update(float* p, const float* o, int64_t n, float lr, float scale,
                    float weight_decay) override;
  void scalar_update(float* p, const float* g, float* m, float* v, int64_t n,
                     const scalar_args& args) override;
  // Cautious weight decay and NorMuon (cautious_normuon.cu).
  void apply_update_cautious(float* p, const float* o, int64_t n, float lr, float scale,
                             float weight_decay) override;
  void post_ns(float* x, float* v, int64_t batch, int64_t rows, int64_t cols, const muon_rule& rule,
               float factor) override;

  void to_bf16(uint16_t* dst, const float* src, int64_t n) override;
  void from_bf16(float* dst, const uint16_t* src, int64_t n) override;

  void newton_schulz(float* x, int64_t batch, int64_t rows, int64_t cols,
                     const ns_options& ns) override;

  // The conversions to and from bf16 inside the kernels.
  void momentum_to_bf16(float* m, const float* g, uint16_t* u, int64_t n, float beta,
                        bool nesterov) override;
  void apply_update_bf16(float* p, const uint16_t* o, int64_t n, float lr, float scale,
                         float weight_decay) override;
  void newton_schulz_bf16(uint16_t* x, int64_t batch, int64_t rows, int64_t cols,
                          const ns_options& ns) override;

  // A chunk's parameters in one kernel (elementwise.cu's slice kernels).
  void momentum_slices(const float* m, float* m_out, const float* g, fp32_or_bf16 u, int64_t origin,
                       const std::vector<param_slice>& slices, float beta, bool nesterov,
                       scan_into scan) override;
  void muon_update_slices(float* p, fp32_or_bf16 o, int64_t origin,
                          const std::vector<param_slice>& slices, const muon_rule& rule) override;
  void scalar_update_slices(float* p, const float* g, float* m, float* v,
                            const std::vector<param_slice>& slices,
                            const scalar_args& args) override;

  void synchronize() override;
  void wait_for_stream(void* stream) override;
  error check_caller_stream(void* stream) override;
  void make_stream_wait(void* stream) override;

  void when_done(std::function<void()> done) override;
  void scan_async(const float* x, int64_t n, scan_result* out,
                  std::function<void()> landed) override;
  // Scans kept per part: written by the accumulate's own kernel (cuda_part_scans.cpp).
  std::unique_ptr<part_scans> make_part_scans(int parts) override;
  void accumulate_scanned(float* dst, const float* src, int64_t n, accumulate_mode mode,
                          part_scans& scans, int part) override;
  void accumulate_pieces_scanned(float* dst, int64_t n, const std::vector<copy_piece>& pieces,
                                 accumulate_mode mode, part_scans& scans, int part) override;
  void scan_pieces(const float* dst, int64_t n, const std::vector<copy_piece>& pieces,
                   part_scans& scans, int part) override;
  void scan_parts_async(part_scans& scans, int parts, scan_result* out,
                        std::function<void()> landed) override;
  device_buffer allocate_host(int64_t n) override { return host_memory(n, true); }
  device_buffer allocate_host_for_overwrite(int64_t n) override { return host_memory(n, false); }
  void copy_to_host_async(float* host_dst, const float* src, int64_t n) override;
  void copy_from_host_async(float* dst, const float* host_src, int64_t n) override;

  /// allocate()'s buffers, and the Newton-Schulz workspace as `workspace`.
  memory_stats memory() const override;
  /// A period begins with an event on the main stream after every lane (the next NS forks after
  /// it), so that each timed call's events give its span from there.
  void time_calls(bool on) override;
  /// Each timed call's events read once its work is done (waits for the rest).
  call_times take_call_times() override;
  void read_traced_calls() override;

  /// For the NCCL communication backend and for benchmarks: where this backend's work runs.
  int device() const override { return device_; }
  /// (Newton-Schulz calls still running on their lanes are joined first: see stream_set.hpp.)
  cudaStream_t stream() const { return streams_->joined(); }
  /// The stream, ordered after the NS work on `memory` only (the nccl comm: its buffers).
  cudaStream_t stream_touching(const std::vector<touched>& memory) const {
    return streams_->touching(memory);
  }
  /// What was just enqueued on stream_touching(memory)'s stream touched `memory`.
  void stream_done(const std::vector<touched>& memory) const { streams_->main_done(memory); }

private:
  /// n floats of pinned host memory from the cache, zero-filled when `zero`.
  device_buffer host_memory(int64_t n, bool zero);
  /// NorMuon's row normalization, post_ns's transform of muon_variant::normuon.
  void normuon_rows(float* x, float* v, int64_t batch, int64_t rows, int64_t cols, float beta2,
                    float eps);
  class call_timer;  // (below)

public:
  /// For the nccl comm: with timing on (time_calls), what it enqueues on `stream` while this
  /// lives is timed as the call `name` beside the backend's own calls. It takes the backend's
  /// lock only to record its events, not activate(): the collectives keep overlapping the NS
  /// lanes.
  class comm_timer {
  public:
    comm_timer(cuda_compute& be, const char* name, cudaStream_t stream);
    comm_timer(const comm_timer&) = delete;
    comm_timer& operator=(const comm_timer&) = delete;
    ~comm_timer();

  private:
    cuda_compute& be_;
    std::unique_ptr<call_timer> timer_;
  };

private:
  /// The launch context, usable while the guard lives: holds the backend's lock (the actors of
  /// one rank share its backend and run on any scheduler thread, so calls are serialized; each
  /// only enqueues, except the waits named above) with this backend's device current.
  /// Work enqueued under a guard from activate(memory) is marked, when the guard ends, as the
  /// main stream's latest work on that memory (stream_set::main_done).
  struct launch_guard {
    std::unique_lock<std::mutex> lock;
    const launch_context& ctx;
    stream_set* streams = nullptr;
    std::vector<touched> memory = {};
    launch_guard(launch_guard&&) = default;
    ~launch_guard() {
      if (streams == nullptr || memory.empty())
        return;
      try {
        streams->main_done(memory);
      } catch (const failure&) {  // a broken context: nothing will run after it
      }
    }
    operator const launch_context&() const { return ctx; }
  };
  /// After ordering the main stream after every NS lane (calls that wait or cannot name their
  /// memory), or after the lanes whose NS work touches `memory` (stream_set.hpp).
  launch_guard activate() const;
  launch_guard activate(std::initializer_list<touched> memory) const;
  device_buffer allocate_on_stream(int64_t n, bool zero);
  void run_newton_schulz(ns_io x, int64_t batch, int64_t rows, int64_t cols, const ns_options& ns);
  reduction reduce(const float* x, int64_t n);
  /// After the reduction just enqueued into result_: its result into *out, then `landed`, by
  /// the watcher, through a pinned place of the cache's (scan_async, scan_parts_async).
  void land_result(scan_result* out, std::function<void()> landed);

  mutable std::mutex mutex_;
  int device_;
  /// Shared with the release functions of the buffers handed out: a buffer freed after its
  /// backend is gone still has its stream.
  std::shared_ptr<stream_set> streams_;
  std::shared_ptr<pinned_cache> pinned_cache_;
  launch_context ctx_;
  cuda_event caller_ready_{cudaEventDisableTiming};   // wait_for_stream's
  cuda_event caller_may_go_{cudaEventDisableTiming};  // make_stream_wait's
  device_array<double> partial_sums_;
  device_array<int> partial_flags_;
  device_array<reduction> result_;
  pinned<reduction> host_result_;  // reduce()'s, which waits for it
  /// What Newton-Schulz needs on each of the stream set's lanes: a cuBLAS handle bound to the
  /// lane's stream, with its own workspace, and the NS buffers (concurrent calls share none):
  /// the standard iteration's and the Gram variant's (ns_variant::gram, kernels/ns_variants.hpp).
  struct ns_lane {
    explicit ns_lane(cudaStream_t stream);
    cublas_handle cublas;
    device_array<unsigned char> cublas_workspace;
    ns_workspace ns;
    gram_ns_workspace gram_ns;
  };
  std::array<std::unique_ptr<ns_lane>, stream_set::kLanes> lanes_;

  /// Where the device's clock meets the host's: an event recorded on a stream that never has
  /// work (so it passes as soon as the device takes it), and the host's time just before.
  struct clock_anchor {
    cuda_event event;
    int64_t host_ns = 0;
  };
  /// With timing on (compute_backend::time_calls) or a trace sink set, a call's work on its stream
  /// between two events; the pairs wait in `timed_` until read (take_call_times, or once done when
  /// the next is queued). Used under the backend's lock, after activate().
  class call_timer {
  public:
    call_timer(cuda_compute& be, const char* name, cudaStream_t stream);
    call_timer(const call_timer&) = delete;
    call_timer& operator=(const call_timer&) = delete;
    ~call_timer();

  private:
    cuda_compute* be_ = nullptr;
    const char* name_;
    cudaStream_t stream_;
    std::shared_ptr<const clock_anchor> anchor_;
    std::optional<cuda_event> start_;
  };
  struct timed_call {
    const char* name;
    int track;  // call_span::track: 0 the main stream, 1 + i lane i
    std::shared_ptr<const clock_anchor> anchor;
    cuda_event start;
    cuda_event end;
  };
  int track_of(cudaStream_t stream) const;
  cuda_event take_event();
  /// The anchor a call timed now is read against: a new one once the last is older than
  /// kAnchorNs, so that the events' float milliseconds from it stay exact to about 0.1 us.
  std::shared_ptr<const clock_anchor> current_anchor();
  static constexpr int64_t kAnchorNs = 1'000'000'000;
  /// Hands the timed calls that are done (all of them when `wait`) to add_call, on the host's
  /// clock.
  void read_timed_calls(bool wait);
  std::deque<timed_call> timed_;
  std::vector<cuda_event> spare_events_;
  std::shared_ptr<const clock_anchor> anchor_;
  std::optional<cuda_stream> clock_stream_;  // the anchors' stream: nothing else runs on it
  /// when_done's and the scans' landings on the main stream. Last, so destroyed first: after
  /// the destructor has synchronized the streams, it runs what still waits.
  completion_watcher watcher_;

  friend class ns_tuning;  // tests' and benchmarks' knobs (ns_tuning.hpp)
  template <class F>
  void for_each_lane(F f) {
    const std::lock_guard<std::mutex> lock(mutex_);
    for (auto& lane : lanes_)
      f(*lane);
  }
};

}  // namespace zmuon::gpu

namespace zmuon {

/// The CUDA backend on the calling thread's current device (device 0 unless cudaSetDevice was
/// called), or an error (errc::invalid_argument) naming why no GPU is usable; never crashes on
/// a machine without a GPU or driver.
expected<std::unique_ptr<compute_backend>> make_cuda_compute_backend();
/// The same on device ordinal `device` (one rank per GPU under NCCL).
expected<std::unique_ptr<compute_backend>> make_cuda_compute_backend(int device);
/// Visible CUDA devices (0 when there is no GPU or driver).
int cuda_device_count();

}  // namespace zmuon
