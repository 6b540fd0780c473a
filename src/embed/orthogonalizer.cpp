// The standalone Newton-Schulz call (zmuon/orthogonalize.hpp): the caller's matrices through a
// compute backend's newton_schulz / newton_schulz_bf16, ordered on the caller's CUDA stream with
// events as engine::reduce(rank, views, stream) orders its reads (engine/engine_reduce.cpp).
#include "zmuon/orthogonalize.hpp"

#include <cstdint>
#include <exception>
#include <limits>
#include <new>
#include <utility>

#include "kernels/compute.hpp"
#include "kernels/ns_variants.hpp"
#include "zmuon/config.hpp"

namespace zmuon {

struct orthogonalizer::impl {
  std::string backend;
  int device = 0;
  ns_options ns;
  std::unique_ptr<compute_backend> be;
  error failed;  // a device failure: the backend's state is lost, every later call says so
};

namespace {

error invalid(std::string message) {
  return {errc::invalid_argument, "newton_schulz: " + std::move(message)};
}

/// Why `x` cannot be orthogonalized by backend `backend` on device `device`, or no error.
error check_batch(const matrix_batch& x, const std::string& backend, int device) {
  if (x.batch <= 0 || x.rows <= 0 || x.cols <= 0)
    return invalid("batch, rows and cols must be >= 1, got batch " + std::to_string(x.batch)
                   + ", rows " + std::to_string(x.rows) + ", cols " + std::to_string(x.cols));
  // The host's BLAS takes int sides; and the batch's elements must count in int64.
  constexpr int64_t max_side = std::numeric_limits<int32_t>::max();
  if (x.rows > max_side || x.cols > max_side
      || x.batch > std::numeric_limits<int64_t>::max() / x.rows / x.cols)
    return invalid("batch " + std::to_string(x.batch) + " of " + std::to_string(x.rows) + "x"
                   + std::to_string(x.cols) + " is too large (sides up to 2^31 - 1)");
  if (x.data == nullptr)
    return invalid("the matrices' data pointer is NULL");
  if (x.dtype != element_type::fp32 && x.dtype != element_type::bf16)
    return {errc::unsupported, "newton_schulz: element type "
                                   + std::to_string(static_cast<int>(x.dtype))
                                   + " is not supported (fp32 or bf16)"};
  if (backend == "cuda" && x.space != memory_space::cuda)
    return {errc::unsupported,
            "newton_schulz: compute backend 'cuda' orthogonalizes device memory, and the "
            "matrices are in host memory (copy them to GPU "
                + std::to_string(device) + ", or use backend 'host')"};
  if (backend != "cuda" && x.space == memory_space::cuda)
    return {errc::unsupported, "newton_schulz: the matrices are a CUDA device buffer (device "
                                   + std::to_string(x.device) + "), which compute backend '"
                                   + backend + "' cannot read: use backend 'cuda'"};
  if (x.space == memory_space::cuda && x.device != device)
    return invalid("the matrices are on GPU " + std::to_string(x.device)
                   + ", this orthogonalizer's backend on GPU " + std::to_string(device));
  return {};
}

}  // namespace

orthogonalizer::orthogonalizer(std::unique_ptr<impl> d) : impl_(std::move(d)) {}
orthogonalizer::orthogonalizer(orthogonalizer&&) noexcept = default;
orthogonalizer& orthogonalizer::operator=(orthogonalizer&&) noexcept = default;
orthogonalizer::~orthogonalizer() = default;

expected<orthogonalizer> orthogonalizer::create(const std::string& backend, int device,
                                                const ns_options& ns) {
  if (backend == "cuda" && device < 0)
    return error{errc::invalid_argument, "compute backend 'cuda': device " + std::to_string(device)
                                             + " is not a CUDA device ordinal (>= 0)"};
  auto be = make_compute_backend(backend, device);
  if (!be)
    return be.err();
  if (auto err = check_ns_options(ns, backend))
    return err;
  auto d = std::make_unique<impl>();
  d->backend = backend;
  d->device = backend == "cuda" ? device : 0;
  d->ns = ns;
  d->be = std::move(*be);
  return orthogonalizer(std::move(d));
}

expected<orthogonalizer> orthogonalizer::create_from_json(const std::string& backend, int device,
                                                          const std::string& ns_json) {
  auto ns = parse_ns_options(ns_json);
  if (!ns)
    return ns.err();
  return create(backend, device, *ns);
}

const std::string& orthogonalizer::backend() const {
  return impl_->backend;
}

int orthogonalizer::device() const {
  return impl_->device;
}

const ns_options& orthogonalizer::options() const {
  return impl_->ns;
}

error orthogonalizer::set_options(const ns_options& ns) {
  if (auto err = check_ns_options(ns, impl_->backend))
    return err;
  impl_->ns = ns;
  return {};
}

error orthogonalizer::run(const matrix_batch& x) {
  return run_on(x, std::nullopt);
}

error orthogonalizer::run(const matrix_batch& x, void* cuda_stream) {
  return run_on(x, cuda_stream);
}

error orthogonalizer::run_on(const matrix_batch& x, std::optional<void*> cuda_stream) {
  impl& d = *impl_;
  if (d.failed)
    return {errc::bad_state, "newton_schulz: this orthogonalizer's backend failed earlier ("
                                 + d.failed.message() + "); create a new one"};
  if (auto err = check_batch(x, d.backend, d.device))
    return err;
  compute_backend& be = *d.be;
  const bool on_device = be.device_memory();
  if (on_device && cuda_stream)
    if (auto err = be.check_caller_stream(*cuda_stream))
      return {err.code(), "newton_schulz: " + err.message()};
  try {
    if (on_device && cuda_stream)  // after the caller's work on the matrices
      be.wait_for_stream(*cuda_stream);
    if (x.dtype == element_type::fp32)
      be.newton_schulz(static_cast<float*>(x.data), x.batch, x.rows, x.cols, d.ns);
    else
      be.newton_schulz_bf16(static_cast<uint16_t*>(x.data), x.batch, x.rows, x.cols, d.ns);
    if (on_device && cuda_stream)  // the caller's next work after the result
      be.make_stream_wait(*cuda_stream);
    else
      be.synchronize();
  } catch (const std::bad_alloc&) {
    return {errc::internal, "newton_schulz: out of memory for the workspace of "
                                + std::to_string(x.rows) + "x" + std::to_string(x.cols)};
  } catch (const std::exception& e) {
    if (!on_device)
      return {errc::internal, std::string("newton_schulz: ") + e.what()};
    d.failed = error{errc::device_failure, std::string("newton_schulz: ") + e.what()};
    return d.failed;
  }
  return {};
}

}  // namespace zmuon
