// Where the variables live in parameter-server mode: the token embedding split by rows across
// every ps task (it is the largest tensor and every step touches all of it), then the other
// tensors, largest first, each on the ps task holding the fewest elements so far (TensorFlow's
// greedy load balancing by size). Every task computes the same placement from the model config.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/parameters.h"

namespace paraflow::ps {

// Elements [offset, offset + count) of the whole model's flat parameter buffer (a tensor, or a
// block of the embedding's rows).
struct Piece {
  std::string tensor;
  int64_t offset = 0;
  int64_t count = 0;
  bool weight_decay = false;
};

// The elements of a shard's pieces together.
int64_t element_count(const std::vector<Piece>& pieces);

struct Placement {
  std::vector<std::vector<Piece>> shards;  // by ps task, each in buffer order

  int64_t shard_elements(size_t task) const;
  // A short fingerprint: tasks that disagree about the model refuse each other's requests.
  std::string digest() const;
  nlohmann::json to_json() const;
  // One line per ps task: its element count and tensors.
  std::string describe() const;
};

// `specs` in gpt_tensor_specs' order (their offsets in the flat buffer follow from it).
Placement place_variables(const std::vector<model::TensorSpec>& specs, int ps_tasks);

}  // namespace paraflow::ps
