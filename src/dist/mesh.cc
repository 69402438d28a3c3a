#include "dist/mesh.h"

#include "base/error.h"

namespace paraflow::dist {

MeshShape mesh_shape(int ranks, int tensor, int pipeline) {
  check(tensor >= 1 && pipeline >= 1, "dist.tensor_parallel ({}) and dist.pipeline_parallel ({}) must be at least 1",
        tensor, pipeline);
  check(ranks % (tensor * pipeline) == 0,
        "{} ranks do not divide into model replicas of dist.tensor_parallel ({}) x dist.pipeline_parallel ({}) ranks",
        ranks, tensor, pipeline);
  return {tensor, ranks / (tensor * pipeline), pipeline};
}

MeshCoordinates mesh_coordinates(const MeshShape& shape, int rank) {
  return {rank % shape.tensor, (rank / shape.tensor) % shape.data, rank / (shape.tensor * shape.data)};
}

int mesh_rank(const MeshShape& shape, const MeshCoordinates& c) {
  return c.tensor + shape.tensor * (c.data + shape.data * c.stage);
}

MeshGroups split_mesh(Communicator& world, const MeshShape& shape) {
  check(world.size() == shape.ranks(), "a mesh of {} ranks on a job of {}", shape.ranks(), world.size());
  MeshGroups groups{shape, mesh_coordinates(shape, world.rank()), nullptr, nullptr, nullptr};
  const MeshCoordinates& me = groups.me;
  // A group's color is what its members share; its key orders them along the free coordinate.
  groups.data = world.split(me.tensor + shape.tensor * me.stage, me.data);
  groups.pipeline = world.split(me.tensor + shape.tensor * me.data, me.stage);
  groups.tensor = world.split(me.data + shape.data * me.stage, me.tensor);
  return groups;
}

}  // namespace paraflow::dist
