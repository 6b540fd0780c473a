// The C ABI: Newton-Schulz on its own (zmuon::orthogonalizer).
#include "embed/c_api.hpp"

#include <string>

using namespace zmuon::c_abi;
using zmuon::errc;

extern "C" {

// -- Newton-Schulz on its own ------------------------------------------------------------------

int zmuon_orthogonalizer_create(const char* backend, int32_t device, const char* ns_json,
                                zmuon_orthogonalizer** out) {
  const char* fn = "zmuon_orthogonalizer_create";
  return guarded(fn, [&]() -> zmuon::error {
    if (!out)
      return null_arg(fn, "out");
    *out = nullptr;
    if (!backend)
      return null_arg(fn, "backend");
    auto made = zmuon::orthogonalizer::create_from_json(backend, device, ns_json ? ns_json : "");
    if (!made)
      return made.err();
    *out = new zmuon_orthogonalizer{std::move(*made)};
    return {};
  });
}

int zmuon_orthogonalizer_set_options(zmuon_orthogonalizer* ns, const char* ns_json) {
  const char* fn = "zmuon_orthogonalizer_set_options";
  return guarded(fn, [&]() -> zmuon::error {
    if (!ns)
      return null_arg(fn, "ns");
    auto options = zmuon::parse_ns_options(ns_json ? ns_json : "");
    if (!options)
      return options.err();
    return ns->ortho.set_options(*options);
  });
}

void zmuon_orthogonalizer_destroy(zmuon_orthogonalizer* ns) {
  try {
    delete ns;
  } catch (...) {  // a destructor that throws must not cross the ABI
  }
}

namespace {

/// x as the orthogonalizer's matrix_batch: 2-d [rows, cols] or 3-d [batch, rows, cols].
zmuon::error batch_of(const char* fn, const zmuon_array* x, zmuon::matrix_batch& out) {
  if (!x)
    return null_arg(fn, "x");
  if (x->ndim != 2 && x->ndim != 3)
    return {errc::invalid_argument,
            std::string(fn) + ": x has " + std::to_string(x->ndim)
                + " dimensions; Newton-Schulz takes [rows, cols] or [batch, rows, cols]"};
  if (!x->shape)
    return null_arg(fn, "x->shape");
  if (x->dtype != ZMUON_FLOAT32 && x->dtype != ZMUON_BFLOAT16)
    return {errc::invalid_argument, std::string(fn) + ": x->dtype " + std::to_string(x->dtype)
                                        + " is not ZMUON_FLOAT32 (0) or ZMUON_BFLOAT16 (1)"};
  if (x->device < ZMUON_HOST)
    return {errc::invalid_argument, std::string(fn) + ": x->device " + std::to_string(x->device)
                                        + " is not ZMUON_HOST (-1) or a CUDA ordinal (>= 0)"};
  out.data = x->data;
  out.dtype = static_cast<zmuon::element_type>(x->dtype);
  out.batch = x->ndim == 3 ? x->shape[0] : 1;
  out.rows = x->shape[x->ndim - 2];
  out.cols = x->shape[x->ndim - 1];
  out.space = x->device == ZMUON_HOST ? zmuon::memory_space::host : zmuon::memory_space::cuda;
  out.device = x->device == ZMUON_HOST ? 0 : x->device;
  return {};
}

int orthogonalize(const char* fn, zmuon_orthogonalizer* ns, const zmuon_array* x,
                  std::optional<void*> cuda_stream) {
  return guarded(fn, [&]() -> zmuon::error {
    if (!ns)
      return null_arg(fn, "ns");
    zmuon::matrix_batch batch;
    if (auto err = batch_of(fn, x, batch))
      return err;
    return cuda_stream ? ns->ortho.run(batch, *cuda_stream) : ns->ortho.run(batch);
  });
}

}  // namespace

int zmuon_orthogonalize(zmuon_orthogonalizer* ns, const zmuon_array* x) {
  return orthogonalize("zmuon_orthogonalize", ns, x, std::nullopt);
}

int zmuon_orthogonalize_on_stream(zmuon_orthogonalizer* ns, const zmuon_array* x,
                                  void* cuda_stream) {
  return orthogonalize("zmuon_orthogonalize_on_stream", ns, x, cuda_stream);
}

}  // extern "C"
