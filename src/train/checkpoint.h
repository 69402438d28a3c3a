// Training checkpoints, sharded: every rank writes the slices of the model it holds (weights and
// AdamW's moments, "m.<name>" and "v.<name>") to its own file, with its part of the index of
// global shapes and slice offsets (model/slice_index.h); once every rank's files are durable, the
// chief merges the index, adds config.json, state.json (step, data position, loss scale) and a
// manifest of per-file CRC32C checksums, and renames the directory into place: a crash of any rank
// at any moment leaves the previous checkpoint whole. Any layout reads back only the slices it
// needs. Checkpoints of the single-file format (model.safetensors + optimizer.safetensors) still
// load, read through the same index.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/gpt_config.h"
#include "model/parameters.h"
#include "model/slice_index.h"

namespace paraflow::train {

class CheckpointManager {
 public:
  CheckpointManager(std::filesystem::path dir, int keep) : dir_(std::move(dir)), keep_(keep) {}

  // The chief: a fresh temporary directory for the save of `step`, where every rank then writes.
  std::filesystem::path begin_save(int64_t step) const;
  // Any rank: writes its slices into `temporary` (slices-<rank>.safetensors, fsynced) and their
  // index beside them; a rank without slices writes nothing.
  static void write_rank_slices(const std::filesystem::path& temporary, int rank,
                                const std::vector<model::SliceValues>& slices);
  // The chief, once every rank's write_rank_slices has returned: checks that the slices cover the
  // whole model's weights and moments, writes the index, config.json, state.json (`state` with
  // "step" and "optimizer_steps" added) and the manifest, then puts the checkpoint in place and
  // prunes old ones. Removes `temporary` on failure.
  std::filesystem::path commit(const std::filesystem::path& temporary, int64_t step, const model::GptConfig& config,
                               int64_t optimizer_steps, const nlohmann::json& state);
  // Removes the temporary directory of a save that failed on some rank.
  static void abandon(const std::filesystem::path& temporary);

  // One process holding the whole model (`first_moment`, `second_moment`: AdamW's moments for the
  // whole flat buffer): the three steps above with one rank.
  std::filesystem::path save(int64_t step, const model::GptConfig& config, const model::ParameterSet& parameters,
                             const Tensor& first_moment, const Tensor& second_moment, int64_t optimizer_steps,
                             const nlohmann::json& state);

  // The newest checkpoint whose files match its manifest; corrupt ones are reported on stderr
  // and skipped.
  std::optional<std::filesystem::path> latest_valid() const;

  // The slices of a checkpoint (verify it first): its index, or a single-file checkpoint's two
  // files seen as one slice per tensor (laid out for `config`'s model).
  static model::SliceReader open(const std::filesystem::path& checkpoint, const model::GptConfig& config);

  // Loads the whole model's weights and moments (one process); returns the trainer state (with
  // "optimizer_steps").
  static nlohmann::json load(const std::filesystem::path& checkpoint, const model::GptConfig& config,
                             model::ParameterSet& parameters, const Tensor& first_moment, const Tensor& second_moment);

  // The trainer state of a verified checkpoint (state.json).
  static nlohmann::json read_state(const std::filesystem::path& checkpoint);

  // Throws InputError naming the file when a checkpoint does not match its manifest, or the
  // manifest does not list exactly the files a checkpoint needs.
  static void verify(const std::filesystem::path& checkpoint);

  // Deletes the temporary directories of saves that a crash interrupted. Call it only while
  // holding the run directory's lock: another run's save in progress looks the same.
  void remove_stale_temporaries() const;

 private:
  // Keeps the newest `keep` checkpoints up to `saved_step`.
  void prune(int64_t saved_step) const;

  std::filesystem::path dir_;
  int keep_;
};

}  // namespace paraflow::train
