// Host-side tensors as the API hands them over: fp32, row-major, by name.
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

}  // namespace zmuon
