// A step's update rules per hyperparameter group, as the step's backend calls take them
// (docs/DESIGN.md §2): each group's Muon rule (kernels/muon_rule.hpp) and the non-Muon rule's
// arguments (kernels/scalar_rules.hpp). The coordinator and the store read a group's values only
// through these, derived once per step from the step's group table.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/compute.hpp"
#include "zmuon/group_hparams.hpp"

namespace zmuon {

/// The step's Muon rule of each group of its table.
inline std::vector<muon_rule> muon_rules_of(const std::vector<group_hparams>& groups) {
  std::vector<muon_rule> out;
  out.reserve(groups.size());
  for (const auto& g : groups)
    out.push_back(muon_rule_of(g.muon));
  return out;
}

/// The non-Muon rule's call for a group, at the parameter's `step`-th applied step.
inline scalar_args scalar_args_of(const adamw_options& a, int64_t step) {
  scalar_args args{a.lr, a.beta1, a.beta2, a.eps, a.weight_decay, step};
  args.cautious = a.cautious_weight_decay;
  args.algorithm = a.algorithm;
  return args;
}

}  // namespace zmuon
