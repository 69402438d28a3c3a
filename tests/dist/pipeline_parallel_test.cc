// Pipeline parallelism end to end with the real `paraflow` binary (mpirun and TF_CONFIG tasks
// on loopback, oversubscribed): every layout — 2 and 3 stages, GPipe and 1F1B, stages with the
// embedding or the head alone, 2 replicas x 2 stages with and without ZeRO-1, gradient
// checkpointing inside the stages — trains like one
// process on the same global batch; checkpoints resume across layouts; a killed stage's job
// resumes exactly; bad layouts are refused by name. The Llama family in stages too, with a tied
// and an untied head.
#include <gtest/gtest.h>

#include <cstdio>

#include "base/file_io.h"
#include "dist/training_job.h"

namespace paraflow {
namespace {

class PipelineParallel : public testing::TrainingJob {
 protected:
  void SetUp() override {
    write_config("{vocab_size: 256, n_positions: 16, n_embd: 24, n_layer: 3, n_head: 2}",
                 "{batch_size: 8, sequence_length: 16, steps: 10, lr: 1.0e-3, log_every: 1}");
  }

  static std::string pipeline(int stages, const std::string& extra = "") {
    return fmt::format("--set dist.pipeline_parallel={} {}", stages, extra);
  }
};

TEST_F(PipelineParallel, EveryLayoutTrainsLikeOneProcess) {
  ASSERT_EQ(run(train_command("one_process")), 0);
  const std::vector<std::pair<std::string, std::string>> layouts = {
      {"pp2", mpirun(2) + train_command("pp2", pipeline(2))},
      {"pp2_gpipe", mpirun(2) + train_command("pp2_gpipe", pipeline(2, "--set dist.schedule=gpipe"))},
      {"pp3", mpirun(3) + train_command("pp3", pipeline(3))},
      {"pp3_gpipe", mpirun(3) + train_command("pp3_gpipe", pipeline(3, "--set dist.schedule=gpipe"))},
      {"embedding_alone", tf_config(2) + train_command("embedding_alone", pipeline(2, "--set dist.stage_layers=0,3"))},
      {"head_alone", mpirun(2) + train_command("head_alone", pipeline(2, "--set dist.stage_layers=3,0"))},
      {"dp2_pp2", mpirun(4) + train_command("dp2_pp2", pipeline(2, "--set dist.micro_batches=2"))},
      {"dp2_pp2_zero", mpirun(4) + train_command("dp2_pp2_zero", pipeline(2, "--set dist.micro_batches=2 --set dist.zero=1"))},
      {"pp3_recompute", mpirun(3) + train_command("pp3_recompute", pipeline(3, "--set train.recompute=block"))},
  };
  for (const auto& [name, command] : layouts) {
    ASSERT_EQ(run(command), 0) << command;
    expect_same_training(name, "one_process");
  }
  // The schedules order the same passes differently: the same numbers, bit for bit.
  EXPECT_TRUE(bitwise_equal("pp2", "pp2_gpipe"));
  EXPECT_TRUE(bitwise_equal("pp3", "pp3_gpipe"));
}

TEST_F(PipelineParallel, CheckpointsResumeInAnyLayout) {
  ASSERT_EQ(run(train_command("one_process")), 0);
  const std::string half = "--set train.stop_at_step=5 ";
  // 2 stages, then one process.
  ASSERT_EQ(run(mpirun(2) + train_command("pp2_then_one", half + pipeline(2))), 0);
  ASSERT_EQ(run(train_command("pp2_then_one")), 0);
  expect_same_training("pp2_then_one", "one_process");
  // 2 stages, then 2 data-parallel ranks.
  ASSERT_EQ(run(mpirun(2) + train_command("pp2_then_dp2", half + pipeline(2))), 0);
  ASSERT_EQ(run(mpirun(2) + train_command("pp2_then_dp2")), 0);
  expect_same_training("pp2_then_dp2", "one_process");
  // One process, then 3 stages.
  ASSERT_EQ(run(train_command("one_then_pp3", half)), 0);
  ASSERT_EQ(run(mpirun(3) + train_command("one_then_pp3", pipeline(3))), 0);
  expect_same_training("one_then_pp3", "one_process");
  // 2 replicas x 2 stages with ZeRO-1, then 4 stages.
  ASSERT_EQ(run(mpirun(4) + train_command("dp2pp2_then_pp4", half + pipeline(2, "--set dist.micro_batches=2 --set dist.zero=1"))), 0);
  ASSERT_EQ(run(mpirun(4) + train_command("dp2pp2_then_pp4", pipeline(4, "--set dist.stage_layers=0,1,1,1"))), 0);
  expect_same_training("dp2pp2_then_pp4", "one_process");
}

TEST_F(PipelineParallel, KilledStageResumesExactly) {
  const std::string extra = pipeline(2, "--set train.steps=150 --set train.checkpoint_every=2");
  ASSERT_EQ(run(mpirun(2) + train_command("uninterrupted", extra)), 0);
  const std::string command = mpirun(2) + train_command("crashed", extra);
  crash_newest_rank_after("crashed", command, 4);  // stage 1
  ASSERT_EQ(run(command), 0) << "relaunching the same command resumes";
  EXPECT_TRUE(bitwise_equal("uninterrupted", "crashed"));
}

TEST_F(PipelineParallel, SigtermStopsEveryStageWithACheckpoint) {
  const std::string command =
      tf_config(3) + train_command("preempted", pipeline(3, "--set train.steps=100000 --set train.checkpoint_every=2"));
  preempt_after_first_checkpoint("preempted", command);
}

TEST_F(PipelineParallel, BadLayoutsAreRefusedByName) {
  EXPECT_NE(failure_message(mpirun(3) + train_command("x", pipeline(2))).find("3 ranks do not divide"),
            std::string::npos);
  EXPECT_NE(failure_message(mpirun(2) + train_command("x", pipeline(2, "--set train.grad_accumulation=2")))
                .find("dist.micro_batches instead"),
            std::string::npos);
  EXPECT_NE(failure_message(mpirun(2) + train_command("x", pipeline(2, "--set dist.stage_layers=1,1"))).find(
                "dist.stage_layers adds up to 2 blocks but model.n_layer is 3"),
            std::string::npos);
  EXPECT_NE(failure_message(mpirun(2) + train_command("x", pipeline(2, "--set dist.micro_batches=3"))).find(
                "dist.micro_batches (3)"),
            std::string::npos);
}

// The Llama family in stages (grouped k/v heads): an untied head on the last stage alone, or a
// tied one on the first and the last stage, their gradients summed; equal to one process.
class LlamaPipelineParallel : public testing::TrainingJob, public ::testing::WithParamInterface<bool> {
 protected:
  void SetUp() override {
    write_config(fmt::format("{{architecture: llama, vocab_size: 256, n_positions: 16, n_embd: 24, n_layer: 3, "
                             "n_head: 4, n_kv_head: 2, intermediate_size: 40, tie_word_embeddings: {}}}",
                             GetParam()),
                 "{batch_size: 8, sequence_length: 16, steps: 10, lr: 1.0e-3, log_every: 1}");
  }
};

TEST_P(LlamaPipelineParallel, EveryLayoutTrainsLikeOneProcess) {
  ASSERT_EQ(run(train_command("one_process")), 0);
  const std::vector<std::pair<std::string, std::string>> layouts = {
      {"pp2", mpirun(2) + train_command("pp2", "--set dist.pipeline_parallel=2")},
      {"pp3_recompute", mpirun(3) + train_command("pp3_recompute", "--set dist.pipeline_parallel=3 "
                                                                   "--set train.recompute=block")},
      {"head_alone", mpirun(2) + train_command("head_alone", "--set dist.pipeline_parallel=2 "
                                                             "--set dist.stage_layers=3,0")},
  };
  for (const auto& [name, command] : layouts) {
    ASSERT_EQ(run(command), 0) << command;
    expect_same_training(name, "one_process", 1e-6);
  }
}

INSTANTIATE_TEST_SUITE_P(Heads, LlamaPipelineParallel, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "tied" : "untied"; });

}  // namespace
}  // namespace paraflow
