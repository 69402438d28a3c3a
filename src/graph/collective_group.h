// The collectives an op may call: tensor parallelism's all-reduces over the ranks that hold the
// shards of one layer. An executor hands the group it was given to every node it runs; the
// trainer supplies one over a communicator (MPI, Gloo, NCCL), so graph code stays free of them.
#pragma once

#include "tensor/tensor.h"

namespace paraflow::graph {

class CollectiveGroup {
 public:
  virtual ~CollectiveGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // In place over the group: every member ends with the element-wise sum (max) of all members'.
  virtual void all_reduce_sum(const Tensor& tensor) = 0;
  virtual void all_reduce_max(const Tensor& tensor) = 0;
  // Bytes handed to the all-reduces so far, and the seconds they took (for measurements).
  virtual int64_t bytes_reduced() const = 0;
  virtual double seconds_reducing() const = 0;
};

}  // namespace paraflow::graph
