#include "ps/placement.h"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "base/error.h"

namespace paraflow::ps {

int64_t element_count(const std::vector<Piece>& pieces) {
  int64_t total = 0;
  for (const Piece& piece : pieces) total += piece.count;
  return total;
}

int64_t Placement::shard_elements(size_t task) const { return element_count(shards.at(task)); }

nlohmann::json Placement::to_json() const {
  nlohmann::json tasks = nlohmann::json::array();
  for (const std::vector<Piece>& shard : shards) {
    nlohmann::json pieces = nlohmann::json::array();
    for (const Piece& piece : shard) pieces.push_back({piece.tensor, piece.offset, piece.count});
    tasks.push_back(pieces);
  }
  return tasks;
}

std::string Placement::digest() const {
  // FNV-1a over the JSON text.
  uint64_t hash = 1469598103934665603ull;
  for (char c : to_json().dump()) hash = (hash ^ static_cast<uint8_t>(c)) * 1099511628211ull;
  return fmt::format("{:016x}", hash);
}

std::string Placement::describe() const {
  std::string text;
  for (size_t task = 0; task < shards.size(); ++task) {
    std::vector<std::string> names;
    for (const Piece& piece : shards[task]) names.push_back(piece.tensor);
    text += fmt::format("  ps {}: {:.2f}M parameters: {}\n", task, static_cast<double>(shard_elements(task)) / 1e6,
                        fmt::join(names, " "));
  }
  return text;
}

Placement place_variables(const std::vector<model::TensorSpec>& specs, int ps_tasks) {
  check(ps_tasks >= 1, "parameter-server placement needs at least one ps task");
  Placement placement;
  placement.shards.resize(static_cast<size_t>(ps_tasks));
  std::vector<int64_t> load(static_cast<size_t>(ps_tasks), 0);
  std::vector<Piece> others;
  int64_t offset = 0;
  for (const model::TensorSpec& spec : specs) {
    const int64_t count = spec.shape.numel();
    if (model::splits_vocabulary(spec)) {
      // Row blocks as even as the vocabulary allows: task t gets rows [t·V/n, (t+1)·V/n).
      const int64_t rows = spec.shape[0], width = spec.shape[1];
      for (int task = 0; task < ps_tasks; ++task) {
        const int64_t begin = rows * task / ps_tasks, end = rows * (task + 1) / ps_tasks;
        if (end == begin) continue;
        Piece piece{fmt::format("{}[{}:{}]", spec.name, begin, end), offset + begin * width, (end - begin) * width,
                    spec.weight_decay};
        load[static_cast<size_t>(task)] += piece.count;
        placement.shards[static_cast<size_t>(task)].push_back(piece);
      }
    } else {
      others.push_back({spec.name, offset, count, spec.weight_decay});
    }
    offset += count;
  }
  std::stable_sort(others.begin(), others.end(), [](const Piece& a, const Piece& b) { return a.count > b.count; });
  for (const Piece& piece : others) {
    const size_t task = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    load[task] += piece.count;
    placement.shards[task].push_back(piece);
  }
  for (std::vector<Piece>& shard : placement.shards) {
    std::sort(shard.begin(), shard.end(), [](const Piece& a, const Piece& b) { return a.offset < b.offset; });
  }
  return placement;
}

}  // namespace paraflow::ps
