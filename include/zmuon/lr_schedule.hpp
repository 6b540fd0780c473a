// DeepSpeed's learning-rate schedules (the config's `scheduler` section) for both parameter
// groups, as functions of the steps applied so far.
#pragma once

#include <array>
#include <cstdint>
#include <limits>

namespace zmuon {

enum class lr_schedule_type : uint8_t {
  none,              // the optimizer's constant rates
  warmup_lr,         // WarmupLR
  warmup_decay_lr,   // WarmupDecayLR
  warmup_cosine_lr,  // WarmupCosineLR
  one_cycle,         // OneCycle
  lr_range_test,     // LRRangeTest
};

/// How warm-up rises from its start to its end.
enum class warmup_shape : uint8_t { log, linear };

/// Per-group values are indexed by group: DeepSpeed's order for Muon.
inline constexpr int kMuonGroup = 0;
inline constexpr int kAdamwGroup = 1;

/// The parameters of every schedule, with DeepSpeed's defaults. Per-group pairs hold one value
/// for each group ([Muon, AdamW]); a NaN maximum stands for the group's own lr.
struct lr_schedule_options {
  lr_schedule_type type = lr_schedule_type::none;
  // WarmupLR and WarmupDecayLR.
  std::array<double, 2> warmup_min_lr{0.0, 0.0};
  std::array<double, 2> warmup_max_lr{std::numeric_limits<double>::quiet_NaN(),
                                      std::numeric_limits<double>::quiet_NaN()};
  int64_t warmup_num_steps = 1000;
  warmup_shape warmup_type = warmup_shape::log;
  int64_t total_num_steps = 0;  // WarmupDecayLR and WarmupCosineLR
  // WarmupCosineLR: ratios of the group's lr.
  double warmup_min_ratio = 0.0;
  double cos_min_ratio = 1e-4;
  // OneCycle. A negative second step size or stair count means "as the first".
  std::array<double, 2> cycle_min_lr{0.0, 0.0};
  std::array<double, 2> cycle_max_lr{0.0, 0.0};
  double decay_lr_rate = 0.0;
  double cycle_first_step_size = 2000;
  double cycle_second_step_size = -1;
  int64_t cycle_first_stair_count = 0;
  int64_t cycle_second_stair_count = -1;
  double decay_step_size = 0;
  // LRRangeTest.
  std::array<double, 2> lr_range_test_min_lr{1e-3, 1e-3};
  int64_t lr_range_test_step_size = 2000;
  double lr_range_test_step_rate = 1.0;
  bool lr_range_test_staircase = false;
};

/// The lr of `group` for the optimizer step that follows `applied` applied steps (DeepSpeed's
/// last_batch_iteration is applied - 1); `group_lr` is the group's rate from the optimizer
/// section. Without a schedule, `group_lr`.
double scheduled_lr(const lr_schedule_options& s, int group, double group_lr, uint64_t applied);

/// DeepSpeed's name of a schedule type ("WarmupLR"; "none").
const char* lr_schedule_name(lr_schedule_type type);

}  // namespace zmuon
