// tp_copy and tp_reduce: the two ends of a tensor-parallel region (Megatron's "f" and "g").
// tp_copy: the identity forward; backward, the sum over the group of every shard's gradient,
// since each shard used the whole input.
#include "graph/ops/ops.h"

namespace paraflow::graph {

namespace {

// Shared by tp_copy and tp_reduce: one input, one f32 output of its shape.
std::vector<OutputSpec> same_as_input(const char* op, const std::vector<const Value*>& in) {
  check(in.size() == 1, "{}: expected 1 input, got {}", op, in.size());
  check(in[0]->dtype == DType::f32, "{}: reduces f32 values, not {}", op, dtype_name(in[0]->dtype));
  return {{"", in[0]->shape, DType::f32, ValueRole::activation}};
}

CollectiveGroup& group_of(const NodeTensors& t, const char* op) {
  check(t.group != nullptr, "{}: the executor has no tensor-parallel group (Executor::set_collective_group)", op);
  return *t.group;
}

// to = from, or to += from when accumulating.
void assign_or_add(Backend& backend, const Tensor& to, const Tensor& from, bool accumulate) {
  if (accumulate) {
    backend.launch(AddForward{.out = to, .a = to, .b = from});
  } else {
    backend.copy(from, to);
  }
}

class TpCopyOp final : public OpDef {
 public:
  std::vector<OutputSpec> infer(const std::vector<const Value*>& in, const Attributes&) const override {
    return same_as_input("tp_copy", in);
  }
  void forward(Backend& backend, const NodeTensors& t, const Attributes&) const override {
    backend.copy(t.inputs[0], t.outputs[0]);
  }
  void backward(Backend& backend, const NodeTensors& t, const Attributes&) const override {
    // The output's gradient is read by nothing else once this runs: reduce it in place.
    group_of(t, "tp_copy").all_reduce_sum(t.output_grads[0]);
    assign_or_add(backend, t.input_grads[0], t.output_grads[0], t.accumulate[0]);
  }
  std::vector<KernelOp> kernels() const override { return {KernelOp::add_forward}; }
  bool can_assign_input_grad(size_t) const override { return true; }
  bool backward_reads_input(size_t) const override { return false; }
  bool backward_reads_output(size_t) const override { return false; }
};

// tp_reduce: where a tensor-parallel region ends (Megatron's "g"): forward, the sum over the
// group of the shards' partial results; backward, the identity.
class TpReduceOp final : public OpDef {
 public:
  std::vector<OutputSpec> infer(const std::vector<const Value*>& in, const Attributes&) const override {
    return same_as_input("tp_reduce", in);
  }
  void forward(Backend& backend, const NodeTensors& t, const Attributes&) const override {
    backend.copy(t.inputs[0], t.outputs[0]);
    group_of(t, "tp_reduce").all_reduce_sum(t.outputs[0]);
  }
  void backward(Backend& backend, const NodeTensors& t, const Attributes&) const override {
    assign_or_add(backend, t.input_grads[0], t.output_grads[0], t.accumulate[0]);
  }
  std::vector<KernelOp> kernels() const override { return {KernelOp::add_forward}; }
  bool can_assign_input_grad(size_t) const override { return true; }
  bool backward_reads_input(size_t) const override { return false; }
  bool backward_reads_output(size_t) const override { return false; }
};

}  // namespace

const OpDef& tp_copy_op() {
  static TpCopyOp op;
  return op;
}

const OpDef& tp_reduce_op() {
  static TpReduceOp op;
  return op;
}

}  // namespace paraflow::graph
