// Host-side tensors as the API hands them over: fp32, row-major, by name; either owned
// (tensor_map) or as views of the caller's buffers (tensor_view for reading, tensor_span for
// writing), which the engine reads or fills in place without an intermediate copy.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace zmuon {

struct named_tensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> data;
};

/// Full tensors by name (parameters read back, gradients handed over).
using tensor_map = std::map<std::string, std::vector<float>>;

/// Where a caller's buffer lives. `cuda` buffers are accepted only by a build and backend that
/// support device buffers; any other gets errc::unsupported.
enum class memory_space : uint8_t { host, cuda };

/// A caller's fp32 buffer the engine reads (a gradient), valid for the length of the call.
struct tensor_view {
  std::string name;
  const float* data = nullptr;
  int64_t size = 0;  // elements
  memory_space space = memory_space::host;
  int device = 0;  // CUDA device ordinal when space == cuda
};

/// A caller's fp32 buffer the engine writes (a parameter), valid for the length of the call.
struct tensor_span {
  std::string name;
  float* data = nullptr;
  int64_t size = 0;  // elements
  memory_space space = memory_space::host;
  int device = 0;  // CUDA device ordinal when space == cuda
};

}  // namespace zmuon
