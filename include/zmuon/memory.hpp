// What a rank's compute backend holds in memory (device memory on cuda, host memory on host),
// for benchmarks and diagnostics.
#pragma once

#include <cstdint>

namespace zmuon {

/// Bytes of the buffers the backend handed out (parameters, optimizer state, gradients, and the
/// step's transient buffers: reduce buckets, gathered matrices, result shards) that are not yet
/// released, and the most there were at once since the last reset; `workspace` is the
/// backend's own scratch kept across steps (the Newton-Schulz workspace), counted apart.
struct memory_stats {
  int64_t in_use = 0;
  int64_t peak = 0;
  int64_t workspace = 0;
};

}  // namespace zmuon
