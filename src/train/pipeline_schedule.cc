#include "train/pipeline_schedule.h"

#include <algorithm>
#include <numeric>

#include "base/error.h"

namespace paraflow::train {

PipelineSchedule parse_pipeline_schedule(const std::string& name) {
  if (name == "gpipe") return PipelineSchedule::gpipe;
  if (name == "1f1b") return PipelineSchedule::one_f_one_b;
  throw InputError(fmt::format("dist.schedule: {} is not one of gpipe, 1f1b", name));
}

const char* pipeline_schedule_name(PipelineSchedule schedule) {
  return schedule == PipelineSchedule::gpipe ? "gpipe" : "1f1b";
}

namespace {

using Kind = PipelineInstruction::Kind;
using Message = PipelineMessage::Kind;

// The forward and backward passes in the order the stage runs them.
std::vector<PipelineInstruction> compute_order(PipelineSchedule schedule, int stages, int stage, int64_t micro_batches,
                                               bool train) {
  std::vector<PipelineInstruction> order;
  auto forward = [&](int64_t micro) { order.push_back({Kind::forward, micro, {}, {}}); };
  auto backward = [&](int64_t micro) { order.push_back({Kind::backward, micro, {}, {}}); };
  if (!train || schedule == PipelineSchedule::gpipe) {
    for (int64_t micro = 0; micro < micro_batches; ++micro) forward(micro);
    if (train) {
      for (int64_t micro = 0; micro < micro_batches; ++micro) backward(micro);
    }
    return order;
  }
  // 1F1B: the warm-up fills the stages after this one; then each backward frees the slot the
  // next forward takes; the cool-down drains.
  const int64_t warmup = std::min<int64_t>(stages - stage - 1, micro_batches);
  for (int64_t micro = 0; micro < warmup; ++micro) forward(micro);
  for (int64_t micro = 0; micro + warmup < micro_batches; ++micro) {
    forward(micro + warmup);
    backward(micro);
  }
  for (int64_t micro = micro_batches - warmup; micro < micro_batches; ++micro) backward(micro);
  return order;
}

}  // namespace

std::vector<PipelineInstruction> pipeline_instructions(PipelineSchedule schedule, int stages, int stage,
                                                       int64_t micro_batches, bool train) {
  const bool first = stage == 0, last = stage == stages - 1;
  // What a pass needs before it runs, and what it sends after.
  auto needs = [&](const PipelineInstruction& pass) -> std::optional<PipelineMessage> {
    if (pass.kind == Kind::forward && !first) return PipelineMessage{Message::activation, pass.micro, stage - 1};
    if (pass.kind == Kind::backward && !last) return PipelineMessage{Message::gradient, pass.micro, stage + 1};
    return std::nullopt;
  };
  auto produces = [&](const PipelineInstruction& pass) -> std::optional<PipelineMessage> {
    if (pass.kind == Kind::forward && !last) return PipelineMessage{Message::activation, pass.micro, stage + 1};
    if (pass.kind == Kind::backward && !first) return PipelineMessage{Message::gradient, pass.micro, stage - 1};
    return std::nullopt;
  };
  std::vector<PipelineInstruction> instructions;
  std::optional<PipelineMessage> outgoing;  // sent after the previous pass, not yet placed
  for (const PipelineInstruction& pass : compute_order(schedule, stages, stage, micro_batches, train)) {
    std::optional<PipelineMessage> incoming = needs(pass);
    if (outgoing && incoming && outgoing->peer == incoming->peer) {
      instructions.push_back({Kind::transfer, -1, outgoing, incoming});
    } else {
      if (outgoing) instructions.push_back({Kind::transfer, -1, outgoing, std::nullopt});
      if (incoming) instructions.push_back({Kind::transfer, -1, std::nullopt, incoming});
    }
    instructions.push_back(pass);
    outgoing = produces(pass);
  }
  if (outgoing) instructions.push_back({Kind::transfer, -1, outgoing, std::nullopt});
  return instructions;
}

int64_t pipeline_in_flight(PipelineSchedule schedule, int stages, int stage, int64_t micro_batches) {
  if (schedule == PipelineSchedule::gpipe) return micro_batches;
  return std::min<int64_t>(stages - stage, micro_batches);
}

double pipeline_bubble(int stages, int64_t micro_batches) {
  return static_cast<double>(stages - 1) / static_cast<double>(micro_batches + stages - 1);
}

std::vector<model::LayerRange> partition_layers(const model::GptConfig& config, int stages, int64_t sequence,
                                                const std::vector<int64_t>& layers_per_stage) {
  const int64_t n = config.n_layer;
  check(stages >= 1, "dist.pipeline_parallel must be at least 1, not {}", stages);
  std::vector<int64_t> counts = layers_per_stage;
  if (counts.empty() && stages == 1) counts = {n};
  if (counts.empty()) {
    check(n >= stages - 2, "dist.pipeline_parallel: {} stages need at least {} blocks (every stage but the first and "
          "last holds one), but model.n_layer is {}", stages, stages - 2, n);
    const double C = static_cast<double>(config.n_embd);
    const double block = 24.0 * C * C + 4.0 * static_cast<double>(sequence) * C;
    const double head = 2.0 * C * static_cast<double>(config.vocab_size);
    double best = 1e300;
    for (int64_t on_last = 0; on_last <= n; ++on_last) {
      const int64_t rest = n - on_last, others = stages - 1;
      if (rest < others - 1) continue;  // the middle stages need a block each
      // Balanced over the other stages; the remainder goes to the later ones (earlier stages
      // hold more micro-batches under 1F1B), and a stage short of blocks is the first.
      std::vector<int64_t> trial(static_cast<size_t>(stages), rest / others);
      for (int64_t extra = 0; extra < rest % others; ++extra) ++trial[static_cast<size_t>(others - 1 - extra)];
      trial.back() = on_last;
      const double slowest = std::max(static_cast<double>(*std::max_element(trial.begin(), trial.end() - 1)) * block,
                                      static_cast<double>(on_last) * block + head);
      if (slowest < best) {
        best = slowest;
        counts = trial;
      }
    }
  }
  check(static_cast<int>(counts.size()) == stages, "dist.stage_layers lists {} stages but dist.pipeline_parallel is {}",
        counts.size(), stages);
  check(std::accumulate(counts.begin(), counts.end(), int64_t{0}) == n,
        "dist.stage_layers adds up to {} blocks but model.n_layer is {}",
        std::accumulate(counts.begin(), counts.end(), int64_t{0}), n);
  std::vector<model::LayerRange> ranges;
  int64_t begin = 0;
  for (int s = 0; s < stages; ++s) {
    const int64_t count = counts[static_cast<size_t>(s)];
    const bool first = s == 0, last = s == stages - 1;
    check(count >= 0 && (count >= 1 || first || last),
          "dist.stage_layers: stage {} has {} blocks; only the first and the last stage may have none", s, count);
    ranges.push_back({begin, begin + count, first, last});
    begin += count;
  }
  return ranges;
}

std::vector<int64_t> parse_layers_per_stage(const std::string& text, const std::string& key) {
  std::vector<int64_t> counts;
  if (text.empty()) return counts;
  size_t start = 0;
  while (true) {
    const size_t comma = text.find(',', start);
    const std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    size_t used = 0;
    int64_t value = -1;
    try {
      value = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    check(used == item.size() && !item.empty() && value >= 0,
          "{}: '{}' is not a comma-separated list of block counts (item {} is '{}')", key, text, counts.size(), item);
    counts.push_back(value);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return counts;
}

}  // namespace paraflow::train
