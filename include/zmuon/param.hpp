// What the host registers for each parameter: its name, logical shape, optimizer group and heads.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace zmuon {

/// Which optimizer a parameter uses. `automatic` applies the default rule: Muon when the logical
/// shape has ndim >= 2 and the name contains neither "embed" nor "lm_head".
enum class param_group : uint8_t { automatic, muon, adamw };

/// The most hyperparameter groups one engine takes (param_spec::hparam_group is below it).
inline constexpr int32_t kMaxHparamGroups = 4096;

/// What the host registers.
struct param_spec {
  std::string name;
  std::vector<int64_t> shape;
  param_group group = param_group::automatic;
  int64_t heads = 0;  // > 0: Muon per head, rows = heads * head_dim
  /// Whose hyperparameters the parameter steps with (engine::set_group_hparams); every rank and
  /// process registers the same value.
  int32_t hparam_group = 0;
};

}  // namespace zmuon
