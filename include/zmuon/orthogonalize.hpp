// Newton-Schulz on its own, without an engine: orthogonalize the caller's matrices in place with
// zmuon's compute backends (a Dion-like optimizer of the caller's, or a comparison with another
// NS on the same tensors). The backend and its workspace live as long as the orthogonalizer.
//
//   auto ortho = zmuon::orthogonalizer::create("host");   // or ("cuda", device)
//   zmuon::matrix_batch x{data, zmuon::element_type::fp32, /*batch=*/3, /*rows=*/256, /*cols=*/64};
//   if (auto err = ortho->run(x)) ...                      // x now holds the orthogonalized
//   matrices
//
// Threads: one orthogonalizer runs one call at a time (its workspace is shared by its calls);
// use one per thread for concurrent calls.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "zmuon/options.hpp"
#include "zmuon/status.hpp"
#include "zmuon/tensor.hpp"

namespace zmuon {

/// The element type of the matrices: fp32, or bf16 (the upper 16 bits of an fp32, as
/// torch.bfloat16 stores it).
enum class element_type : uint8_t { fp32, bf16 };

/// `batch` row-major [rows, cols] matrices stored back to back (contiguous) at `data`. On the
/// cuda backend `data` is device memory (space cuda) on the orthogonalizer's GPU; on the host
/// backend host memory.
struct matrix_batch {
  void* data = nullptr;
  element_type dtype = element_type::fp32;
  int64_t batch = 1;
  int64_t rows = 0;
  int64_t cols = 0;
  memory_space space = memory_space::host;
  int device = 0;  // CUDA device ordinal when space == cuda
};

/// What a call computes, per matrix X (the engine's Newton-Schulz, docs/DESIGN.md §2): tall
/// matrices as their transpose, X / (||X||_F + ns.eps), then ns.steps iterations of
/// X <- a X + (b A + c A^2) X, A = X X^T (or the Gram form of ns.variant; ns.schedule gives
/// per-step (a, b, c)). fp32 on the host backend (bf16 input is widened and the result rounded);
/// bf16 arithmetic with fp32 sums on cuda, whatever the element type.
///
/// Non-finite input is not checked (on cuda that would cost a synchronization): a matrix with
/// a NaN or an infinity comes back all NaN, because its norm is, and the other matrices of the
/// batch are not affected.
class orthogonalizer {
public:
  /// A backend by name ("host", or "cuda" when built with it) on CUDA device `device` (ignored
  /// by the host backend), with options `ns` (default: the engine's, ns_variant::automatic).
  /// Errors: an unknown backend, one not built in, no such GPU (errc::invalid_argument), and
  /// options the backend cannot run (check_ns_options: e.g. ns_steps < 1).
  static expected<orthogonalizer> create(const std::string& backend, int device = 0,
                                         const ns_options& ns = automatic_ns());
  /// The same with the options from JSON text: an object of the config's Newton-Schulz keys
  /// (ns_steps, ns_coefficients, ns_schedule, ns_variant, ns_gram_restart; see
  /// parse_ns_options in zmuon/config.hpp), "" for the defaults.
  static expected<orthogonalizer> create_from_json(const std::string& backend, int device,
                                                   const std::string& ns_json);

  orthogonalizer(orthogonalizer&&) noexcept;
  orthogonalizer& operator=(orthogonalizer&&) noexcept;
  ~orthogonalizer();

  const std::string& backend() const;
  int device() const;
  const ns_options& options() const;
  /// Options for the calls that follow; refused (and the old ones kept) when the backend
  /// cannot run them.
  error set_options(const ns_options& ns);

  /// Orthogonalizes x's matrices in place. On cuda it returns once the result is written (it
  /// synchronizes); the caller must have finished writing x (e.g. torch.cuda.synchronize()).
  /// Errors: batch, rows or cols <= 0, null data (errc::invalid_argument); memory the backend
  /// cannot reach (host memory for cuda, device memory for host: errc::unsupported); another
  /// GPU than the orthogonalizer's (invalid_argument); a CUDA failure (errc::device_failure,
  /// after which every call fails with errc::bad_state naming it).
  error run(const matrix_batch& x);
  /// The same, ordered on the caller's CUDA stream `cuda_stream` (a cudaStream_t; nullptr is the
  /// default stream) without waiting: the work starts after the work queued there so far, and
  /// the work queued there afterwards waits for it. A stream on another GPU or capturing a CUDA
  /// graph is refused (errc::invalid_argument). The host backend runs the call to its end and
  /// ignores the stream.
  error run(const matrix_batch& x, void* cuda_stream);

private:
  struct impl;
  explicit orthogonalizer(std::unique_ptr<impl> d);
  error run_on(const matrix_batch& x, std::optional<void*> cuda_stream);
  std::unique_ptr<impl> impl_;
};

}  // namespace zmuon
