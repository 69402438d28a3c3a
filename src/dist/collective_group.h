// A communicator as the graph's tensor-parallel group (graph/collective_group.h).
#pragma once

#include <memory>

#include "dist/communicator.h"
#include "graph/collective_group.h"

namespace paraflow::dist {

std::unique_ptr<graph::CollectiveGroup> as_collective_group(Communicator& communicator);

}  // namespace paraflow::dist
