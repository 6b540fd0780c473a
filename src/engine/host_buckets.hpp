// engine::reduce's host buffers for packed reduce buckets, kept for reuse: a bucket's buffer comes
// back when the reducer drops it (after the store has added its slice), and the next micro-batch
// or step packs that bucket into it. Fresh buffers of this size come from the kernel as new
// pages, which it zeroes on first touch, a large share of a CPU step (docs/DECISIONS.md).
// Keeps at most one spare buffer per bucket, so a rank holds at most one packed
// gradient between steps. Thread-safe: buffers come back on the reducer's thread. Internal.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace zmuon {

class host_buckets {
public:
  explicit host_buckets(size_t buckets) : state_(std::make_shared<state>(buckets)) {}

  /// A buffer of `size` floats for bucket `bucket`: the spare one when there is one (zeroed when
  /// `need_zeros`: the packing leaves gaps), else a new zero-filled one. It returns here when its
  /// last owner drops it, even after this pool is gone (then it is freed).
  std::shared_ptr<std::vector<float>> take(size_t bucket, size_t size, bool need_zeros);

  /// Spare buffers kept now (tests).
  size_t spares() const;

private:
  struct state {
    explicit state(size_t buckets) : spare(buckets) {}
    std::mutex mutex;
    std::vector<std::unique_ptr<std::vector<float>>> spare;  // by bucket
  };
  std::shared_ptr<state> state_;
};

}  // namespace zmuon
