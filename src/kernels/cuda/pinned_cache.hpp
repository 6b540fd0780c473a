// pinned_cache: page-locked host blocks kept for reuse by exact size. cudaFreeHost synchronizes
// the device, which would stall a step that releases its staging mirrors or a landing place of
// the vote's sums. Shared (shared_ptr) by a backend and the release functions of the buffers
// it handed out, which may run after the backend is gone.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>

namespace zmuon::gpu {

class pinned_cache {
public:
  /// Cached blocks are freed beyond this much (more is freed at once).
  static constexpr size_t kMaxBytes = size_t{4} << 30;

  pinned_cache() = default;
  ~pinned_cache();
  pinned_cache(const pinned_cache&) = delete;
  pinned_cache& operator=(const pinned_cache&) = delete;

  /// A cached block of exactly `bytes`, or nullptr.
  void* take(size_t bytes);
  /// `p` (page-locked, `bytes` long) back now, where nothing uses it any more: into the cache,
  /// or freed when the cache is full.
  void put(void* p, size_t bytes);
  /// Releases `p` once `stream` has done everything enqueued so far (a host function: async
  /// copies still reading or writing it finish first): into the cache, or (when the cache is
  /// full, or the host function cannot be enqueued) with cudaFreeHost at once.
  static void release(const std::shared_ptr<pinned_cache>& cache, cudaStream_t stream, void* p,
                      size_t bytes);

private:
  struct returning {
    std::shared_ptr<pinned_cache> cache;
    void* p;
    size_t bytes;
  };
  static void CUDART_CB land(void* data);  // no CUDA calls allowed there

  std::mutex mutex_;
  std::multimap<size_t, void*> free_;
  size_t held_ = 0;  // cached bytes, and those on their way back
};

}  // namespace zmuon::gpu
