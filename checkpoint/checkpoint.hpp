// Checkpoints on disk: pure functions of the plan and the ranks' states, no actors.
//
//   DIR/latest                        the name of the newest complete checkpoint ("step_00000005")
//   DIR/step_00000005/rank_00000.safetensors   rank 0's shards (real elements only, no padding):
//                                     param/<name>, momentum/<name> (Muon), exp_avg/<name> and
//                                     exp_avg_sq/<name> (AdamW); metadata rank, world, step
//   DIR/step_00000005/manifest.json   world, step, AdamW step count, loss-scaler state, the
//                                     parameter table, the job's config, size and CRC-32 per file
//
// Every file is written atomically (temporary file, fsync, rename, fsync of the directory); the
// manifest is written after all shard files and `latest` after the manifest, so a save that dies
// halfway leaves `latest` naming the previous complete checkpoint. The two newest complete
// checkpoints are kept; older ones and incomplete ones are removed after a successful save.
// Loading reads the shards of every rank back into full tensors and splits them by the target
// plan, so the world size may differ from the one that saved.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "plan/plan.hpp"
#include "zmuon/rank_state.hpp"
#include "zmuon/status.hpp"

namespace zmuon {

struct checkpoint_param {
  std::string name;
  std::vector<int64_t> shape;
  bool muon = false;
};

struct checkpoint_file {
  std::string name;  // rank_00000.safetensors
  int rank = 0;
  uint64_t bytes = 0;
  uint32_t crc32 = 0;  // zlib's CRC-32 of the whole file
};

struct checkpoint_manifest {
  int world = 0;
  uint64_t step = 0;       // steps done (skipped ones included)
  int64_t adam_steps = 0;  // AdamW steps applied (Adam's bias correction)
  loss_scale_snapshot scaler;
  std::vector<checkpoint_param> params;
  nlohmann::json config;  // the job's config as the caller gave it (null when none)
  std::vector<checkpoint_file> files;
};

/// Called after each shard file of a save is on disk, with the count so far (fault injection).
using after_shard_file = std::function<void(int files_written)>;

/// Writes one checkpoint of `states` (one per rank of `pl`) under `dir` (created if missing) and
/// returns the checkpoint's own directory. `meta` gives step, AdamW steps, scaler and config; the
/// world, table and files are filled in here.
expected<std::string> write_checkpoint(const std::string& dir, const plan& pl,
                                       const std::vector<rank_state>& states,
                                       checkpoint_manifest meta,
                                       const after_shard_file& after_file = {});

struct loaded_checkpoint {
  std::string path;  // the checkpoint's directory
  checkpoint_manifest manifest;
  std::vector<rank_state> states;  // one per rank of the target plan; gradients empty
};

/// Reads the checkpoint at `dir` (a checkpoint directory, or a directory with `latest`) and
/// splits it for `target`. Every problem is an error naming the file and what is wrong: no
/// checkpoint, a manifest that is not valid, a missing shard file, a size or CRC-32 that differs
/// from the manifest, a shard file that is not valid safetensors or was written for another
/// rank, world or step, a parameter table that differs from the target's.
expected<loaded_checkpoint> read_checkpoint(const std::string& dir, const plan& target);

/// The manifest as JSON text, and back (strict: unknown or missing keys, wrong types and
/// inconsistent values are errors naming the key). `path` names the file in errors.
std::string manifest_text(const checkpoint_manifest& m);
expected<checkpoint_manifest> parse_manifest(const std::string& text, const std::string& path);

/// zlib's CRC-32 of `bytes`.
uint32_t crc32_of(const std::string& bytes);

}  // namespace zmuon
