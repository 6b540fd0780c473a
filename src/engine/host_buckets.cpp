#include "engine/host_buckets.hpp"

#include <algorithm>

namespace zmuon {

std::shared_ptr<std::vector<float>> host_buckets::take(size_t bucket, size_t size,
                                                       bool need_zeros) {
  std::unique_ptr<std::vector<float>> buffer;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    if (bucket < state_->spare.size())
      buffer = std::move(state_->spare[bucket]);
  }
  if (buffer && buffer->size() == size) {
    if (need_zeros)
      std::fill(buffer->begin(), buffer->end(), 0.0f);
  } else {
    buffer = std::make_unique<std::vector<float>>(size, 0.0f);
  }
  std::weak_ptr<state> home = state_;
  return std::shared_ptr<std::vector<float>>(buffer.release(),
                                             [home, bucket](std::vector<float>* v) {
                                               std::unique_ptr<std::vector<float>> back(v);
                                               if (auto s = home.lock()) {
                                                 std::lock_guard<std::mutex> lock(s->mutex);
                                                 if (bucket < s->spare.size() && !s->spare[bucket])
                                                   s->spare[bucket] = std::move(back);
                                               }
                                             });
}

size_t host_buckets::spares() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return static_cast<size_t>(std::count_if(state_->spare.begin(), state_->spare.end(),
                                           [](const auto& b) { return b != nullptr; }));
}

}  // namespace zmuon
