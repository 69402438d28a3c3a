// The trainer on the opaque test backend (memory only its copies and kernels reach): a short run
// in float32 and in mixed_bfloat16 gives the CPU backend's losses and weights bit for bit, and its
// checkpoint resumes on the CPU. So the trainer, the optimizer, gradient sync and checkpoints
// touch backend memory only through the backend.
#include <gtest/gtest.h>

#include "backend/opaque_backend.h"
#include "reference_runner.h"
#include "test_util.h"
#include "trained_model.h"

namespace paraflow {
namespace {

struct TrainingRun {
  std::vector<double> losses;
  std::vector<float> weights;
};

TrainingRun train_steps(Backend& backend, graph::PrecisionPolicy precision, const std::filesystem::path& out_dir,
                int64_t steps) {
  model::GptConfig config = testing::small_config();
  train::TokenSource data = testing::repetitive_tokens(config.vocab_size);
  train::TrainConfig train_config = testing::short_training(out_dir, 8);  // the schedule of an 8-step run
  train_config.precision = precision;
  train::Trainer trainer(config, train_config, data, backend);
  trainer.initialize_or_resume();
  TrainingRun run;
  for (int64_t step = 0; step < steps; ++step) run.losses.push_back(trainer.step().loss);  // after a resume too
  run.weights = backend.download<float>(trainer.parameters().flat());
  trainer.save_checkpoint();
  return run;
}

TEST(OpaqueBackendTraining, EqualsTheCpuBackendBitForBitAndResumesOnIt) {
  testing::TempDir dir;
  for (auto precision : {graph::PrecisionPolicy::float32, graph::PrecisionPolicy::mixed_bfloat16}) {
    const std::string name = graph::precision_policy_name(precision);
    SCOPED_TRACE(name);
    TrainingRun cpu = train_steps(cpu_backend(), precision, dir.path() / ("cpu-" + name), 6);
    TrainingRun opaque = train_steps(testing::opaque_backend(), precision, dir.path() / ("opaque-" + name), 6);
    EXPECT_EQ(opaque.losses, cpu.losses);
    EXPECT_EQ(opaque.weights, cpu.weights);
    std::printf("  %-15s 6 steps, loss %.4f -> %.4f on both backends\n", name.c_str(), cpu.losses.front(),
                cpu.losses.back());
  }
  // The opaque run's checkpoint, resumed on the CPU for 2 more steps, continues the CPU's own run.
  TrainingRun cpu_resumed = train_steps(cpu_backend(), graph::PrecisionPolicy::float32, dir.path() / "cpu-float32", 2);
  TrainingRun opaque_resumed =
      train_steps(cpu_backend(), graph::PrecisionPolicy::float32, dir.path() / "opaque-float32", 2);
  EXPECT_EQ(opaque_resumed.weights, cpu_resumed.weights);
}

}  // namespace
}  // namespace paraflow
