#include "kernels/cuda/pinned_cache.hpp"

#include <utility>

namespace zmuon::gpu {

pinned_cache::~pinned_cache() {
  for (auto& [bytes, p] : free_)
    (void)cudaFreeHost(p);
}

void* pinned_cache::take(size_t bytes) {
  const std::lock_guard<std::mutex> lock(mutex_);
  const auto found = free_.find(bytes);
  if (found == free_.end())
    return nullptr;
  void* p = found->second;
  free_.erase(found);
  held_ -= bytes;
  return p;
}

void pinned_cache::put(void* p, size_t bytes) {
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    if (held_ + bytes <= kMaxBytes) {
      held_ += bytes;
      free_.emplace(bytes, p);
      return;
    }
  }
  (void)cudaFreeHost(p);
}

void pinned_cache::release(const std::shared_ptr<pinned_cache>& cache, cudaStream_t stream, void* p,
                           size_t bytes) {
  {
    const std::lock_guard<std::mutex> lock(cache->mutex_);
    if (cache->held_ + bytes <= kMaxBytes) {
      cache->held_ += bytes;  // reserved now; the block lands when the stream gets there
      auto landing = std::make_unique<returning>(returning{cache, p, bytes});
      if (cudaLaunchHostFunc(stream, land, landing.get()) == cudaSuccess) {
        landing.release();
        return;
      }
      cache->held_ -= bytes;
    }
  }
  (void)cudaFreeHost(p);
}

void CUDART_CB pinned_cache::land(void* data) {
  std::unique_ptr<returning> r(static_cast<returning*>(data));
  const std::lock_guard<std::mutex> lock(r->cache->mutex_);
  r->cache->free_.emplace(r->bytes, r->p);
}

}  // namespace zmuon::gpu
