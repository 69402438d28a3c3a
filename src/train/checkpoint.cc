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
#include "model/part_slices.h"
#include "model/safetensors.h"

namespace paraflow::train {

namespace {

constexpr const char* kPrefix = "ckpt-";
// What a single-file checkpoint (written before sharded ones) needs; its manifest lists exactly these.
constexpr std::array<const char*, 4> kSingleFileCheckpoint = {"config.json", "model.safetensors",
                                                              "optimizer.safetensors", "state.json"};
// A sharded checkpoint: these, and the slice files its index names.
constexpr std::array<const char*, 3> kShardedCheckpoint = {"config.json", "index.json", "state.json"};
constexpr const char* kIndex = "index.json";

std::string slice_file(int rank) { return fmt::format("slices-{:05}.safetensors", rank); }
std::string index_part_file(int rank) { return fmt::format("slices-{:05}.json", rank); }

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

std::filesystem::path CheckpointManager::begin_save(int64_t step) const {
  std::filesystem::create_directories(dir_);
  std::filesystem::path temporary = dir_ / fmt::format("{}{:09}.tmp.{}", kPrefix, step, ::getpid());
  std::filesystem::remove_all(temporary);
  std::filesystem::create_directories(temporary);
  return temporary;
}

void CheckpointManager::write_rank_slices(const std::filesystem::path& temporary, int rank,
                                          const std::vector<model::SliceValues>& slices) {
  if (slices.empty()) return;
  const model::SliceIndex index = model::write_slices(temporary, slice_file(rank), slices);
  write_file_atomic(temporary / index_part_file(rank), index.to_json().dump() + "\n");
}

void CheckpointManager::abandon(const std::filesystem::path& temporary) {
  std::error_code ignored;  // the original error is the one to report
  std::filesystem::remove_all(temporary, ignored);
}

std::filesystem::path CheckpointManager::commit(const std::filesystem::path& temporary, int64_t step,
                                                const model::GptConfig& config, int64_t optimizer_steps,
                                                const nlohmann::json& state) {
  const std::filesystem::path final_path = dir_ / fmt::format("{}{:09}", kPrefix, step);
  try {
    // Every rank's part of the index, merged; together they must hold every element once.
    model::SliceIndex index;
    std::vector<std::filesystem::path> parts;
    for (const auto& entry : std::filesystem::directory_iterator(temporary)) {
      const std::string name = entry.path().filename().string();
      if (name.rfind("slices-", 0) == 0 && entry.path().extension() == ".json") parts.push_back(entry.path());
    }
    std::sort(parts.begin(), parts.end());
    for (const std::filesystem::path& part : parts) {
      index.merge(model::SliceIndex::from_json(parse_json(read_file(part), part.string()), part.string()), part.string());
    }
    for (const model::TensorSpec& spec : model::gpt_tensor_specs(config)) {
      for (const std::string& name : {spec.name, "m." + spec.name, "v." + spec.name}) {
        int64_t held = 0;
        if (index.tensors.count(name)) {
          for (const model::StoredChunk& chunk : index.tensors.at(name).chunks) held += chunk.slice.numel();
        }
        check(held == spec.shape.numel(), "{}: the ranks' slices hold {} of the {} elements of {} (a rank wrote none?)",
              temporary.string(), held, spec.shape.numel(), name);
      }
    }
    write_file_atomic(temporary / kIndex, index.to_json().dump(1) + "\n");
    for (const std::filesystem::path& part : parts) std::filesystem::remove(part);
    write_file_atomic(temporary / "config.json", config.to_hf_json().dump(2) + "\n");
    nlohmann::json full_state = state;
    full_state["step"] = step;
    full_state["optimizer_steps"] = optimizer_steps;
    write_file_atomic(temporary / "state.json", full_state.dump(2) + "\n");
    nlohmann::json manifest = {{"step", step}, {"files", nlohmann::json::object()}};
    std::vector<std::string> files(kShardedCheckpoint.begin(), kShardedCheckpoint.end());
    for (const std::string& file : index.files()) files.push_back(file);
    for (const std::string& file : files) {
      const FileChecksum checksum = checksum_file(temporary / file);
      manifest["files"][file] = {{"bytes", checksum.bytes}, {"crc32c", checksum.crc32c}};
    }
    write_file_atomic(temporary / "manifest.json", manifest.dump(2) + "\n");
    fsync_directory(temporary);
    // A checkpoint of this step already there (saved again at the same step: a stop right after
    // a periodic save, a finished run started again) is swapped out, never deleted first.
    put_in_place(temporary, final_path);
  } catch (...) {
    abandon(temporary);
    throw;
  }
  fsync_directory(dir_);
  std::filesystem::remove_all(temporary);
  prune(step);
  return final_path;
}

std::filesystem::path CheckpointManager::save(int64_t step, const model::GptConfig& config,
                                              const model::ParameterSet& parameters, const Tensor& first_moment,
                                              const Tensor& second_moment, int64_t optimizer_steps,
                                              const nlohmann::json& state) {
  const std::filesystem::path temporary = begin_save(step);
  try {
    const model::ParameterSet host = parameters.on_host();
    const std::vector<model::TensorSpec> whole = model::gpt_tensor_specs(config);
    std::vector<model::SliceValues> slices;
    for (const auto& [prefix, values] : {std::pair<std::string, const float*>{"", host.flat().data<float>()},
                                         {"m.", first_moment.data<float>()},
                                         {"v.", second_moment.data<float>()}}) {
      for (model::SliceValues& slice : model::part_slice_values(host, whole, {}, prefix, values, 0, host.numel())) {
        slices.push_back(std::move(slice));
      }
    }
    write_rank_slices(temporary, 0, slices);
  } catch (...) {
    abandon(temporary);
    throw;
  }
  return commit(temporary, step, config, optimizer_steps, state);
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
  auto verify_file = [&](const std::string& name) {
    check(files.contains(name), "{}: does not list {}", manifest_path.string(), name);
    const nlohmann::json& expected = files[name];
    check(expected.is_object() && expected.contains("bytes") && expected["bytes"].is_number_unsigned() &&
              expected.contains("crc32c") && expected["crc32c"].is_number_unsigned(),
          "{}: entry {} must hold unsigned \"bytes\" and \"crc32c\"", manifest_path.string(), name);
    std::filesystem::path file = checkpoint / name;
    check(std::filesystem::exists(file), "{}: missing", file.string());
    const FileChecksum checksum = checksum_file(file);
    const auto bytes = expected["bytes"].get<uint64_t>(), crc = expected["crc32c"].get<uint64_t>();
    check(checksum.bytes == bytes, "{}: {} bytes, manifest says {}", file.string(), checksum.bytes, bytes);
    check(checksum.crc32c == crc, "{}: checksum mismatch (file corrupt)", file.string());
  };
  std::vector<std::string> needed;
  if (files.contains(kIndex)) {  // sharded: the index (checked first) names the slice files
    needed.assign(kShardedCheckpoint.begin(), kShardedCheckpoint.end());
    verify_file(kIndex);
    const std::filesystem::path index_path = checkpoint / kIndex;
    for (const std::string& file :
         model::SliceIndex::from_json(parse_json(read_file(index_path), index_path.string()), index_path.string()).files()) {
      needed.push_back(file);
    }
  } else {
    needed.assign(kSingleFileCheckpoint.begin(), kSingleFileCheckpoint.end());
  }
  check(files.size() == needed.size(), "{}: lists {} files, this checkpoint has {}", manifest_path.string(),
        files.size(), needed.size());
  for (const std::string& name : needed) verify_file(name);
}

model::SliceReader CheckpointManager::open(const std::filesystem::path& checkpoint, const model::GptConfig& config) {
  const std::filesystem::path index_path = checkpoint / kIndex;
  if (std::filesystem::exists(index_path)) {
    return {checkpoint, model::SliceIndex::from_json(parse_json(read_file(index_path), index_path.string()),
                                                     index_path.string())};
  }
  // The single-file format: the weights as an export lays them out, the moments whole by name.
  const std::vector<model::TensorSpec> specs = model::gpt_tensor_specs(config);
  model::SliceIndex index;
  for (const model::TensorSpec& spec : specs) index.tensors[spec.name].shape = spec.shape;
  for (const model::HfStoredTensor& stored : model::hf_layout(config, specs)) {
    index.tensors[stored.tensor].chunks.push_back({stored.slice, "model.safetensors", stored.stored_name});
  }
  for (const model::TensorSpec& spec : specs) {
    for (const char* moment : {"m.", "v."}) {
      index.tensors[moment + spec.name] = {spec.shape, {{TensorSlice::whole(spec.shape), "optimizer.safetensors", moment + spec.name}}};
    }
  }
  return {checkpoint, std::move(index)};
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

nlohmann::json CheckpointManager::load(const std::filesystem::path& checkpoint, const model::GptConfig& config,
                                       model::ParameterSet& parameters, const Tensor& first_moment,
                                       const Tensor& second_moment) {
  verify(checkpoint);
  model::SliceReader reader = open(checkpoint, config);
  const std::vector<model::TensorSpec> whole = model::gpt_tensor_specs(config);
  const int64_t count = parameters.numel();
  parameters.write_on_host([&](model::ParameterSet& host) {
    model::read_part(reader, host, whole, {}, "", host.flat().data<float>(), 0, count);
  });
  model::read_part(reader, parameters, whole, {}, "m.", first_moment.data<float>(), 0, count);
  model::read_part(reader, parameters, whole, {}, "v.", second_moment.data<float>(), 0, count);
  return read_state(checkpoint);
}

nlohmann::json CheckpointManager::read_state(const std::filesystem::path& checkpoint) {
  const std::filesystem::path path = checkpoint / "state.json";
  return parse_json(read_file(path), path.string());
}

}  // namespace paraflow::train
