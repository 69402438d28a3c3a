#include "train/evaluator.h"

#include <fmt/format.h>

#include <cmath>
#include <thread>

#include "base/file_io.h"
#include "data/events.h"
#include "model/model_files.h"
#include "model/part_slices.h"
#include "train/checkpoint.h"

namespace paraflow::train {

namespace {

// The sequences of one evaluation slice: a training micro-batch (checked before a graph is built).
int64_t slice_sequences(const TrainConfig& train) {
  const int64_t slices = train.micro_batches_per_step();
  check(train.batch_size % slices == 0, "train.batch_size ({}) must split into {} micro-batches", train.batch_size,
        slices);
  return train.batch_size / slices;
}

}  // namespace

Evaluator::Evaluator(const model::GptConfig& config, BatchSource& data, Backend& backend, const TrainConfig& train)
    : config_(config),
      data_(data),
      backend_(backend),
      batches_(train.eval_batches),
      slices_(train.micro_batches_per_step()),
      seed_(train.seed),
      graph_(model::build_gpt_training_graph(config, slice_sequences(train), train.sequence_length)),
      parameters_(model::gpt_tensor_specs(config), backend) {
  executor_ = std::make_unique<graph::Executor>(graph_.graph, backend);
  model::bind_parameters(*executor_, graph_, parameters_, nullptr);
}

EvalResult Evaluator::evaluate(const model::ParameterSet& parameters) {
  backend_.copy(parameters.flat(), parameters_.flat());
  double total = 0;
  for (int64_t index = 0; index < batches_; ++index) {
    for (int64_t slice = 0; slice < slices_; ++slice) {
      total += forward_batch(*executor_, graph_, data_, {index, seed_, true, slice, slices_});
    }
  }
  EvalResult result;
  result.loss = total / static_cast<double>(batches_ * slices_);
  result.perplexity = std::exp(result.loss);
  return result;
}

EvalResult Evaluator::evaluate_dir(const std::filesystem::path& model_dir) {
  // A training checkpoint carries checksums: a corrupt one is refused, not evaluated. (An export
  // dir has none; its safetensors header is still checked on load.)
  const bool is_checkpoint =
      std::filesystem::exists(model_dir / "manifest.json") || std::filesystem::exists(model_dir / "optimizer.safetensors");
  if (is_checkpoint) {
    CheckpointManager::verify(model_dir);
    model::SliceReader reader = CheckpointManager::open(model_dir, config_);
    const std::vector<model::TensorSpec> whole = model::gpt_tensor_specs(config_);
    parameters_.write_on_host([&](model::ParameterSet& host) {
      model::read_part(reader, host, whole, {}, "", host.flat().data<float>(), 0, host.numel());
    });
  } else {
    model::load_parameters(model_dir / "model.safetensors", parameters_);
  }
  return evaluate(parameters_);
}

void Evaluator::watch(const std::filesystem::path& run_dir, int64_t final_step, const std::atomic<bool>* stop,
                      double poll_seconds) {
  const std::filesystem::path eval_dir = run_dir / "eval";
  const std::filesystem::path state_file = eval_dir / "evaluated.json";
  std::filesystem::create_directories(eval_dir);
  int64_t last_step = -1;
  if (std::filesystem::exists(state_file)) {
    last_step = nlohmann::json::parse(read_file(state_file)).at("step").get<int64_t>();
    fmt::print(stderr, "evaluator: resuming after step {}\n", last_step);
  }
  data::EventWriter events(eval_dir, {std::chrono::milliseconds(1000), ".eval"});
  CheckpointManager checkpoints(run_dir, 1);
  int64_t failed_step = -1;  // the step whose checkpoint failed once and was still there
  while (!(stop && stop->load()) && last_step < final_step) {
    auto latest = checkpoints.latest_valid();
    int64_t step = -1;
    if (latest) {
      // Read the step before loading: the chief may prune this checkpoint while we work.
      try {
        step = nlohmann::json::parse(read_file(*latest / "state.json")).at("step").get<int64_t>();
      } catch (const std::exception&) {
        step = -1;
      }
    }
    if (step > last_step) {
      try {
        EvalResult result = evaluate_dir(*latest);
        events.add_scalar("loss", result.loss, step);
        events.add_scalar("perplexity", result.perplexity, step);
        events.flush();
        last_step = step;
        write_file_atomic(state_file, nlohmann::json{{"step", step}, {"loss", result.loss}}.dump() + "\n");
        fmt::print(stderr, "evaluator: step {} | val loss {:.4f} | perplexity {:.2f}\n", step, result.loss,
                   result.perplexity);
      } catch (const Error& e) {
        // The chief may have pruned it while it was read: then a newer one is there. A failure
        // twice on a checkpoint that stays is the evaluator's own (its data or config): it stops.
        if (!std::filesystem::exists(*latest)) {
          fmt::print(stderr, "evaluator: {} was removed while it was read; taking the next\n", latest->string());
          continue;
        }
        if (failed_step == step) throw;
        failed_step = step;
        fmt::print(stderr, "evaluator: {} could not be evaluated ({}); trying again\n", latest->string(), e.what());
      }
    }
    std::this_thread::sleep_for(std::chrono::duration<double>(poll_seconds));
  }
}

}  // namespace paraflow::train
