// Training checkpoints: an export dir (config.json + model.safetensors) plus optimizer moments,
// trainer state and a manifest of per-file CRC32C checksums. A checkpoint is built under a
// temporary name, every file fsynced, then renamed into place: a crash leaves either the whole
// checkpoint or none. Loading verifies the manifest and falls back to the previous checkpoint.
#pragma once

#include <filesystem>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "model/gpt_config.h"
#include "model/parameters.h"

namespace paraflow::train {

class CheckpointManager {
 public:
  CheckpointManager(std::filesystem::path dir, int keep) : dir_(std::move(dir)), keep_(keep) {}

  // `first_moment`, `second_moment`: AdamW's moments for the whole flat buffer.
  std::filesystem::path save(int64_t step, const model::GptConfig& config, const model::ParameterSet& parameters,
                             const Tensor& first_moment, const Tensor& second_moment, int64_t optimizer_steps,
                             const nlohmann::json& state);

  // The newest checkpoint whose files match its manifest; corrupt ones are reported on stderr
  // and skipped.
  std::optional<std::filesystem::path> latest_valid() const;

  // Loads weights and the whole-buffer moments; returns the trainer state (with
  // "optimizer_steps").
  static nlohmann::json load(const std::filesystem::path& checkpoint, model::ParameterSet& parameters,
                             const Tensor& first_moment, const Tensor& second_moment);

  // The trainer state of a verified checkpoint (state.json).
  static nlohmann::json read_state(const std::filesystem::path& checkpoint);

  // Throws InputError naming the file when a checkpoint does not match its manifest, or the
  // manifest does not list exactly the files a checkpoint needs.
  static void verify(const std::filesystem::path& checkpoint);

  // Deletes the temporary directories of saves that a crash interrupted. Call it only while
  // holding the run directory's lock: another run's save in progress looks the same.
  void remove_stale_temporaries() const;

 private:
  static void write_checkpoint(const std::filesystem::path& temporary, const model::GptConfig& config,
                               const model::ParameterSet& parameters, const Tensor& first_moment,
                               const Tensor& second_moment, int64_t optimizer_steps, int64_t step,
                               const nlohmann::json& state);
  // Keeps the newest `keep` checkpoints up to `saved_step`.
  void prune(int64_t saved_step) const;

  std::filesystem::path dir_;
  int keep_;
};

}  // namespace paraflow::train
