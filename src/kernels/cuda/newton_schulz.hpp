// Newton-Schulz on the GPU: bf16 operands, fp32 accumulation, one strided-batched cuBLAS GEMM per
// product over all `batch` same-shape matrices (gemm.hpp): per iteration, A = X X^T;
// B = c*A*A + b*A (b*A carried by the GEMM's beta); B += a*I (a kernel on the diagonals only);
// X' = B*X, so that the update reads X once, as an operand, and not again as the GEMM's C.
//
// Symmetric products: A and B are symmetric, so when the Gram side m splits into k blocks (each
// a multiple of 32, at least the configured side) only the k(k+1)/2 lower blocks of A and of
// A*A are computed, all of a batch in one pointer-array batched GEMM, and a transposing copy
// fills the upper blocks: (k+1)/(2k) of the two products' FLOPs (2/3 at k = 3, 9/16 at k = 8).
//
// On Hopper, the symmetric products of sides >= 768 over k >= 2048 run on zmuon's own GEMM
// instead, which computes only the upper tiles (sm90_gemm.hpp; faster there than cuBLAS's whole
// product or blocks): A = X X^T of a wide X with n >= 2048, A*A when m >= 2048.
//
// X is kept in bf16 between iterations (as the published PyTorch reference does); only the
// input (fp32, normalized per matrix on the device) and the output (back to fp32, in place) are
// converted. Tall matrices are not copied into a transposed buffer: a row-major tall [rows, cols]
// matrix already is the column-major wide X = u^T, so only the GEMMs' transpose flags differ.
#pragma once

#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <cstdint>
#include <map>
#include <vector>

#include "kernels/cuda/gemm.hpp"
#include "kernels/cuda/launch.hpp"
#include "kernels/cuda/ns_normalize.hpp"
#include "kernels/cuda/owners.hpp"
#include "zmuon/options.hpp"

namespace zmuon::gpu {

/// When Newton-Schulz replays its iterations from CUDA graphs (ns_workspace::set_graph_mode).
enum class graph_mode : uint8_t { off, on, automatic };

/// Buffers kept across calls so that a step of a steady shape allocates nothing: the iterate X
/// and its successor (ping-pong), A = X X^T, B = b*A + c*A*A, and the per-matrix norms.
class ns_workspace {
public:
  /// The default smallest block side of the symmetric products.
  static constexpr int64_t kDefaultSymmetricBlock = 256;

  /// `cublas` must be bound to the stream of every later run() (it serves the fallback path).
  /// The current device decides whether the own GEMM (sm_90a code) can run.
  explicit ns_workspace(cublasHandle_t cublas);

  /// Orthogonalizes `batch` row-major [rows, cols] matrices stored back to back at x (fp32 or
  /// bf16, ns_io), in place, on ctx.stream. Throws gpu::failure.
  void run(const launch_context& ctx, ns_io x, int64_t batch, int64_t rows, int64_t cols,
           const ns_options& ns);

  /// Time the GEMMs' candidate algorithms per shape (default), or take cuBLASLt's first.
  void set_autotune(bool on) {
    gemm_.set_autotune(on);
    graphs_.clear();
  }
  void set_gemm_path(gemm_path path) {
    gemm_.set_path(path);
    graphs_.clear();
  }
  /// Replay the iterations' GEMMs from a CUDA graph captured once per shape and coefficients
  /// (the kernels that touch x stay outside it, so x may change from call to call): always,
  /// never, or (the default) only for calls small enough to be bound by launches. A shape is
  /// captured at its second call; the first runs directly.
  void set_graph_mode(graph_mode mode) { graphs_mode_ = mode; }

  /// Symmetric products (see above) for Gram sides that split into blocks of at least
  /// `min_side`; 0 turns them off.
  void set_symmetric_block(int64_t min_side) {
    symmetric_min_side_ = min_side;
    graphs_.clear();
  }
  /// The blocks per side the symmetric products use for `batch` m×m Gram matrices (1: none).
  int64_t symmetric_blocks(int64_t m, int64_t batch) const;

  /// Run the symmetric products that measured faster there on zmuon's own Hopper GEMM
  /// (sm90_gemm.hpp; the default), or every GEMM on cuBLAS (tests and benchmarks compare).
  void set_own_gemm(bool on) {
    own_gemm_ = on;
    graphs_.clear();
  }
  /// For benchmarks: NS's update X' = B'X reads B' (symmetric, both triangles stored) in the
  /// other operand layout: for a wide X, B' untransposed (NN) in place of transposed (NT); for
  /// a tall X, transposed (TN) in place of untransposed (NN). The same product in exact
  /// arithmetic; cuBLAS may run either faster.
  void set_update_flipped(bool on) {
    update_flipped_ = on;
    graphs_.clear();
  }
  /// Whether the own GEMM computes A = X X^T of a wide X [m, n] (its rows are the operands:
  /// never for a tall input, whose rows are X's columns), and A*A.
  bool own_gram_product(int64_t batch, int64_t m, int64_t n, bool tall) const;
  bool own_square_product(int64_t batch, int64_t m) const;

  /// Device memory the workspace holds now (buffers kept across calls, the GEMMs' workspace).
  int64_t bytes() const;

private:
  /// Enqueues the `ns.steps` iterations from x_ (X, normalized); returns the final X. They
  /// alternate between x_ and x_next_, or, given `out`, between `out` and x_next_ so that the
  /// last one writes `out` (step_output), which needs no pointer arrays into X (see run()).
  __nv_bfloat16* iterate(cudaStream_t stream, int64_t batch, int64_t m, int64_t n, bool tall,
                         const ns_options& ns, __nv_bfloat16* out = nullptr);
  /// The graph for this call, or nullptr the first time a shape is seen.
  const graph_exec* graph_for(cudaStream_t stream, int64_t batch, int64_t m, int64_t n, bool tall,
                              const ns_options& ns);
  bool graphs_wanted(int64_t batch, int64_t m, int64_t n) const;
  /// The pointer arrays of the symmetric products' block GEMMs for this shape (built once per
  /// shape and workspace; see block_pointers in newton_schulz.cu for the layout).
  void* const* block_pointers(cudaStream_t stream, int64_t batch, int64_t m, int64_t n, bool tall,
                              int64_t k);

  gemm_runner gemm_;
  graph_mode graphs_mode_ = graph_mode::automatic;
  int64_t symmetric_min_side_ = kDefaultSymmetricBlock;
  bool own_gemm_ = true;
  bool update_flipped_ = false;
  bool own_gemm_device_ = false;  // whether the device runs sm_90a code
  std::map<std::vector<int64_t>, graph_exec> graphs_;
  std::map<std::vector<int64_t>, device_array<void*>> block_pointers_;
  device_array<__nv_bfloat16> x_;
  device_array<__nv_bfloat16> x_next_;
  device_array<__nv_bfloat16> a_;
  device_array<__nv_bfloat16> b_;
  device_array<double> partial_sums_;
  device_array<float> inv_norms_;
};

}  // namespace zmuon::gpu
