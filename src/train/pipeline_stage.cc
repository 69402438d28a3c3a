#include "train/pipeline_stage.h"

#include <chrono>

#include "base/error.h"

namespace paraflow::train {

PipelineStage::PipelineStage(const model::GptGraph& graph, PipelineLayout layout, Backend& backend,
                             dist::Communicator& group, graph::CollectiveGroup* tensor_group)
    : graph_(graph), layout_(layout), backend_(backend), group_(group) {
  check(group_.size() == layout_.stages, "pipeline group of {} ranks for {} stages", group_.size(), layout_.stages);
  const int64_t slots = pipeline_in_flight(layout_.schedule, layout_.stages, layout_.stage, layout_.micro_batches);
  const graph::Graph& g = graph_.graph;
  const graph::ValueId tokens_or_targets = first() ? graph_.tokens : graph_.targets;
  for (int64_t s = 0; s < slots; ++s) {
    auto executor = std::make_unique<graph::Executor>(g, backend_);
    executor->set_collective_group(tensor_group);
    // What crosses to the neighbours is read between runs: it gets memory of its own.
    if (!first()) {
      executor->keep(graph_.stage_input);
      executor->keep(g.value(graph_.stage_input).grad);
    }
    if (!last()) {
      executor->keep(graph_.stage_output);
      output_grads_.push_back(backend_.empty(g.value(graph_.stage_output).shape, DType::f32));
      executor->bind(g.value(graph_.stage_output).grad, output_grads_.back());
    }
    slots_.push_back(std::move(executor));
  }
  if (last()) {
    loss_grad_ = backend_.empty(g.value(graph_.losses).shape, DType::f32);
    for (auto& executor : slots_) executor->bind(g.value(graph_.losses).grad, loss_grad_);
  }
  if (tokens_or_targets != graph::kNoValue) {
    const Shape& shape = g.value(tokens_or_targets).shape;
    host_tokens_ = Tensor::zeros(shape, DType::i32);
    host_targets_ = Tensor::zeros(shape, DType::i32);
  }
}

void PipelineStage::bind(const model::ParameterSet& parameters, const model::ParameterSet& gradients,
                         const model::ParameterSet& half_parameters) {
  for (auto& executor : slots_) model::bind_parameters(*executor, graph_, parameters, &gradients, &half_parameters);
}

void PipelineStage::load_batch(size_t slot, BatchSource& data, const BatchPosition& position) {
  data.batch(position.index, position.seed, position.validation, position.slice, position.slices, host_tokens_,
             host_targets_);
  graph::Executor& executor = *slots_[slot];
  if (first()) backend_.upload(host_tokens_.raw(), executor.tensor(graph_.tokens));
  if (last()) backend_.upload(host_targets_.raw(), executor.tensor(graph_.targets));
}

const Tensor& PipelineStage::message_tensor(const PipelineMessage& message, bool outgoing) {
  graph::Executor& executor = *slots_[slot_of(message.micro)];
  const graph::Graph& g = graph_.graph;
  if (message.kind == PipelineMessage::Kind::activation) {
    return executor.tensor(outgoing ? graph_.stage_output : graph_.stage_input);
  }
  return outgoing ? executor.tensor(g.value(graph_.stage_input).grad) : output_grads_[slot_of(message.micro)];
}

void PipelineStage::transfer(const PipelineInstruction& instruction) {
  const Tensor* out = instruction.send ? &message_tensor(*instruction.send, true) : nullptr;
  const Tensor* in = instruction.recv ? &message_tensor(*instruction.recv, false) : nullptr;
  if (out && in) {
    group_.send_recv(out->device_address(), out->nbytes(), instruction.send->peer, in->device_address(), in->nbytes(),
                     instruction.recv->peer);
  } else if (out) {
    group_.send(out->device_address(), out->nbytes(), instruction.send->peer);
  } else {
    group_.recv(in->device_address(), in->nbytes(), instruction.recv->peer);
  }
}

double PipelineStage::run(BatchSource& data, const BatchPosition& first_position, bool train) {
  double losses = 0;
  timing_ = {};
  auto since = [](std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  for (const PipelineInstruction& instruction :
       pipeline_instructions(layout_.schedule, layout_.stages, layout_.stage, layout_.micro_batches, train)) {
    const auto start = std::chrono::steady_clock::now();
    if (instruction.kind == PipelineInstruction::Kind::transfer) {
      transfer(instruction);
      timing_.transfers += since(start);
      continue;
    }
    const size_t slot = slot_of(instruction.micro);
    graph::Executor& executor = *slots_[slot];
    if (instruction.kind == PipelineInstruction::Kind::backward) {
      executor.backward();
      timing_.compute += since(start);
      continue;
    }
    BatchPosition position = first_position;
    position.slice += instruction.micro;
    if (first() || last()) load_batch(slot, data, position);
    executor.forward();
    if (last()) losses += mean_loss(executor, graph_);
    timing_.compute += since(start);
  }
  // The phase ends when every stage is done (the step's all-reduces would wait for the last one
  // anyway): a stage that finishes early idles here, and the timing says so.
  const auto start = std::chrono::steady_clock::now();
  group_.barrier();
  timing_.transfers += since(start);
  return losses;
}

double PipelineStage::train(BatchSource& data, const BatchPosition& first, float loss_weight) {
  if (last()) backend_.upload(std::vector<float>(static_cast<size_t>(loss_grad_.numel()), loss_weight).data(), loss_grad_);
  return run(data, first, true);
}

double PipelineStage::evaluate(BatchSource& data, const BatchPosition& first) { return run(data, first, false); }

}  // namespace paraflow::train
