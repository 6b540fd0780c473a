// The C ABI's handles and the helpers every area of it uses (c_api*.cpp): every entry point runs
// its body in guarded(), so errors become a status code plus the thread's last-error message,
// never an exception across the ABI. Internal to src/embed/.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "caf/logger.hpp"

#include "embed/job_hooks.hpp"
#include "zmuon/engine.hpp"
#include "zmuon/orthogonalize.hpp"
#include "zmuon/zmuon.h"

struct zmuon_engine {
  std::unique_ptr<zmuon::engine> eng;
  std::map<std::string, bool> uses_muon;  // by registered name
  std::unique_ptr<zmuon::job_hooks> job;  // zmuon_engine_create_with_host: notes, monitor
};

struct zmuon_orthogonalizer {
  zmuon::orthogonalizer ortho;
};

namespace zmuon::c_abi {

using zmuon::errc;

/// The calling thread's last error message (zmuon_last_error).
std::string& last_error();

inline int fail(const zmuon::error& err) {
  last_error() = err.message();
  return static_cast<int>(err.code());
}

inline int fail(errc code, std::string message) {
  return fail(zmuon::error{code, std::move(message)});
}

/// Lets go of the calling thread's reference to an actor system's logger when a call returns.
/// CAF 0.17 keeps one per thread that made a scoped actor, and ~actor_system waits until every
/// such reference is gone: a caller's thread that outlives the engine (autograd's device thread,
/// which runs backward hooks) would make the engine's destruction wait for that thread's end.
struct release_caf_logger {
  release_caf_logger() = default;
  release_caf_logger(const release_caf_logger&) = delete;
  release_caf_logger& operator=(const release_caf_logger&) = delete;
  ~release_caf_logger() { caf::logger::set_current_actor_system(nullptr); }
};

/// Runs `body` (which returns a zmuon::error) with every exception turned into a status.
template <class Body>
int guarded(const char* fn, Body&& body) {
  const release_caf_logger on_return;
  try {
    zmuon::error err = body();
    return err ? fail(err) : ZMUON_OK;
  } catch (const std::bad_alloc&) {
    return fail(errc::internal, std::string(fn) + ": out of memory");
  } catch (const std::exception& e) {
    return fail(errc::internal, std::string(fn) + ": " + e.what());
  } catch (...) {
    return fail(errc::internal, std::string(fn) + ": unknown exception");
  }
}

inline zmuon::error null_arg(const char* fn, const char* what) {
  return {errc::invalid_argument, std::string(fn) + ": " + what + " is NULL"};
}

/// guarded() for a call on `eng`: a NULL `eng` is an error naming `fn`.
template <class Body>
int on_engine(const char* fn, const zmuon_engine* eng, Body&& body) {
  return guarded(fn, [&]() -> zmuon::error { return eng ? body() : null_arg(fn, "eng"); });
}

/// A create call's `overrides` that are NULL (the array, or one of its `n` entries), named.
inline zmuon::error null_override(const char* fn, const char* const* overrides, size_t n) {
  if (n > 0 && !overrides)
    return null_arg(fn, "overrides");
  for (size_t i = 0; i < n; ++i)
    if (!overrides[i])
      return null_arg(fn, ("overrides[" + std::to_string(i) + "]").c_str());
  return {};
}

inline std::vector<std::string> override_list(const char* const* overrides, size_t n) {
  return {overrides, overrides + n};
}

template <class View, class Ptr>
zmuon::error views_of(const char* fn, const zmuon_tensor* t, size_t n, std::vector<View>& out) {
  if (n > 0 && !t)
    return null_arg(fn, "the tensor array");
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    if (!t[i].name)
      return {errc::invalid_argument,
              std::string(fn) + ": tensor " + std::to_string(i) + " has a NULL name"};
    View v;
    v.name = t[i].name;
    v.data = static_cast<Ptr>(t[i].data);
    v.size = t[i].numel;
    if (t[i].device != ZMUON_HOST) {
      if (t[i].device < 0)
        return {errc::invalid_argument, std::string(fn) + ": tensor '" + v.name + "' has device "
                                            + std::to_string(t[i].device)
                                            + " (ZMUON_HOST = -1 or a CUDA ordinal >= 0)"};
      v.space = zmuon::memory_space::cuda;
      v.device = t[i].device;
    }
    out.push_back(std::move(v));
  }
  return {};
}

inline int create(const char* fn, zmuon_engine** out,
                  const std::function<zmuon::expected<std::unique_ptr<zmuon::engine>>()>& make) {
  return guarded(fn, [&]() -> zmuon::error {
    if (!out)
      return null_arg(fn, "out");
    *out = nullptr;
    auto made = make();
    if (!made)
      return made.err();
    auto handle = std::make_unique<zmuon_engine>();
    handle->eng = std::move(*made);
    *out = handle.release();
    return {};
  });
}

/// The engine's buffer calls: checks `eng` and the tensors (read-only views, View =
/// tensor_view, or writable spans, tensor_span), then runs call(engine, views).
template <class View, class Ptr, class Call>
int with_views(const char* fn, zmuon_engine* eng, const zmuon_tensor* tensors, size_t n,
               Call call) {
  return guarded(fn, [&]() -> zmuon::error {
    if (!eng)
      return null_arg(fn, "eng");
    std::vector<View> views;
    if (auto err = views_of<View, Ptr>(fn, tensors, n, views))
      return err;
    return call(*eng->eng, views);
  });
}

}  // namespace zmuon::c_abi
