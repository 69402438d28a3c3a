#include "model/slice_index.h"

#include <set>

#include "base/error.h"
#include "base/file_io.h"

namespace paraflow::model {

namespace {

constexpr const char* kFormat = "paraflow.slices.v1";

// Where box `inner` starts inside box `outer` (both of one tensor).
std::vector<int64_t> offsets_within(const TensorSlice& inner, const TensorSlice& outer) {
  std::vector<int64_t> at(inner.offsets.size());
  for (size_t d = 0; d < at.size(); ++d) at[d] = inner.offsets[d] - outer.offsets[d];
  return at;
}

}  // namespace

nlohmann::json SliceIndex::to_json() const {
  nlohmann::json tensors_json = nlohmann::json::object();
  for (const auto& [name, tensor] : tensors) {
    nlohmann::json chunks = nlohmann::json::array();
    for (const StoredChunk& chunk : tensor.chunks) {
      chunks.push_back({{"slice", chunk.slice.to_spec(tensor.shape)}, {"file", chunk.file}, {"key", chunk.key}});
    }
    tensors_json[name] = {{"shape", tensor.shape.dims()}, {"chunks", chunks}};
  }
  return {{"format", kFormat}, {"tensors", tensors_json}};
}

SliceIndex SliceIndex::from_json(const nlohmann::json& json, const std::string& origin) {
  check(json.is_object() && json.value("format", "") == kFormat, "{}: not a slice index (\"format\" is not \"{}\")",
        origin, kFormat);
  check(json.contains("tensors") && json["tensors"].is_object(), "{}: no \"tensors\" object", origin);
  SliceIndex index;
  for (const auto& [name, entry] : json["tensors"].items()) {
    const std::string where = fmt::format("{}: tensor '{}'", origin, name);
    check(entry.is_object() && entry.contains("shape") && entry["shape"].is_array() && entry.contains("chunks") &&
              entry["chunks"].is_array(),
          "{}: needs a \"shape\" array and a \"chunks\" array", where);
    std::vector<int64_t> dims;
    for (const auto& dim : entry["shape"]) {
      check(dim.is_number_unsigned(), "{}: shape entries must be non-negative integers, got {}", where, dim.dump());
      dims.push_back(dim.get<int64_t>());
    }
    SliceIndex one;
    StoredTensor& tensor = one.tensors[name];
    tensor.shape = Shape(dims);
    for (const auto& chunk : entry["chunks"]) {
      check(chunk.is_object() && chunk.contains("slice") && chunk["slice"].is_string() && chunk.contains("file") &&
                chunk["file"].is_string() && chunk.contains("key") && chunk["key"].is_string(),
            "{}: each chunk needs string fields \"slice\", \"file\" and \"key\"", where);
      const std::string file = chunk["file"].get<std::string>();
      check(!file.empty() && file.find('/') == std::string::npos && file[0] != '.',
            "{}: chunk file '{}' must be a plain file name in the checkpoint", where, file);
      tensor.chunks.push_back(
          {TensorSlice::parse_spec(chunk["slice"].get<std::string>(), tensor.shape, where), file, chunk["key"]});
    }
    index.merge(one, origin);
  }
  return index;
}

void SliceIndex::merge(const SliceIndex& other, const std::string& origin) {
  for (const auto& [name, tensor] : other.tensors) {
    auto [at, added] = tensors.try_emplace(name, StoredTensor{tensor.shape, {}});
    StoredTensor& mine = at->second;
    check(mine.shape == tensor.shape, "{}: tensor '{}' has shape {} here and {} in another rank's slices", origin, name,
          tensor.shape.to_string(), mine.shape.to_string());
    for (const StoredChunk& chunk : tensor.chunks) {
      for (const StoredChunk& held : mine.chunks) {
        check(!held.slice.intersect(chunk.slice), "{}: tensor '{}': slices {} ({}) and {} ({}) overlap", origin, name,
              held.slice.to_spec(mine.shape), held.file, chunk.slice.to_spec(mine.shape), chunk.file);
      }
      mine.chunks.push_back(chunk);
    }
  }
}

std::vector<std::string> SliceIndex::files() const {
  std::set<std::string> names;
  for (const auto& [name, tensor] : tensors) {
    for (const StoredChunk& chunk : tensor.chunks) names.insert(chunk.file);
  }
  return {names.begin(), names.end()};
}

SliceIndex write_slices(const std::filesystem::path& dir, const std::string& file, const std::vector<SliceValues>& slices) {
  SliceIndex index;
  std::vector<SafetensorsHeaderEntry> entries;
  for (const SliceValues& slice : slices) {
    check(slice.slice.fits(slice.global), "write_slices: {} slice {} lies outside {}", slice.name,
          slice.slice.to_spec(slice.global), slice.global.to_string());
    const std::string key = slice.name + "@" + slice.slice.to_spec(slice.global);
    entries.push_back({key, DType::f32, slice.slice.shape()});
    SliceIndex one;
    one.tensors[slice.name] = {slice.global, {{slice.slice, file, key}}};
    index.merge(one, (dir / file).string());
  }
  AtomicFileWriter writer(dir / file);
  writer.append(safetensors_header(entries));
  for (const SliceValues& slice : slices) {
    const std::vector<float> values = slice.values();
    check(static_cast<int64_t>(values.size()) == slice.slice.numel(), "write_slices: {} slice {} gave {} values",
          slice.name, slice.slice.to_spec(slice.global), values.size());
    writer.append(std::string_view(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float)));
  }
  writer.commit();
  return index;
}

const SafetensorsFile& SliceReader::file(const std::string& name) {
  auto found = files_.find(name);
  if (found == files_.end()) found = files_.emplace(name, SafetensorsFile::map((dir_ / name).string())).first;
  return found->second;
}

std::vector<float> SliceReader::read(const std::string& name, const TensorSlice& region) {
  auto found = index_.tensors.find(name);
  check(found != index_.tensors.end(), "{}: the checkpoint has no tensor '{}'", dir_.string(), name);
  const StoredTensor& tensor = found->second;
  check(region.fits(tensor.shape), "{}: tensor '{}' is {}, slice {} lies outside it", dir_.string(), name,
        tensor.shape.to_string(), region.to_spec(tensor.shape));
  std::vector<float> values(static_cast<size_t>(region.numel()));
  int64_t covered = 0;
  for (const StoredChunk& chunk : tensor.chunks) {
    const std::optional<TensorSlice> overlap = chunk.slice.intersect(region);
    if (!overlap) continue;
    const SafetensorsFile& stored = file(chunk.file);
    check(stored.entry(chunk.key).shape == chunk.slice.shape(), "{}: tensor '{}' is {}, its index says slice {}",
          stored.origin(), chunk.key, stored.entry(chunk.key).shape.to_string(), chunk.slice.to_spec(tensor.shape));
    copy_box(stored.f32_data(chunk.key), chunk.slice.shape(), offsets_within(*overlap, chunk.slice), values.data(),
             region.shape(), offsets_within(*overlap, region), overlap->shape());
    stored.release(chunk.key);
    covered += overlap->numel();
  }
  check(covered == region.numel(), "{}: tensor '{}': the stored slices cover {} of the {} elements of {}", dir_.string(),
        name, covered, region.numel(), region.to_spec(tensor.shape));
  return values;
}

}  // namespace paraflow::model
