// DeepSpeed's five learning-rate schedules as closed formulas of the iteration k (the steps
// applied before this one, minus one), each as deepspeed/runtime/lr_schedules.py defines it.
#include <algorithm>
#include <cmath>

#include "zmuon/lr_schedule.hpp"

namespace zmuon {
namespace {

constexpr double kPi = 3.14159265358979323846;

/// Warm-up's fraction done at iteration k < n: log(k + 1) / log(n), or k / n.
double warmup_fraction(warmup_shape shape, int64_t k, int64_t n) {
  if (shape == warmup_shape::linear)
    return static_cast<double>(k) / static_cast<double>(n);
  return std::log(static_cast<double>(k + 1)) / std::log(static_cast<double>(n));
}

double warmup_lr(const lr_schedule_options& s, int g, double group_lr, int64_t k) {
  const double lo = s.warmup_min_lr[g];
  const double hi = std::isnan(s.warmup_max_lr[g]) ? group_lr : s.warmup_max_lr[g];
  if (k < 0)
    return lo;
  const int64_t n = std::max<int64_t>(2, s.warmup_num_steps);
  double gamma = 1.0;
  if (k < n) {
    gamma = warmup_fraction(s.warmup_type, k, n);
  } else if (s.type == lr_schedule_type::warmup_decay_lr) {
    const double left = static_cast<double>(s.total_num_steps - k);
    gamma = std::max(0.0, left / std::max(1.0, static_cast<double>(s.total_num_steps - n)));
  }
  return lo + (hi - lo) * gamma;
}

double warmup_cosine_lr(const lr_schedule_options& s, double group_lr, int64_t k) {
  if (k < 0)
    return 0.0;  // DeepSpeed's ratio before its first step() is 0
  const int64_t n = std::max<int64_t>(2, s.warmup_num_steps);
  if (k < n) {
    const double w = warmup_fraction(s.warmup_type, k, n);
    return group_lr * (s.warmup_min_ratio + w * (1.0 - s.warmup_min_ratio));
  }
  const double done = static_cast<double>(k - n + 1);
  const double span = std::max<double>(1.0, static_cast<double>(s.total_num_steps - n));
  const double progress = std::min(1.0, done / span);
  const double cosine = (1.0 + std::cos(kPi * progress)) / 2.0;
  return group_lr * std::max(0.0, s.cos_min_ratio + (1.0 - s.cos_min_ratio) * cosine);
}

double one_cycle_lr(const lr_schedule_options& s, int g, int64_t k) {
  const double first = s.cycle_first_step_size;
  const double second = s.cycle_second_step_size < 0 ? first : s.cycle_second_step_size;
  const double total = first + second;
  const double lo = s.cycle_min_lr[g], hi = s.cycle_max_lr[g];
  if (static_cast<double>(k) >= total) {  // after the cycle: decay from the minimum
    if (s.decay_step_size == 0 || s.decay_lr_rate == 0)
      return lo;
    const double interval = (static_cast<double>(k) - total + 1) / s.decay_step_size;
    return lo / (1.0 + s.decay_lr_rate * interval);
  }
  const double b = static_cast<double>(k + 1);
  const double ratio = first / total;
  const double x = 1.0 + b / total - std::floor(1.0 + b / total);
  double scale = x <= ratio ? x / ratio : (x - 1.0) / (ratio - 1.0);
  const int64_t stairs = x <= ratio                       ? s.cycle_first_stair_count
                         : s.cycle_second_stair_count < 0 ? s.cycle_first_stair_count
                                                          : s.cycle_second_stair_count;
  if (stairs > 0) {
    const double at = std::fmod(b, total);
    const double position = at <= first ? at * static_cast<double>(stairs) / first
                                        : (total - at) * static_cast<double>(stairs) / second;
    scale = std::floor(position) / static_cast<double>(stairs);
  }
  return lo + (hi - lo) * scale;
}

double lr_range_test_lr(const lr_schedule_options& s, int g, int64_t k) {
  double interval = static_cast<double>(k + 1) / static_cast<double>(s.lr_range_test_step_size);
  if (s.lr_range_test_staircase)
    interval = std::floor(interval);
  return s.lr_range_test_min_lr[g] * (1.0 + s.lr_range_test_step_rate * interval);
}

}  // namespace

double scheduled_lr(const lr_schedule_options& s, int group, double group_lr, uint64_t applied) {
  const int g = group == kAdamwGroup ? kAdamwGroup : kMuonGroup;
  const int64_t k = static_cast<int64_t>(applied) - 1;
  switch (s.type) {
    case lr_schedule_type::warmup_lr:
    case lr_schedule_type::warmup_decay_lr:
      return warmup_lr(s, g, group_lr, k);
    case lr_schedule_type::warmup_cosine_lr:
      return warmup_cosine_lr(s, group_lr, k);
    case lr_schedule_type::one_cycle:
      return one_cycle_lr(s, g, k);
    case lr_schedule_type::lr_range_test:
      return lr_range_test_lr(s, g, k);
    case lr_schedule_type::none:
      break;
  }
  return group_lr;
}

const char* lr_schedule_name(lr_schedule_type type) {
  switch (type) {
    case lr_schedule_type::warmup_lr:
      return "WarmupLR";
    case lr_schedule_type::warmup_decay_lr:
      return "WarmupDecayLR";
    case lr_schedule_type::warmup_cosine_lr:
      return "WarmupCosineLR";
    case lr_schedule_type::one_cycle:
      return "OneCycle";
    case lr_schedule_type::lr_range_test:
      return "LRRangeTest";
    case lr_schedule_type::none:
      break;
  }
  return "none";
}

}  // namespace zmuon
