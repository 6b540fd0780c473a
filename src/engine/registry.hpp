// engine_registry: what the host registers before the engine starts: the parameter table (and
// its plan once started), the hyperparameter groups and schedules, the armed faults. Part of
// engine::impl (impl.hpp). Internal: not installed.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/faults.hpp"
#include "plan/plan.hpp"
#include "zmuon/engine.hpp"

namespace zmuon {

struct engine_registry {
  std::vector<param_spec> table;
  /// Each name's index in `table`: add_parameter's duplicate check and set_hparam_group's
  /// lookup, O(1) a call.
  std::unordered_map<std::string, size_t> table_names;
  std::vector<std::vector<float>> init;  // initial values by parameter (empty: zeros) until start
  std::shared_ptr<const plan> pl;        // made once, when the engine starts
  fault_options faults;                  // tests only (arm_faults)
  lr_schedule muon_lr;
  lr_schedule adam_lr;
  std::map<int, group_hparams> group_set;  // set_group_hparams: the groups given values

  /// The registered parameter `name`, or null.
  param_spec* find(const std::string& name) {
    auto it = table_names.find(name);
    return it == table_names.end() ? nullptr : &table[it->second];
  }

  /// The options' constant learning rates, until set_lr_schedules.
  void constant_rates(const engine_options& o) {
    float muon = o.muon.lr;
    float adam = o.adamw.lr;
    muon_lr = [muon](uint64_t) { return muon; };
    adam_lr = [adam](uint64_t) { return adam; };
  }
};

}  // namespace zmuon
