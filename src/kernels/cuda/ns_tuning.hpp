// For tests and benchmarks only: the knobs of the CUDA backend's Newton-Schulz, which the engine
// never turns (nothing under src/ includes this header). What production runs is the backend's
// defaults: the cuBLASLt path, 8 algorithms timed per shape, CUDA graphs for launch-bound calls,
// symmetric blocks from 256, the own Hopper GEMM where the device runs it (gemm_choice.hpp).
#pragma once

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/cuda_compute.hpp"
#include "kernels/cuda/gemm.hpp"
#include "kernels/cuda/sm90/sm90_gemm.hpp"

namespace zmuon::gpu {

class ns_tuning {
public:
  explicit ns_tuning(cuda_compute& backend) : be_(backend) {}

  /// How Newton-Schulz runs its GEMMs (gemm.hpp).
  void set_gemm_path(gemm_path path) {
    be_.for_each_lane([&](cuda_compute::ns_lane& lane) {
      lane.ns.set_gemm_path(path);
      lane.gram_ns.set_gemm_path(path);
    });
  }
  /// Time the candidate algorithms per shape (the default), or take cuBLASLt's first.
  void set_autotune(bool on) {
    be_.for_each_lane([&](cuda_compute::ns_lane& lane) { lane.ns.set_autotune(on); });
  }
  /// How many of cuBLASLt's algorithms are timed per new shape, in the whole process (1..64;
  /// default 8; gemm.hpp). Shapes already timed keep their choice.
  static void set_gemm_candidates(int count) { gemm_runner::set_candidates(count); }
  /// Replay Newton-Schulz's GEMMs from CUDA graphs always or never (the default: for
  /// launch-bound calls only; newton_schulz.hpp).
  void set_graphs(graph_mode mode) {
    be_.for_each_lane([&](cuda_compute::ns_lane& lane) { lane.ns.set_graph_mode(mode); });
  }
  /// The smallest block side of the symmetric products (0: off), and the blocks per side they
  /// use for an m×m Gram matrix (newton_schulz.hpp).
  void set_symmetric_block(int64_t min_side) {
    be_.for_each_lane([&](cuda_compute::ns_lane& lane) { lane.ns.set_symmetric_block(min_side); });
  }
  int64_t symmetric_blocks(int64_t m, int64_t batch) const {
    return be_.lanes_[0]->ns.symmetric_blocks(m, batch);
  }
  /// Newton-Schulz's symmetric products on zmuon's own Hopper GEMM where it measured faster and
  /// the device runs it (the default), or every GEMM on cuBLAS (sm90_gemm.hpp).
  void set_own_gemm(bool on) {
    be_.for_each_lane([&](cuda_compute::ns_lane& lane) {
      lane.ns.set_own_gemm(on);
      lane.gram_ns.set_own_gemm(on);
    });
  }
  /// Whether backends made from now on may use the own GEMM at all, as on a device without
  /// sm_90a (the whole process; backends already made keep what they had): the cuBLAS-only
  /// path of every non-Hopper device, forced on a Hopper one (zmuon-bench-step --cublas-only).
  static void set_own_gemm_for_new_backends(bool on) { sm90_gemm_allow(on); }
  /// Whether the standard iteration on `batch` [rows, cols] matrices runs A = X X^T, and A*A,
  /// on the own GEMM.
  bool own_products(int64_t batch, int64_t rows, int64_t cols, bool square) const {
    const int64_t m = std::min(rows, cols);
    const ns_workspace& ns = be_.lanes_[0]->ns;
    return square ? ns.own_square_product(batch, m)
                  : ns.own_gram_product(batch, m, std::max(rows, cols), rows > cols);
  }
  /// NS's update reads B' in the other operand layout (newton_schulz.hpp).
  void set_update_flipped(bool on) {
    be_.for_each_lane([&](cuda_compute::ns_lane& lane) { lane.ns.set_update_flipped(on); });
  }

private:
  cuda_compute& be_;
};

}  // namespace zmuon::gpu
