// The ranks of a job as a 3-D mesh: tensor-parallel groups innermost (consecutive ranks, so they
// share a node), data-parallel replicas next, pipeline stages outermost, as Megatron-LM lays
// them out:  rank = tensor + t · (data + d · stage).  Rank 0, the chief, is stage 0's first
// replica's first tensor shard.
#pragma once

#include <memory>

#include "dist/communicator.h"

namespace paraflow::dist {

struct MeshShape {
  int tensor = 1, data = 1, pipeline = 1;
  int ranks() const { return tensor * data * pipeline; }
};

struct MeshCoordinates {
  int tensor = 0, data = 0, stage = 0;
};

// The shape for `ranks` processes with `tensor` × `pipeline` ranks per model replica; the rest
// is data parallelism. Refuses, naming the keys, when they do not divide the ranks.
MeshShape mesh_shape(int ranks, int tensor, int pipeline);
MeshCoordinates mesh_coordinates(const MeshShape& shape, int rank);
int mesh_rank(const MeshShape& shape, const MeshCoordinates& coordinates);

// This rank's groups, split from the job's communicator: the ranks that differ from it only in
// their data coordinate (gradient all-reduce), only in their stage (activations and their
// gradients), only in their tensor shard.
struct MeshGroups {
  MeshShape shape;
  MeshCoordinates me;
  std::unique_ptr<Communicator> data, pipeline, tensor;
};
MeshGroups split_mesh(Communicator& world, const MeshShape& shape);

}  // namespace paraflow::dist
