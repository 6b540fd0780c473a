// Small text helpers the checkpoint's files share (checkpoint.cpp, manifest.cpp); not installed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "zmuon/status.hpp"

namespace zmuon::detail {

inline std::string in_quotes(const std::string& s) {
  return "'" + s + "'";
}

/// An io_error naming the file: "'path': what".
inline error bad(const std::string& path, const std::string& what) {
  return {errc::io_error, in_quotes(path) + ": " + what};
}

inline std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace zmuon::detail
