// Tensor parallelism end to end with the real `paraflow` binary (mpirun and TF_CONFIG tasks on
// loopback, oversubscribed): 2 and 4 shards (with gradient checkpointing too), 2 replicas x 2
// shards with and without ZeRO-1 (and ZeRO-2), and 2 shards x 2 stages train like one process on the same
// global batch; mixed_bfloat16 layouts stay as close to float32 as one process in bf16;
// checkpoints resume across layouts; shard counts that do not divide the heads or the vocabulary
// are refused by name. The vocabulary is split too: no rank holds all the logits. The Llama family
// too: multi-head, grouped-query and multi-query attention, k/v heads replicated where fewer than
// the shards, an untied head.
#include <gtest/gtest.h>

#include "dist/training_job.h"

namespace paraflow {
namespace {

class TensorParallel : public testing::TrainingJob {
 protected:
  void SetUp() override {
    write_config("{vocab_size: 256, n_positions: 16, n_embd: 32, n_layer: 2, n_head: 4}",
                 "{batch_size: 8, sequence_length: 16, steps: 10, lr: 1.0e-3, log_every: 1}");
  }

  static std::string shards(int count, const std::string& extra = "") {
    return fmt::format("--set dist.tensor_parallel={} {}", count, extra);
  }
};

TEST_F(TensorParallel, EveryLayoutTrainsLikeOneProcess) {
  ASSERT_EQ(run(train_command("one_process")), 0);
  const std::vector<std::pair<std::string, std::string>> layouts = {
      {"tp2", mpirun(2) + train_command("tp2", shards(2))},
      {"tp4", mpirun(4) + train_command("tp4", shards(4))},
      {"tp2_gloo", tf_config(2) + train_command("tp2_gloo", shards(2))},
      {"tp2_recompute", mpirun(2) + train_command("tp2_recompute", shards(2, "--set train.recompute=block"))},
      {"dp2_tp2", mpirun(4) + train_command("dp2_tp2", shards(2))},
      {"dp2_tp2_zero", mpirun(4) + train_command("dp2_tp2_zero", shards(2, "--set dist.zero=1"))},
      {"tp2_pp2", mpirun(4) + train_command("tp2_pp2", shards(2, "--set dist.pipeline_parallel=2"))},
      {"tp2_pp2_gpipe", mpirun(4) + train_command("tp2_pp2_gpipe", shards(2, "--set dist.pipeline_parallel=2 "
                                                                             "--set dist.schedule=gpipe"))},
  };
  for (const auto& [name, command] : layouts) {
    ASSERT_EQ(run(command), 0) << command;
    expect_same_training(name, "one_process");
  }
  EXPECT_TRUE(bitwise_equal("tp2_pp2", "tp2_pp2_gpipe"));
}

TEST_F(TensorParallel, MixedBfloat16LayoutsTrainLikeOneProcess) {
  // 16-bit activations cross the stages' transfers as f32 (a stage stores what it receives in 16
  // bits again, like any activation): 2 stages of 4 micro-batches equal one process accumulating
  // 4 micro-batches within float rounding. (Not one pass over the whole batch: the key bias's
  // gradient is zero in exact arithmetic, so its value is rounding noise, which AdamW scales up
  // to a full-size update; in 16 bits that noise exceeds AdamW's epsilon, and summing the
  // micro-batches apart changes it. Measured on an AVX2 CPU, where the GEMMs run on f32 copies.)
  const std::string bf16 = "--set train.precision=mixed_bfloat16 ";
  ASSERT_EQ(run(train_command("one_process_f32")), 0);
  ASSERT_EQ(run(train_command("one_process", bf16)), 0);
  ASSERT_EQ(run(train_command("one_process_4_micro_batches", bf16 + "--set train.grad_accumulation=4")), 0);
  ASSERT_EQ(run(mpirun(2) + train_command("pp2", bf16 + "--set dist.pipeline_parallel=2")), 0);
  expect_same_training("pp2", "one_process_4_micro_batches");
  // Shards round their partial input gradients to bf16 before summing them, where one process
  // rounds the whole sum once: more bf16 roundings of the same kind as mixed precision's own. So
  // against float32, a sharded bf16 run must stay within twice one process's bf16 error.
  const double bf16_error = testing::relative_error(weights("one_process"), weights("one_process_f32"));
  for (const auto& [name, layout] : std::vector<std::pair<std::string, std::string>>{
           {"tp2", mpirun(2) + train_command("tp2", bf16 + shards(2))},
           {"tp2_pp2", mpirun(4) + train_command("tp2_pp2", bf16 + shards(2, "--set dist.pipeline_parallel=2"))}}) {
    ASSERT_EQ(run(layout), 0) << layout;
    const double error = testing::relative_error(weights(name), weights("one_process_f32"));
    std::printf("  %-16s weights rel err vs float32 %.2e (one process in bf16: %.2e)\n", name.c_str(), error,
                bf16_error);
    EXPECT_LE(error, 2 * bf16_error) << name;
  }
}

TEST_F(TensorParallel, CheckpointsResumeInAnyLayout) {
  ASSERT_EQ(run(train_command("one_process")), 0);
  const std::string half = "--set train.stop_at_step=5 ";
  // 2 shards x 2 stages, then one process.
  ASSERT_EQ(run(mpirun(4) + train_command("tp2pp2_then_one", half + shards(2, "--set dist.pipeline_parallel=2"))), 0);
  ASSERT_EQ(run(train_command("tp2pp2_then_one")), 0);
  expect_same_training("tp2pp2_then_one", "one_process");
  // One process, then 4 shards.
  ASSERT_EQ(run(train_command("one_then_tp4", half)), 0);
  ASSERT_EQ(run(mpirun(4) + train_command("one_then_tp4", shards(4))), 0);
  expect_same_training("one_then_tp4", "one_process");
}

// ZeRO-2 over the replicas of a sharded model: 2 replicas x 2 shards, each replica accumulating 2
// micro-batches in its ZeRO shard of its tensor shard, train like one process.
TEST_F(TensorParallel, ZeroTwoOverShardedReplicasTrainsLikeOneProcess) {
  ASSERT_EQ(run(train_command("one_process")), 0);
  ASSERT_EQ(run(mpirun(4) + train_command("dp2_tp2_zero2", shards(2, "--set dist.zero=2 --set train.grad_accumulation=2"))), 0);
  expect_same_training("dp2_tp2_zero2", "one_process");
}

TEST_F(TensorParallel, ShardCountsThatDoNotDivideAreRefusedByName) {
  EXPECT_NE(failure_message(mpirun(3) + train_command("x", shards(3))).find(
                "dist.tensor_parallel (3) must divide model.n_head (4)"),
            std::string::npos);
  EXPECT_NE(failure_message(mpirun(3) + train_command("x", shards(2))).find("3 ranks do not divide"),
            std::string::npos);
  EXPECT_NE(failure_message(mpirun(4) + train_command("x", shards(4, "--set model.vocab_size=258"))).find(
                "model.vocab_size (258) is not a multiple of dist.tensor_parallel (4)"),
            std::string::npos);
}

// The Llama family, Megatron's way: q/k/v split by heads (k/v heads replicated where fewer than
// the shards: each shard holds those its q heads read, their gradients summed over the shards
// sharing them), gate/up by columns, o/down by rows, the untied head by vocabulary rows. Every
// layout trains like one process within 1e-6, gradient norms included (with clipping on, a
// replicated head counted twice would show), for 4, 2 and 1 k/v heads of 4 q heads; in
// mixed_bfloat16 as close to float32 as one process.
class LlamaTensorParallel : public testing::TrainingJob, public ::testing::WithParamInterface<int> {
 protected:
  void SetUp() override {
    write_config(fmt::format("{{architecture: llama, vocab_size: 256, n_positions: 16, n_embd: 32, n_layer: 2, "
                             "n_head: 4, n_kv_head: {}, head_dim: 6, intermediate_size: 40, rope_theta: 500000, "
                             "tie_word_embeddings: false}}",
                             GetParam()),
                 "{batch_size: 8, sequence_length: 16, steps: 10, lr: 1.0e-3, log_every: 1, grad_clip: 0.5}");
  }
};

TEST_P(LlamaTensorParallel, EveryLayoutTrainsLikeOneProcess) {
  ASSERT_EQ(run(train_command("one_process")), 0);
  const std::string shards2 = "--set dist.tensor_parallel=2 ", shards4 = "--set dist.tensor_parallel=4 ";
  const std::vector<std::pair<std::string, std::string>> layouts = {
      {"tp2", mpirun(2) + train_command("tp2", shards2)},
      {"tp4", mpirun(4) + train_command("tp4", shards4)},
      {"tp2_recompute", mpirun(2) + train_command("tp2_recompute", shards2 + "--set train.recompute=block")},
      {"tp2_pp2", mpirun(4) + train_command("tp2_pp2", shards2 + "--set dist.pipeline_parallel=2")},
  };
  for (const auto& [name, command] : layouts) {
    ASSERT_EQ(run(command), 0) << command;
    expect_same_training(name, "one_process", 1e-6);
  }
}

// In mixed_bfloat16 (16-bit RMSNorm, rotations and gates on every shard) 4 shards stay as close to
// float32 as one process does, within the factor 2 that GPT-2's layouts get (the shards round
// their partial input gradients before summing them).
TEST_P(LlamaTensorParallel, MixedBfloat16ShardsStayAsCloseToFloat32AsOneProcess) {
  const std::string bf16 = "--set train.precision=mixed_bfloat16 ";
  ASSERT_EQ(run(train_command("one_process_f32")), 0);
  ASSERT_EQ(run(train_command("one_process", bf16)), 0);
  ASSERT_EQ(run(mpirun(4) + train_command("tp4", bf16 + "--set dist.tensor_parallel=4")), 0);
  const double bf16_error = testing::relative_error(weights("one_process"), weights("one_process_f32"));
  const double error = testing::relative_error(weights("tp4"), weights("one_process_f32"));
  std::printf("  tp4 bf16 weights rel err vs float32 %.2e (one process in bf16: %.2e)\n", error, bf16_error);
  EXPECT_GT(bf16_error, 0.0) << "bf16 must round";
  EXPECT_LE(error, 2 * bf16_error);
}

INSTANTIATE_TEST_SUITE_P(KeyValueHeads, LlamaTensorParallel, ::testing::Values(4, 2, 1),
                         [](const auto& info) { return info.param == 4 ? "mha" : info.param == 2 ? "gqa" : "mqa"; });

TEST_F(TensorParallel, LlamaKeyValueHeadsThatNeitherDivideNorShareAreRefusedByName) {
  write_config("{architecture: llama, vocab_size: 256, n_positions: 16, n_embd: 24, n_layer: 1, n_head: 6, "
               "n_kv_head: 3, intermediate_size: 32}",
               "{batch_size: 8, sequence_length: 16, steps: 2}");
  EXPECT_NE(failure_message(mpirun(2) + train_command("x", shards(2))).find(
                "dist.tensor_parallel (2) and model.n_kv_head (3): one must divide the other"),
            std::string::npos);
}

}  // namespace
}  // namespace paraflow
