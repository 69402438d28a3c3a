// Pipeline parallelism's plan, as data: how the model's layers are cut into stages, and the order
// in which each stage runs its micro-batches' forward and backward passes and the transfers
// between them (GPipe: all forwards, then all backwards; 1F1B: after a warm-up, one forward per
// backward, so a stage holds at most as many micro-batches as there are stages after it, itself
// included). Pure functions: the trainer runs them, the tests simulate them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/gpt_config.h"
#include "model/parameters.h"

namespace paraflow::train {

enum class PipelineSchedule : uint8_t { gpipe, one_f_one_b };
PipelineSchedule parse_pipeline_schedule(const std::string& name);  // "gpipe" | "1f1b"
const char* pipeline_schedule_name(PipelineSchedule schedule);

struct PipelineMessage {
  enum class Kind : uint8_t { activation, gradient } kind;
  int64_t micro;
  int peer;  // the other stage
  bool operator==(const PipelineMessage&) const = default;
};

struct PipelineInstruction {
  enum class Kind : uint8_t { forward, backward, transfer } kind;
  int64_t micro = -1;  // forward and backward
  // A transfer sends, receives, or both at once (Communicator::send_recv): a stage that sends
  // to its neighbour what the neighbour waits for while waiting for what the neighbour sends
  // must do both together, or two blocking sends of large messages would wait for each other.
  std::optional<PipelineMessage> send, recv;
};

// Stage `stage` of `stages`, `micro_batches` micro-batches; `train` false: forwards only.
std::vector<PipelineInstruction> pipeline_instructions(PipelineSchedule schedule, int stages, int stage,
                                                       int64_t micro_batches, bool train = true);

// The most micro-batches whose activations the stage holds at once: m under GPipe,
// min(stages - stage, m) under 1F1B.
int64_t pipeline_in_flight(PipelineSchedule schedule, int stages, int stage, int64_t micro_batches);

// The fraction of a step every stage idles under either schedule, (p - 1) / (m + p - 1), when
// each stage's forward and backward take the same time.
double pipeline_bubble(int stages, int64_t micro_batches);

// The stages' layer ranges. `layers_per_stage` empty: balanced by forward FLOPs per token (a
// block's GEMMs and attention at `sequence`; the head's GEMM on the last stage), else the
// number of blocks of each stage (the first and last may have none: the embedding alone, the
// head alone). Every stage but the first and last holds at least one block.
std::vector<model::LayerRange> partition_layers(const model::GptConfig& config, int stages, int64_t sequence,
                                                const std::vector<int64_t>& layers_per_stage = {});
// "2,3,1" -> {2, 3, 1}; errors name `key`.
std::vector<int64_t> parse_layers_per_stage(const std::string& text, const std::string& key);

}  // namespace paraflow::train
