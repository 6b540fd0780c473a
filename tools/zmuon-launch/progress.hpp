// The step display of zmuon-launch: on a terminal one updating line (step, loss, step time, ETA);
// otherwise one plain line per step, for logs and tests.
#pragma once

#include <chrono>
#include <cstdio>

#include "zmuon-launch/train.hpp"

namespace zmuon::example {

class progress {
public:
  /// `tty`: stdout is a terminal (isatty); `total` steps are expected.
  progress(int total, bool tty, std::FILE* out = stdout);
  /// Shows one finished step.
  void step(const step_record& rec);
  /// Ends the updating line (terminal only).
  void done();

private:
  using clock = std::chrono::steady_clock;
  int total_;
  bool tty_;
  std::FILE* out_;
  int shown_ = 0;
  clock::time_point start_ = clock::now();
  clock::time_point last_ = start_;
};

}  // namespace zmuon::example
