// A Muon group's update rule as one typed description (docs/DESIGN.md §2): its step's values,
// derived once per step from the group's muon_options. The coordinator and the store read a
// group's Muon values only through it. Each backend applies it in two functions:
// compute_backend::post_ns (the transform of NS's output, then the scale) and
// compute_backend::muon_update_slices (the update of a chunk's parameters). A new rule is a
// field or a case here and in those two functions.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "zmuon/options.hpp"

namespace zmuon {

/// Where a group's decoupled weight decay applies.
enum class decay_mask : uint8_t {
  all,       // every element: p*(1 - lr*wd)
  cautious,  // only where p and the update agree in sign (arXiv:2510.12402)
};

/// One group's Muon rule, stage by stage.
struct muon_rule {
  // The momentum: m = beta*m + (1-beta)*g; u = nesterov ? (1-beta)*g + beta*m : m.
  float momentum = 0.95f;
  bool nesterov = true;
  // Newton-Schulz on each NS block (plan.hpp, muon_block): variant, steps, coefficients.
  ns_options ns = automatic_ns();
  // The transform of NS's output before the scale: none (muon) or NorMuon's row normalization,
  // whose row moments live in the block owner's store.
  muon_variant transform = muon_variant::muon;
  float normuon_beta2 = 0.95f;
  float normuon_eps = 1e-8f;
  // The scale of a block's update (scale()).
  adjust_lr_rule scale_rule = adjust_lr_rule::original;
  // The update: p = p*(1 - lr*wd) - lr*scale*o, the decay where `decay` says.
  float lr = 0.02f;
  float weight_decay = 0.0f;
  decay_mask decay = decay_mask::all;
  // MuonClip's threshold tau for the group's query/key pairs; 0 = off.
  float qk_clip_tau = 0.0f;

  /// Whether a transform follows NS (then the owner's store applies it, with the scale).
  bool transforms() const { return transform != muon_variant::muon; }

  /// Scale of the orthogonalized update of one [rows, cols] block.
  float scale(int64_t rows, int64_t cols) const {
    auto r = static_cast<double>(rows);
    auto c = static_cast<double>(cols);
    switch (scale_rule) {  // -Wswitch names a rule without its case
      case adjust_lr_rule::match_rms_adamw:
      case adjust_lr_rule::rms:
        // Moonlight (arXiv:2502.16982, eq. 4); Dion's adjust_lr_rms_norm is the same formula.
        return static_cast<float>(0.2 * std::sqrt(std::max(r, c)));
      case adjust_lr_rule::spectral:
        // Dion's adjust_lr_spectral_norm (microsoft/dion, after arXiv:2310.17813): spectral
        // norm 1 to RMS operator norm 1, sqrt(fan_out / fan_in), below 1 for wide matrices.
        return static_cast<float>(std::sqrt(r / c));
      case adjust_lr_rule::original:
        break;
    }
    // Keller Jordan's Muon: sqrt(max(1, rows / cols)).
    return static_cast<float>(std::sqrt(std::max(1.0, r / c)));
  }
};

/// The rule of a group whose values are `m` (m.transport is the engine's, not the rule's).
inline muon_rule muon_rule_of(const muon_options& m) {
  muon_rule r;
  r.momentum = m.momentum;
  r.nesterov = m.nesterov;
  r.ns = m.ns;
  r.transform = m.variant;
  r.normuon_beta2 = m.normuon_beta2;
  r.normuon_eps = m.normuon_eps;
  r.scale_rule = m.adjust_lr;
  r.lr = m.lr;
  r.weight_decay = m.weight_decay;
  r.decay = m.cautious_weight_decay ? decay_mask::cautious : decay_mask::all;
  r.qk_clip_tau = m.qk_clip_tau;
  return r;
}

}  // namespace zmuon
