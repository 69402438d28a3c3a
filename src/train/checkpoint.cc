#include "train/checkpoint.h"

#include <fmt/format.h>
#include <unistd.h>

#include <fcntl.h>
#include <stdio.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <optional>
#include <vector>

#include "base/error.h"
#include "base/json.h"
#include "base/file_io.h"
#include "model/model_files.h"
#include "model/safetensors.h"

namespace paraflow::train {

namespace {

constexpr const char* kPrefix = "ckpt-";
// What a checkpoint needs; its manifest must list exactly these.
constexpr std::array<const char*, 4> kCheckpointFiles = {"config.json", "model.safetensors", "optimizer.safetensors",
                                                         "state.json"};

bool is_temporary(const std::string& name) {
  return name.rfind(kPrefix, 0) == 0 && name.find(".tmp") != std::string::npos;
}

// The step of a checkpoint directory's name, ckpt-<digits>; none for any other name.
std::optional<int64_t> checkpoint_step(const std::string& name) {
  if (name.rfind(kPrefix, 0) != 0) return std::nullopt;
  const std::string digits = name.substr(std::string(kPrefix).size());
  if (digits.empty() || digits.size() > 18 || !std::all_of(digits.begin(), digits.end(), ::isdigit)) return std::nullopt;
  return std::stoll(digits);
}

std::vector<std::filesystem::path> checkpoints_newest_first(const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> found;
  if (!std::filesystem::is_directory(dir)) return found;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    std::string name = entry.path().filename().string();
    if (entry.is_directory() && name.rfind(kPrefix, 0) == 0 && !is_temporary(name)) {
      found.push_back(entry.path());
    }
  }
  std::sort(found.rbegin(), found.rend());  // zero-padded step numbers sort as text
  return found;
}

// Puts `from` at `to`: a rename, or where `to` exists, an atomic exchange of the two (the old
// contents then at `from`), so that a crash at any moment leaves a whole checkpoint at `to`.
void put_in_place(const std::filesystem::path& from, const std::filesystem::path& to) {
  if (!std::filesystem::exists(to)) {
    std::filesystem::rename(from, to);
    return;
  }
  if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_EXCHANGE) == 0) return;
  const int error = errno;
  if (error != EINVAL && error != ENOSYS && error != ENOTSUP) {
    throw IoError(fmt::format("{}: cannot replace it with {}: {}", to.string(), from.string(), std::strerror(error)));
  }
  // A filesystem without the exchange (NFS, most FUSE mounts): the old one goes first, as a
  // plain rename cannot replace a directory that has files.
  std::filesystem::remove_all(to);
  std::filesystem::rename(from, to);
}

}  // namespace

std::filesystem::path CheckpointManager::save(int64_t step, const model::GptConfig& config,
                                              const model::ParameterSet& parameters, const Tensor& first_moment,
                                              const Tensor& second_moment, int64_t optimizer_steps,
                                              const nlohmann::json& state) {
  std::filesystem::create_directories(dir_);
  std::filesystem::path final_path = dir_ / fmt::format("{}{:09}", kPrefix, step);
  std::filesystem::path temporary = dir_ / fmt::format("{}{:09}.tmp.{}", kPrefix, step, ::getpid());
  std::filesystem::remove_all(temporary);
  try {
    write_checkpoint(temporary, config, parameters, first_moment, second_moment, optimizer_steps, step, state);
  } catch (...) {
    std::error_code ignored;  // the original error is the one to report
    std::filesystem::remove_all(temporary, ignored);
    throw;
  }
  // A checkpoint of this step already there (saved again at the same step: a stop right after a
  // periodic save, a finished run started again) is swapped out, never deleted first.
  try {
    put_in_place(temporary, final_path);
  } catch (...) {
    std::error_code ignored;
    std::filesystem::remove_all(temporary, ignored);
    throw;
  }
  fsync_directory(dir_);
  std::filesystem::remove_all(temporary);
  prune(step);
  return final_path;
}

void CheckpointManager::write_checkpoint(const std::filesystem::path& temporary, const model::GptConfig& config,
                                         const model::ParameterSet& parameters, const Tensor& first_moment,
                                         const Tensor& second_moment, int64_t optimizer_steps, int64_t step,
                                         const nlohmann::json& state) {
  std::filesystem::create_directories(temporary);
  model::save_model_dir(temporary, config, parameters);
  std::vector<std::pair<std::string, Tensor>> moments;
  for (size_t i = 0; i < parameters.specs().size(); ++i) {
    const model::TensorSpec& spec = parameters.specs()[i];
    const int64_t offset = parameters.offset_of(i), count = spec.shape.numel();
    moments.emplace_back("m." + spec.name, first_moment.slice_flat(offset, count).reshape(spec.shape));
    moments.emplace_back("v." + spec.name, second_moment.slice_flat(offset, count).reshape(spec.shape));
  }
  write_file_atomic(temporary / "optimizer.safetensors", model::serialize_safetensors(moments));
  nlohmann::json full_state = state;
  full_state["step"] = step;
  full_state["optimizer_steps"] = optimizer_steps;
  write_file_atomic(temporary / "state.json", full_state.dump(2) + "\n");

  nlohmann::json manifest = {{"step", step}, {"files", nlohmann::json::object()}};
  for (const char* name : kCheckpointFiles) {
    std::string content = read_file(temporary / name);
    manifest["files"][name] = {{"bytes", content.size()}, {"crc32c", crc32c(content.data(), content.size())}};
  }
  write_file_atomic(temporary / "manifest.json", manifest.dump(2) + "\n");
}

void CheckpointManager::remove_stale_temporaries() const {
  if (!std::filesystem::is_directory(dir_)) return;
  for (const auto& entry : std::filesystem::directory_iterator(dir_)) {
    if (entry.is_directory() && is_temporary(entry.path().filename().string())) {
      fmt::print(stderr, "removing {}, left by an interrupted checkpoint save\n", entry.path().string());
      std::filesystem::remove_all(entry.path());
    }
  }
}

void CheckpointManager::prune(int64_t saved_step) const {
  // Only checkpoints up to the one just saved count, so that a newer one left corrupt (resume
  // fell back past it) or a folder of another name cannot push the new checkpoint out.
  std::vector<std::pair<int64_t, std::filesystem::path>> older;
  for (const std::filesystem::path& path : checkpoints_newest_first(dir_)) {
    const std::optional<int64_t> step = checkpoint_step(path.filename().string());
    if (step && *step <= saved_step) older.emplace_back(*step, path);
  }
  std::sort(older.begin(), older.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (size_t i = static_cast<size_t>(keep_ > 0 ? keep_ : 1); i < older.size(); ++i) {
    std::filesystem::remove_all(older[i].second);
  }
}

void CheckpointManager::verify(const std::filesystem::path& checkpoint) {
  std::filesystem::path manifest_path = checkpoint / "manifest.json";
  check(std::filesystem::exists(manifest_path), "{}: missing (checkpoint incomplete)", manifest_path.string());
  const nlohmann::json manifest = parse_json(read_file(manifest_path), manifest_path.string());
  check(manifest.is_object() && manifest.contains("files") && manifest["files"].is_object(),
        "{}: no \"files\" object", manifest_path.string());
  const nlohmann::json& files = manifest["files"];
  check(files.size() == kCheckpointFiles.size(), "{}: lists {} files, a checkpoint has {}", manifest_path.string(),
        files.size(), kCheckpointFiles.size());
  for (const char* name : kCheckpointFiles) {
    check(files.contains(name), "{}: does not list {}", manifest_path.string(), name);
    const nlohmann::json& expected = files[name];
    check(expected.is_object() && expected.contains("bytes") && expected["bytes"].is_number_unsigned() &&
              expected.contains("crc32c") && expected["crc32c"].is_number_unsigned(),
          "{}: entry {} must hold unsigned \"bytes\" and \"crc32c\"", manifest_path.string(), name);
    std::filesystem::path file = checkpoint / name;
    check(std::filesystem::exists(file), "{}: missing", file.string());
    std::string content = read_file(file);
    const auto bytes = expected["bytes"].get<uint64_t>(), checksum = expected["crc32c"].get<uint64_t>();
    check(content.size() == bytes, "{}: {} bytes, manifest says {}", file.string(), content.size(), bytes);
    check(crc32c(content.data(), content.size()) == checksum, "{}: checksum mismatch (file corrupt)", file.string());
  }
}

std::optional<std::filesystem::path> CheckpointManager::latest_valid() const {
  for (const auto& checkpoint : checkpoints_newest_first(dir_)) {
    try {
      verify(checkpoint);
      return checkpoint;
    } catch (const Error& e) {
      fmt::print(stderr, "warning: skipping corrupt checkpoint {}: {}\n", checkpoint.string(), e.what());
    }
  }
  return std::nullopt;
}

nlohmann::json CheckpointManager::load(const std::filesystem::path& checkpoint, model::ParameterSet& parameters,
                                       const Tensor& first_moment, const Tensor& second_moment) {
  verify(checkpoint);
  model::load_parameters(checkpoint / "model.safetensors", parameters);
  model::SafetensorsFile moments = model::SafetensorsFile::load((checkpoint / "optimizer.safetensors").string());
  for (size_t i = 0; i < parameters.specs().size(); ++i) {
    const model::TensorSpec& spec = parameters.specs()[i];
    const int64_t offset = parameters.offset_of(i), count = spec.shape.numel();
    moments.read_into("m." + spec.name, first_moment.slice_flat(offset, count).reshape(spec.shape));
    moments.read_into("v." + spec.name, second_moment.slice_flat(offset, count).reshape(spec.shape));
  }
  return read_state(checkpoint);
}

nlohmann::json CheckpointManager::read_state(const std::filesystem::path& checkpoint) {
  const std::filesystem::path path = checkpoint / "state.json";
  return parse_json(read_file(path), path.string());
}

}  // namespace paraflow::train
