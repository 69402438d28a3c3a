// Data parallelism end to end with the real `paraflow` binary, launched by mpirun and as
// TF_CONFIG tasks on loopback: N ranks reproduce one rank's gradient accumulation (bitwise for
// N = 2), ZeRO-1, ZeRO-2 and ZeRO-3 keep the results, a killed worker's job resumes exactly from the
// chief's checkpoint, a checkpoint from 2 ranks resumes on 1 or 3, and an unreachable peer fails
// within the timeout, named.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <regex>
#include <thread>

#include <fmt/format.h>

#include "base/file_io.h"
#include "dist/training_job.h"
#include "reference_runner.h"
#include "test_util.h"

namespace paraflow {
namespace {

class DataParallel : public testing::TrainingJob {
 protected:
  void SetUp() override {
    write_config("{vocab_size: 256, n_positions: 16, n_embd: 24, n_layer: 2, n_head: 2}",
                 "{batch_size: 6, sequence_length: 16, steps: 10, lr: 1.0e-3, log_every: 100}");
  }
};

// dist.exact_reduction: 12 micro-batches per step split as 1 x 12, 2 x 6, 3 x 4 and 4 x 3 ranks x
// accumulation steps, over MPI and Gloo, end with the same parameters bit for bit. Float sums in
// those orders do not (the control).
TEST_F(DataParallel, ExactReductionMakesResultsIndependentOfRanksAndAccumulation) {
  const std::string exact = "--set dist.exact_reduction=true --set train.batch_size=12 ";
  ASSERT_EQ(run(train_command("exact1x12", exact + "--set train.grad_accumulation=12")), 0);
  ASSERT_EQ(run(mpirun(2) + train_command("exact2x6", exact + "--set train.grad_accumulation=6")), 0);
  ASSERT_EQ(run(mpirun(3) + train_command("exact3x4", exact + "--set train.grad_accumulation=4")), 0);
  ASSERT_EQ(run(mpirun(4) + train_command("exact4x3", exact + "--set train.grad_accumulation=3")), 0);
  ASSERT_EQ(run(tf_config(3) + train_command("exact3x4gloo", exact + "--set train.grad_accumulation=4")), 0);
  for (const char* other : {"exact2x6", "exact3x4", "exact4x3", "exact3x4gloo"}) {
    EXPECT_TRUE(bitwise_equal("exact1x12", other)) << other;
  }
  const std::string floats = "--set train.batch_size=12 ";
  ASSERT_EQ(run(train_command("float1x12", floats + "--set train.grad_accumulation=12")), 0);
  ASSERT_EQ(run(mpirun(4) + train_command("float4x3", floats + "--set train.grad_accumulation=3")), 0);
  EXPECT_FALSE(bitwise_equal("float1x12", "float4x3")) << "float sums in another order should differ";
  // And the exact sums are the float sums up to rounding.
  std::vector<double> exact_weights = weights("exact1x12"), float_weights = weights("float1x12");
  ASSERT_EQ(exact_weights.size(), float_weights.size());
  EXPECT_LT(testing::relative_error(exact_weights, float_weights), 1e-4);
}

TEST_F(DataParallel, TwoRanksEqualTwoStepAccumulationBitwise) {
  ASSERT_EQ(run(train_command("accumulate2", "--set train.grad_accumulation=2")), 0);
  ASSERT_EQ(run(mpirun(2) + train_command("mpi2")), 0);
  ASSERT_EQ(run(tf_config(2) + train_command("gloo2")), 0);
  ASSERT_EQ(run(mpirun(2) + train_command("mpi2_no_overlap", "--set dist.overlap=false")), 0);
  EXPECT_TRUE(bitwise_equal("accumulate2", "mpi2")) << "mpirun -np 2";
  EXPECT_TRUE(bitwise_equal("accumulate2", "gloo2")) << "TF_CONFIG, 2 tasks";
  EXPECT_TRUE(bitwise_equal("accumulate2", "mpi2_no_overlap")) << "overlap off";
}

TEST_F(DataParallel, ThreeRanksMatchThreeStepAccumulation) {
  ASSERT_EQ(run(train_command("accumulate3", "--set train.grad_accumulation=3")), 0);
  ASSERT_EQ(run(mpirun(3) + train_command("mpi3")), 0);
  ASSERT_EQ(run(tf_config(3) + train_command("gloo3")), 0);
  std::vector<double> reference = weights("accumulate3");
  for (const char* out : {"mpi3", "gloo3"}) {
    double error = testing::relative_error(weights(out), reference);
    std::printf("  %s: parameters after 10 steps, rel err %.3e vs one rank\n", out, error);
    EXPECT_LE(error, 1e-5) << out;
  }
}

TEST_F(DataParallel, ZeroOneShardsTheOptimizerAndKeepsTheResults) {
  // Without clipping, ZeRO-1's reduce-scatter + sharded AdamW + all-gather is bitwise the plain
  // all-reduce; stopped and resumed (moments gathered into the checkpoint, re-sharded) too.
  const std::string no_clip = "--set train.grad_clip=0 ";
  ASSERT_EQ(run(train_command("accumulate2", no_clip + "--set train.grad_accumulation=2")), 0);
  ASSERT_EQ(run(mpirun(2) + train_command("zero2", no_clip + "--set dist.zero=1")), 0);
  ASSERT_EQ(run(tf_config(2) + train_command("zero2_resumed", no_clip + "--set dist.zero=1 --set train.stop_at_step=4")), 0);
  ASSERT_EQ(run(tf_config(2) + train_command("zero2_resumed", no_clip + "--set dist.zero=1")), 0);
  EXPECT_TRUE(bitwise_equal("accumulate2", "zero2"));
  EXPECT_TRUE(bitwise_equal("accumulate2", "zero2_resumed"));
  // 3 ranks (the shards need padding) with clipping on: the norm is summed over shards.
  ASSERT_EQ(run(train_command("accumulate3", "--set train.grad_accumulation=3")), 0);
  ASSERT_EQ(run(mpirun(3) + train_command("zero3", "--set dist.zero=1")), 0);
  double error = testing::relative_error(weights("zero3"), weights("accumulate3"));
  std::printf("  ZeRO-1 on 3 ranks: rel err %.3e vs one rank\n", error);
  EXPECT_LE(error, 1e-5);
}

// ZeRO-2 reduce-scatters every micro-batch and sums it into the rank's shard (no rank holds a
// whole accumulator): the sums run in another order than one rank's accumulation, so the runs
// equal one rank within 1e-5, with clipping on, on 2 ranks and on 3 (padded shards); a run stopped
// on 2 Gloo ranks resumes on 3 MPI ranks. A pipeline, which accumulates in whole buffers, refuses
// it by name.
TEST_F(DataParallel, ZeroTwoShardsTheGradientsAndKeepsTheResults) {
  ASSERT_EQ(run(train_command("accumulate6", "--set train.grad_accumulation=6")), 0);
  const std::string zero2 = "--set dist.zero=2 ";
  ASSERT_EQ(run(mpirun(2) + train_command("zero2_2x3", zero2 + "--set train.grad_accumulation=3")), 0);
  ASSERT_EQ(run(mpirun(3) + train_command("zero2_3x2", zero2 + "--set train.grad_accumulation=2")), 0);
  ASSERT_EQ(run(mpirun(2) + train_command("zero2_2x1", zero2 + "--set train.batch_size=2")), 0);
  ASSERT_EQ(run(tf_config(2) + train_command("zero2_resumed", zero2 + "--set train.grad_accumulation=3 "
                                                                       "--set train.stop_at_step=4")), 0);
  ASSERT_EQ(run(mpirun(3) + train_command("zero2_resumed", zero2 + "--set train.grad_accumulation=2")), 0);
  for (const char* out : {"zero2_2x3", "zero2_3x2", "zero2_resumed"}) {
    const double error = testing::relative_error(weights(out), weights("accumulate6"));
    std::printf("  %s: rel err %.3e vs one rank\n", out, error);
    EXPECT_LE(error, 1e-5) << out;
  }
  // One micro-batch per rank: the reduce-scatter alone, against one rank's accumulation of two.
  ASSERT_EQ(run(train_command("accumulate2", "--set train.batch_size=2 --set train.grad_accumulation=2")), 0);
  EXPECT_LE(testing::relative_error(weights("zero2_2x1"), weights("accumulate2")), 1e-5);
  EXPECT_NE(failure_message(mpirun(2) + train_command("x", zero2 + "--set dist.pipeline_parallel=2"))
                .find("dist.zero: 2 (sharded gradient accumulation) does not combine with dist.pipeline_parallel: 2"),
            std::string::npos);
}

// ZeRO-3 also keeps only its shard of the parameters and gathers them layer by layer, for
// forward, backward and evaluation: equal to one rank within 1e-5, on 2 and 3 ranks, resumed
// across a stop from 2 Gloo ranks onto 3 MPI ranks. Tensor-parallel shards and 16-bit weights are
// refused by name.
TEST_F(DataParallel, ZeroThreeShardsTheParametersAndKeepsTheResults) {
  const std::string eval = "--set train.eval_every=5 --set train.eval_batches=2 ";
  ASSERT_EQ(run(train_command("accumulate6", eval + "--set train.grad_accumulation=6")), 0);
  const std::string zero3 = eval + "--set dist.zero=3 ";
  ASSERT_EQ(run(mpirun(2) + train_command("zero3_2x3", zero3 + "--set train.grad_accumulation=3")), 0);
  ASSERT_EQ(run(mpirun(3) + train_command("zero3_3x2", zero3 + "--set train.grad_accumulation=2")), 0);
  ASSERT_EQ(run(tf_config(2) + train_command("zero3_resumed", zero3 + "--set train.grad_accumulation=3 "
                                                                       "--set train.stop_at_step=4")), 0);
  ASSERT_EQ(run(mpirun(3) + train_command("zero3_resumed", zero3 + "--set train.grad_accumulation=2")), 0);
  const std::map<int64_t, double> validation = scalars("accumulate6", "train/val_loss");
  ASSERT_EQ(validation.size(), 2u);
  for (const char* out : {"zero3_2x3", "zero3_3x2", "zero3_resumed"}) {
    const double error = testing::relative_error(weights(out), weights("accumulate6"));
    std::printf("  %s: rel err %.3e vs one rank\n", out, error);
    EXPECT_LE(error, 1e-5) << out;
  }
  for (const char* out : {"zero3_2x3", "zero3_3x2"}) {
    const std::map<int64_t, double> losses = scalars(out, "train/val_loss");
    ASSERT_EQ(losses.size(), validation.size()) << out;
    for (const auto& [step, loss] : validation) EXPECT_NEAR(losses.at(step), loss, 1e-5 * loss) << out << " step " << step;
  }
  // Every layout reports its ranks' largest growth of peak RSS, and which rank it was.
  EXPECT_TRUE(std::regex_search(failure_message(mpirun(2) + train_command("zero3_log", zero3 + "--set train.steps=3")),
                                std::regex(R"(peak RSS grew [0-9.]+ MiB over the first two steps on rank [01], the most of 2 ranks)")));
  EXPECT_NE(failure_message(mpirun(2) + train_command("x", zero3 + "--set dist.tensor_parallel=2"))
                .find("dist.zero: 3 does not combine with dist.tensor_parallel: 2"),
            std::string::npos);
  EXPECT_NE(failure_message(mpirun(2) + train_command("x", zero3 + "--set train.precision=mixed_bfloat16"))
                .find("dist.zero: 3 does not combine with train.precision: mixed_bfloat16"),
            std::string::npos);
}

// Only the chief writes checkpoints; the other ranks wait for it past dist.timeout_seconds (a
// save on slow storage is not a dead peer). Here every fsync takes 0.4 s, so each save takes
// seconds against a 2 s timeout, and the resumed run waits while the chief loads.
TEST_F(DataParallel, GlooRanksWaitForTheChiefsSlowCheckpoints) {
  const std::string slow = fmt::format("env LD_PRELOAD={} PARAFLOW_TEST_FSYNC_MS=400 ", SLOW_FSYNC_LIBRARY);
  const std::string settings = "--set dist.timeout_seconds=2 --set train.checkpoint_every=2 --set train.steps=6 ";
  ASSERT_EQ(run(tf_config(2) + slow + train_command("slow_io", settings + "--set train.stop_at_step=4")), 0);
  ASSERT_EQ(run(tf_config(2) + slow + train_command("slow_io", settings)), 0);
  EXPECT_TRUE(std::filesystem::exists(dir.path() / "slow_io" / "ckpt-000000006"));
}

TEST_F(DataParallel, CheckpointFromTwoRanksResumesOnOneOrThree) {
  ASSERT_EQ(run(train_command("straight", "--set train.grad_accumulation=6")), 0);
  for (int ranks : {1, 3}) {
    std::string out = "resume_on_" + std::to_string(ranks);
    // 5 steps on 2 ranks, then the same run continued to 10 on `ranks` ranks.
    ASSERT_EQ(run(mpirun(2) + train_command(out, "--set train.steps=10 --set train.grad_accumulation=3 "
                                                  "--set train.stop_at_step=5")), 0);
    std::string accumulation = "--set train.grad_accumulation=" + std::to_string(6 / ranks);
    ASSERT_EQ(run((ranks > 1 ? mpirun(ranks) : "") + train_command(out, accumulation)), 0);
    double error = testing::relative_error(weights(out), weights("straight"));
    std::printf("  2 ranks then %d: rel err %.3e vs an uninterrupted single rank\n", ranks, error);
    EXPECT_LE(error, 1e-5);
  }
}

TEST_F(DataParallel, KilledWorkerResumesExactly) {
  const std::string extra = "--set train.steps=150 --set train.checkpoint_every=2";
  ASSERT_EQ(run(tf_config(2) + train_command("uninterrupted", extra)), 0);

  // The same job; SIGKILL the worker once the chief has written checkpoint 4.
  std::string command = tf_config(2) + train_command("crashed", extra);
  crash_newest_rank_after("crashed", command, 4);  // the worker
  ASSERT_EQ(run(command), 0) << "relaunching the same command resumes";
  EXPECT_TRUE(bitwise_equal("uninterrupted", "crashed"));
}

TEST_F(DataParallel, SigtermToTheJobStopsEveryRankWithACheckpoint) {
  preempt_after_first_checkpoint(
      "preempted", tf_config(2) + train_command("preempted", "--set train.steps=100000 --set train.checkpoint_every=2"));
}

// One rank started with other settings (mpirun's MPMD form): before the first collective every
// rank stops, the odd one naming each key with both values, the chief naming the odd rank.
TEST_F(DataParallel, RanksWithOtherSettingsAreRefusedByName) {
  const std::string log = (dir.path() / "mismatch.log").string();
  const std::string command = fmt::format("mpirun --allow-run-as-root --oversubscribe -x OMP_NUM_THREADS=1 -np 1 {} : -np 1 {}",
                                          train_command("mismatch"),
                                          train_command("mismatch", "--set train.lr=2e-3 --set model.n_layer=3"));
  const int status = std::system((command + " > " + log + " 2>&1").c_str());
  EXPECT_NE(WEXITSTATUS(status), 0);
  const std::string message = read_file(log);
  EXPECT_NE(message.find("rank 1 of 2: this rank's settings differ from the chief's (rank 0): model.n_layer 3 here, 2 "
                         "on the chief; train.lr 0.002 here, 0.001 on the chief"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("rank 0 of 2: the settings of rank(s) 1 of 2 differ from the chief's"), std::string::npos)
      << message;
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "mismatch/ckpt-000000010"));

  // Another validation split: other training tokens, so global batch k would differ between ranks.
  const std::string split = fmt::format("mpirun --allow-run-as-root --oversubscribe -x OMP_NUM_THREADS=1 -np 1 {} : -np 1 {}",
                                        train_command("mismatch"),
                                        train_command("mismatch", "--set data.validation_fraction=0.2"));
  EXPECT_NE(WEXITSTATUS(std::system((split + " > " + log + " 2>&1").c_str())), 0);
  EXPECT_NE(read_file(log).find("this rank's settings differ from the chief's (rank 0): data.train_tokens"),
            std::string::npos)
      << read_file(log);
}

TEST_F(DataParallel, UnreachablePeerFailsWithinTheTimeoutNamingIt) {
  // A worker whose chief never comes up.
  std::string cluster = R"({"cluster":{"chief":["127.0.0.1:1"],"worker":["127.0.0.1:2"]},"task":{"type":"worker","index":0}})";
  auto start = std::chrono::steady_clock::now();
  std::string log = (dir.path() / "worker.log").string();
  int status = std::system(fmt::format("TF_CONFIG='{}' {} --set dist.timeout_seconds=2 > {} 2>&1", cluster,
                                       train_command("lonely"), log).c_str());
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(WEXITSTATUS(status), 0);
  EXPECT_LT(seconds, 20);
  std::string message = read_file(log);
  EXPECT_NE(message.find("127.0.0.1:1"), std::string::npos) << message;
}

// A task whose host is a loopback address in a job that spans hosts (Debian's /etc/hosts maps the
// machine's own name to 127.0.1.1) is refused at once, naming it, instead of Gloo publishing an
// address the other hosts cannot reach and failing there after the timeout.
TEST_F(DataParallel, ALoopbackHostInAJobAcrossHostsIsRefused) {
  std::string cluster = R"({"cluster":{"chief":["127.0.0.1:1"],"worker":["192.0.2.1:2"]},"task":{"type":"chief","index":0}})";
  const std::string message = failure_message(fmt::format("TF_CONFIG='{}' {} --set dist.timeout_seconds=30", cluster,
                                                          train_command("loopback")));
  EXPECT_NE(message.find("\"127.0.0.1\" resolves to a loopback address"), std::string::npos) << message;
  EXPECT_NE(message.find("worker 0 at 192.0.2.1:2"), std::string::npos) << message;
}

}  // namespace
}  // namespace paraflow
