// Gradient checkpointing and the memory planner: recomputation leaves every parameter bit
// unchanged, block recomputation cuts the planned activation memory of a 12-layer gpt-small (and
// of a Llama that wide) to a third or less, and `paraflow plan`'s prediction of what a step
// allocates is within 10% of the growth of peak RSS over a real run's first two steps, and for
// every ZeRO stage on 2 ranks within 15% of the largest rank's; ZeRO's staging buffers and
// ZeRO-3's gathered layers are counted.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cstring>
#include <regex>

#include "base/file_io.h"
#include "reference_runner.h"
#include "model_configs.h"
#include "test_util.h"
#include "train/memory_report.h"
#include "trained_model.h"

namespace paraflow {
namespace {

std::vector<float> train_parameters(const model::GptConfig& config, const std::string& recompute,
                                    const std::filesystem::path& dir) {
  train::TokenSource data = testing::repetitive_tokens(config.vocab_size);
  train::TrainConfig train_config = testing::short_training(dir, 5);
  train_config.recompute = recompute;
  train::Trainer trainer(config, train_config, data, cpu_backend());
  trainer.initialize_or_resume();
  for (int i = 0; i < 5; ++i) trainer.step();
  const float* flat = trainer.parameters().flat().data<float>();
  return {flat, flat + trainer.parameters().numel()};
}

TEST(Recompute, ParametersAreBitwiseEqualUnderEveryPolicy) {
  for (const model::GptConfig& config : {testing::small_config(), testing::small_llama_config()}) {
    SCOPED_TRACE(config.model_type);
    testing::TempDir dir;
    std::vector<float> reference = train_parameters(config, "none", dir.path() / "none");
    const char* ops = config.is_llama() ? "rmsnorm,matmul,add,rope,swiglu" : "layernorm,matmul,add";
    for (const char* policy : {"block", "attention", ops}) {
      std::vector<float> parameters = train_parameters(config, policy, dir.path() / policy);
      ASSERT_EQ(parameters.size(), reference.size());
      EXPECT_EQ(std::memcmp(parameters.data(), reference.data(), reference.size() * sizeof(float)), 0) << policy;
    }
  }
}

// GPT-2 small's shape, and a Llama of that width (12 layers, 6 q heads, 2 k/v heads, SwiGLU 1024).
TEST(Recompute, BlockRecomputationCutsActivationMemoryToAThird) {
  for (const model::GptConfig& model :
       {testing::gpt_config(8192, 256, 384, 12, 6), testing::llama_config("llama", 8192, 256, 384, 1024, 12, 6, 2, 64)}) {
    SCOPED_TRACE(model.model_type);
    train::TrainConfig config;
    config.batch_size = 8;
    config.sequence_length = 256;
    std::map<std::string, int64_t> arena;
    for (const char* policy : {"none", "block", "attention"}) {
      config.recompute = policy;
      arena[policy] = train::estimate_training_memory(model, config, 1, 2).activations;
      std::printf("  recompute %-9s planned activations %.1f MiB\n", policy, static_cast<double>(arena[policy]) / (1 << 20));
    }
    EXPECT_LE(3 * arena["block"], arena["none"]);
    EXPECT_LT(arena["attention"], arena["none"]);
    EXPECT_GT(arena["attention"], arena["block"]);
  }
}

double mib_after(const std::string& text, const std::string& prefix) {
  std::smatch match;
  EXPECT_TRUE(std::regex_search(text, match, std::regex(prefix + R"(\D*([0-9.]+) MiB)"))) << text;
  return match.empty() ? 0 : std::stod(match[1]);
}

TEST(MemoryPlan, PredictionMatchesPeakRssGrowthOfARealRun) {
  testing::TempDir dir;
  testing::write_letter_corpus(dir.path() / "corpus.txt", 300000, 26, 2);
  write_file_atomic(dir.path() / "config.yaml", fmt::format(R"(model: {{vocab_size: 4096, n_positions: 256, n_embd: 256, n_layer: 4, n_head: 4}}
data: {{train: "{}", format: text}}
train: {{batch_size: 8, sequence_length: 256, steps: 3, out_dir: "{}", log_every: 100}}
)", (dir.path() / "corpus.txt").string(), (dir.path() / "run").string()));
  const std::string paraflow = std::getenv("PARAFLOW_BINARY");
  const std::string plan_log = (dir.path() / "plan.txt").string(), train_log = (dir.path() / "train.txt").string();
  ASSERT_EQ(std::system(fmt::format("{} plan --config {} --threads 2 > {}", paraflow,
                                    (dir.path() / "config.yaml").string(), plan_log).c_str()), 0);
  ASSERT_EQ(std::system(fmt::format("{} train --config {} --threads 2 2> {}", paraflow,
                                    (dir.path() / "config.yaml").string(), train_log).c_str()), 0);
  double predicted = mib_after(read_file(plan_log), "allocated by a training step");
  double measured = mib_after(read_file(train_log), "peak RSS grew");
  std::printf("  predicted %.1f MiB, measured %.1f MiB (%.1f%%)\n", predicted, measured,
              100 * (measured - predicted) / measured);
  EXPECT_NEAR(predicted, measured, 0.10 * measured);
}

// ZeRO's staging (gradient sync reduce-scatters and all-gathers chunk by chunk through one
// bucket: a chunk of every rank's shard and one of this rank's, (3 + 1) chunks of 25 MiB / 4 /
// (3 + 1) floats on 3 replicas, and the engine's copy of a reduce-scatter's input, 3 chunks more)
// is counted in what a step allocates. A checkpoint copies one slice at a time (at most the
// largest tensor, wte's 50257 x 768); ZeRO-3 gathers the rest of the weights first. ZeRO-2 with
// accumulation holds a shard of the summed gradients instead of a whole accumulator, and of the
// gradients only its shard and the buckets in flight. The GPT-2
// 124M shape (124,439,808 parameters) on 3 replicas: shards of 41,479,936.
TEST(MemoryPlan, ZeroStagingBuffersAreCounted) {
  model::GptConfig gpt2 = testing::gpt_config(50257, 1024, 768, 12, 12);
  ASSERT_EQ(gpt2.parameter_count(), 124439808);
  const int64_t parameters = 124439808, shard = 41479936, chunk = (25 << 20) / 4 / 4, staging = 7 * chunk * 4;
  train::TrainConfig config;
  config.batch_size = 6;
  config.sequence_length = 128;
  config.grad_accumulation = 2;
  const train::MemoryReport plain = train::estimate_training_memory(gpt2, config, 3, 2);
  config.sync.zero = 1;
  const train::MemoryReport zero1 = train::estimate_training_memory(gpt2, config, 3, 2);
  EXPECT_EQ(zero1.step_allocations() - plain.step_allocations(), staging);
  const int64_t largest_tensor = int64_t{50257} * 768 * 4;
  EXPECT_EQ(zero1.checkpoint_extra, largest_tensor);
  EXPECT_EQ(plain.checkpoint_extra, largest_tensor);
  // The other replicas write their shard of the moments (elements 41,479,936 on: inside the
  // blocks, whose largest tensors are the MLP's 768 x 3072), or without ZeRO nothing.
  const dist::MeshCoordinates replica_1{.data = 1};
  EXPECT_EQ(train::estimate_training_memory(gpt2, config, 3, 2, replica_1).checkpoint_extra, int64_t{768} * 3072 * 4);
  config.sync.zero = 0;
  EXPECT_EQ(train::estimate_training_memory(gpt2, config, 3, 2, replica_1).checkpoint_extra, 0);
  config.sync.zero = 1;
  EXPECT_EQ(zero1.optimizer_state, 2 * shard * 4);
  EXPECT_EQ(zero1.gradients, 2 * parameters * 4) << "ZeRO-1 accumulates in a whole buffer";
  EXPECT_NE(zero1.to_text().find("gradient sync"), std::string::npos) << zero1.to_text();
  config.sync.zero = 2;
  const train::MemoryReport zero2 = train::estimate_training_memory(gpt2, config, 3, 2);
  // ZeRO-2 keeps no whole accumulator, nor whole gradients: rank 0's shard, and outside it (every
  // block but the start of block 0) the bucket backward writes into and the two being reduced,
  // each 25 MiB or a little more (a bucket ends with the tensor that reaches 25 MiB, c_fc's 9 MiB
  // at most).
  const int64_t bucket = 25 << 20, largest_block_tensor = int64_t{768} * 3072 * 4;
  EXPECT_GT(zero2.gradients, shard * 4 + 2 * bucket) << "the buckets in flight are counted";
  EXPECT_LE(zero2.gradients, shard * 4 + 3 * (bucket + largest_block_tensor));
  EXPECT_EQ(zero2.step_allocations() - plain.step_allocations(), staging + shard * 4 + zero2.gradients);
  EXPECT_EQ(zero2.optimizer_state, 2 * shard * 4);
  EXPECT_NE(zero2.to_text().find("ZeRO-2"), std::string::npos) << zero2.to_text();
  // ZeRO-3: rank 0 holds its shard of the weights (wte, wpe and the start of block 0) and gathers
  // at most two blocks of 7,087,872 parameters at once (the one computing and the next).
  config.sync.zero = 3;
  const train::MemoryReport zero3 = train::estimate_training_memory(gpt2, config, 3, 2);
  EXPECT_EQ(zero3.parameters, shard * 4);
  EXPECT_EQ(zero3.gathered_layers, 2 * int64_t{7087872} * 4);
  EXPECT_EQ(zero3.gradients, zero2.gradients);
  EXPECT_EQ(zero3.step_allocations() - zero2.step_allocations(), zero3.gathered_layers);
  EXPECT_EQ(zero3.checkpoint_extra, largest_tensor);  // its shard's slices, nothing gathered
  // A checkpoint is saved after the update: the buckets outside the shard and the gathered layers
  // have been handed back, so it holds the shard of the gradients and one slice's copy.
  EXPECT_EQ(zero2.run.checkpoint, zero2.total() - (zero2.gradients - shard * 4) + largest_tensor);
  EXPECT_EQ(zero3.run.checkpoint,
            zero3.total() - (zero3.gradients - shard * 4) - 2 * int64_t{7087872} * 4 + largest_tensor);
}

// Every data-parallel ZeRO stage on 2 ranks: `plan`'s step allocations within 15% of the largest
// rank's measured growth of peak RSS over the first two steps (what `train` prints).
TEST(MemoryPlan, ZeroPredictionsMatchTheLargestRanksPeakRssGrowth) {
  testing::TempDir dir;
  testing::write_letter_corpus(dir.path() / "corpus.txt", 300000, 26, 2);
  write_file_atomic(dir.path() / "config.yaml", fmt::format(R"(model: {{vocab_size: 4096, n_positions: 128, n_embd: 256, n_layer: 4, n_head: 4}}
data: {{train: "{}", format: text}}
train: {{batch_size: 8, sequence_length: 128, steps: 3, log_every: 100, grad_accumulation: 2}}
)", (dir.path() / "corpus.txt").string()));
  const std::string paraflow = std::getenv("PARAFLOW_BINARY");
  for (int zero : {1, 2, 3}) {
    const std::string settings = fmt::format("--config {} --threads 1 --set dist.zero={} --set train.out_dir={}",
                                             (dir.path() / "config.yaml").string(), zero,
                                             (dir.path() / fmt::format("run{}", zero)).string());
    const std::string plan_log = (dir.path() / "plan.txt").string(), train_log = (dir.path() / "train.txt").string();
    ASSERT_EQ(std::system(fmt::format("{} plan --ranks 2 {} > {}", paraflow, settings, plan_log).c_str()), 0);
    ASSERT_EQ(std::system(fmt::format("mpirun --allow-run-as-root --oversubscribe -np 2 -x OMP_NUM_THREADS=1 {} train {} 2> {}",
                                      paraflow, settings, train_log).c_str()), 0);
    const double predicted = mib_after(read_file(plan_log), "allocated by a training step");
    const double measured = mib_after(read_file(train_log), "peak RSS grew");
    std::printf("  ZeRO-%d: predicted %.1f MiB, measured %.1f MiB (%.1f%%)\n", zero, predicted, measured,
                100 * (measured - predicted) / measured);
    EXPECT_NEAR(predicted, measured, 0.15 * measured) << "dist.zero " << zero;
  }
}

}  // namespace
}  // namespace paraflow
