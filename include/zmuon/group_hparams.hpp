// One parameter group's hyperparameters. The engine reads them at every step
// (engine::set_group_hparams, zmuon_engine_set_group_hparams), as torch reads param_groups.
#pragma once

#include "zmuon/options.hpp"

namespace zmuon {

/// A group's values. `muon` applies to the group's Muon parameters, `adamw` to its AdamW ones.
/// muon.transport is the engine's choice, never a group's.
struct group_hparams {
  muon_options muon;
  adamw_options adamw;
};

}  // namespace zmuon
