// A group's update rule as the step's backend calls take it (docs/DESIGN.md §2): the Muon
// update's scale per NS block, its decay mask, and the non-Muon rule's arguments. The
// coordinator and the store read a group's values only through these.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/compute.hpp"
#include "zmuon/group_hparams.hpp"

namespace zmuon {

/// Scale of the orthogonalized update of one [rows, cols] block (docs/DESIGN.md §2).
inline float update_scale(adjust_lr_rule rule, int64_t rows, int64_t cols) {
  auto r = static_cast<double>(rows);
  auto c = static_cast<double>(cols);
  if (rule == adjust_lr_rule::match_rms_adamw || rule == adjust_lr_rule::rms)
    // Moonlight (arXiv:2502.16982, eq. 4); Dion's adjust_lr_rms_norm is the same formula.
    return static_cast<float>(0.2 * std::sqrt(std::max(r, c)));
  if (rule == adjust_lr_rule::spectral)
    // Dion's adjust_lr_spectral_norm (microsoft/dion, after arXiv:2310.17813): spectral norm 1
    // to RMS operator norm 1, sqrt(fan_out / fan_in), below 1 for wide matrices.
    return static_cast<float>(std::sqrt(r / c));
  // Keller Jordan's Muon: sqrt(max(1, rows / cols)).
  return static_cast<float>(std::sqrt(std::max(1.0, r / c)));
}

/// Where a group's decoupled weight decay applies.
inline decay_mask decay_of(bool cautious) {
  return cautious ? decay_mask::cautious : decay_mask::all;
}

/// The non-Muon rule's call for a group, at the parameter's `step`-th applied step.
inline scalar_args scalar_args_of(const adamw_options& a, int64_t step) {
  scalar_args args{a.lr, a.beta1, a.beta2, a.eps, a.weight_decay, step};
  args.cautious = a.cautious_weight_decay;
  args.algorithm = a.algorithm;
  return args;
}

}  // namespace zmuon
