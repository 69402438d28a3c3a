// A rank's part of the model (its pipeline stage's tensors, as its tensor-parallel shard holds
// them, in one flat buffer) seen as boxes of the whole model's tensors: what it writes to a
// sharded checkpoint and what it reads back, in any layout.
#pragma once

#include <string>
#include <vector>

#include "model/parameters.h"
#include "model/slice_index.h"

namespace paraflow::model {

// One tensor's elements in a range of a part's flat buffer: the tensor's index in the part, the
// box of its local tensor, and the box of the whole tensor those elements are.
struct PartBox {
  size_t tensor;
  TensorSlice local, global;
  bool first_holder;  // of the shards holding these elements (a checkpoint's writer)
};

// The boxes holding elements [begin, end) of `part`'s flat buffer (the whole part: [0, numel);
// a ZeRO shard of the optimizer state: its range). `whole`: the whole model's specs; `shard`:
// the part's tensor-parallel shard.
std::vector<PartBox> part_boxes(const ParameterSet& part, const std::vector<TensorSpec>& whole,
                                const TensorShard& shard, int64_t begin, int64_t end);

// Elements [begin, end) of the part that this shard holds first, held in `window` (host
// memory), as slices of the whole tensors named `prefix` + name (each copied out when written:
// `part` and `window` must outlive the result).
std::vector<SliceValues> part_slice_values(const ParameterSet& part, const std::vector<TensorSpec>& whole,
                                           const TensorShard& shard, const std::string& prefix, const float* window,
                                           int64_t begin, int64_t end);

// Fills `window` (elements [begin, end) of the part, host memory) from the tensors named
// `prefix` + name in `reader`, reading only these boxes.
void read_part(SliceReader& reader, const ParameterSet& part, const std::vector<TensorSpec>& whole,
               const TensorShard& shard, const std::string& prefix, float* window, int64_t begin, int64_t end);

}  // namespace paraflow::model
