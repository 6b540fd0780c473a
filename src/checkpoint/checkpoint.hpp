// Checkpoints on disk: pure functions of the plan and the ranks' states, no actors.
//
//   DIR/latest                        the name of the newest complete checkpoint ("step_00000005")
//   DIR/step_00000005/rank_00000.safetensors   rank 0's shards (real elements only, no padding):
//                                     param/<name>, momentum/<name> (Muon), exp_avg/<name> and
//                                     exp_avg_sq/<name> (AdamW); row_moments/<name> (NorMuon's,
//                                     of the NS blocks the rank owns: <name>@a:b for rows
//                                     [a, b) of a parameter of several); metadata
//                                     rank, world, step
//   DIR/step_00000005/manifest.json   world, step, AdamW step count, loss-scaler state, the
//                                     parameter table, the job's config, size and CRC-32 per file
//
// Every file is written atomically (temporary file, fsync, rename, fsync of the directory); the
// manifest is written after all shard files and `latest` after the manifest, so a save that dies
// halfway leaves `latest` naming the previous complete checkpoint. The two newest complete
// checkpoints are kept; older ones and incomplete ones are removed after a successful save.
// Loading splits the saved shards by the target plan, so the world size may differ from the one
// that saved; a process reads only the shard files its own ranks need.
#pragma once

#include <cstdint>
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
  shard_layout layout = shard_layout::flat;  // how the files cut the parameters ("shard_layout")
  uint64_t step = 0;                         // steps done (skipped ones included)
  int64_t adam_steps = 0;                    // AdamW steps applied (Adam's bias correction)
  // Per AdamW parameter in table order, the steps that touched it; empty where every one is
  // adam_steps (the manifest then has no "adam_param_steps").
  std::vector<int64_t> adam_param_steps;
  loss_scale_snapshot scaler;
  std::vector<checkpoint_param> params;
  nlohmann::json config;  // the job's config as the caller gave it (null when none)
  std::vector<checkpoint_file> files;
};

// A save in three parts, so that each process of a multi-process job writes its own ranks'
// shard files and the first one alone names the directory and commits (engine_checkpoint.cpp):
//   create_checkpoint_dir  (once)      a fresh directory for the step
//   write_shard_file       (per rank)  its shard file, atomically
//   commit_checkpoint      (once)      the manifest, then `latest`, then the older ones removed

/// Creates `dir` if missing and in it a fresh directory for `step`: step_NNNNNNNN, or
/// step_NNNNNNNN_K with the first K >= 1 not taken (never one `latest` may name). Returns K
/// (0: no suffix); checkpoint_dir_name(step, K) is its name.
expected<int> create_checkpoint_dir(const std::string& dir, uint64_t step);
std::string checkpoint_dir_name(uint64_t step, int suffix);

/// rank_NNNNN.safetensors: rank `rank`'s shard file in a checkpoint directory.
std::string shard_file_name(int rank);

/// Writes rank `rank`'s shard file (its real elements) into the checkpoint directory `out` and
/// returns its entry for the manifest.
expected<checkpoint_file> write_shard_file(const std::string& out, const plan& pl, int rank,
                                           const rank_state& state, uint64_t step);

/// Writes dir/name/manifest.json from `meta` (step, AdamW steps, scaler, config and every
/// rank's file entry, in rank order; world and table are filled in here from `pl`), then points
/// `latest` at it and removes the checkpoints older than the one `latest` named before. A shard
/// file that is not there with the size its entry says (another process's, on a directory not
/// shared with this one) is an error, and nothing is committed.
error commit_checkpoint(const std::string& dir, const std::string& name, const plan& pl,
                        checkpoint_manifest meta);

struct loaded_checkpoint {
  std::string path;  // the checkpoint's directory
  checkpoint_manifest manifest;
  std::vector<rank_state> states;  // by rank of the target plan: the ranks asked for; gradients
                                   // empty, and every other rank's state empty too
};

/// Reads the checkpoint at `dir` (a checkpoint directory, or a directory with `latest`) and
/// splits it for ranks [first, first + count) of `target` (count -1: all of them). Only the shard
/// files holding a part of those ranks' shards are read, one at a time, straight into the ranks'
/// states: a process holds its own ranks' state and one shard file, never the full tensors.
/// Every problem is an error naming the file and what is wrong: no checkpoint, a manifest that
/// is not valid, a missing shard file, a size or CRC-32 that differs from the manifest, a shard
/// file that is not valid safetensors or was written for another rank, world or step, a
/// parameter table that differs from the target's.
expected<loaded_checkpoint> read_checkpoint(const std::string& dir, const plan& target,
                                            int first = 0, int count = -1);

/// The manifest as JSON text, and back (strict: unknown or missing keys, wrong types and
/// inconsistent values are errors naming the key). `path` names the file in errors.
std::string manifest_text(const checkpoint_manifest& m);
expected<checkpoint_manifest> parse_manifest(const std::string& text, const std::string& path);

}  // namespace zmuon
