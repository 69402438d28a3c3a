// SIGTERM/SIGINT on the real binary: one stop request, however many copies of it arrive (GNU
// timeout signals the process and then its group), ends with a checkpoint (train) or a drain
// (serve); a second signal well after the first ends the process at once, saying what it skipped.
// (The two-copies tests failed before: a copy counted as a second, insisting signal.)
#include <signal.h>

#include "cli/cli_process.h"
#include "cli/stop_signal.h"
#include "train/checkpoint.h"

namespace paraflow {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

class StopSignal : public testing::CliProcess {
 protected:
  // A model whose training steps take seconds on one thread (a batch of 64 x 128 tokens through
  // 10.6M parameters, about 0.5 TFLOP): a stop request waits for the step in progress.
  void use_slow_steps() const {
    write_config("config.yaml", "{vocab_size: 256, n_positions: 128, n_embd: 384, n_layer: 6, n_head: 6}", 64, 128);
  }
  bool has_checkpoint() const { return train::CheckpointManager(dir.path() / "run", 3).latest_valid().has_value(); }
};

// The copies of one signal that GNU timeout sends, to the process and then to its group, the
// second while the first is being honoured (during a step that takes seconds, 100 ms after it).
TEST_F(StopSignal, TrainSavesACheckpointWhenOneSignalArrivesTwice) {
  use_slow_steps();
  for (int number : {SIGTERM, SIGINT}) {
    fs::remove_all(dir.path() / "run");
    const fs::path output = dir.path() / fmt::format("signal-{}.txt", number);  // not the last run's
    testing::Process process(train(), output);
    ASSERT_TRUE(wait_for_output(process, output, "precision")) << "training did not start";
    process.signal(number);
    std::this_thread::sleep_for(100ms);
    kill(-process.pid(), number);  // testing::Process starts the command as a group leader
    testing::Ended ended = process.wait(120s);
    const std::string what = fmt::format("signal {} to the process and its group", number);
    testing::expect_clean_end(ended, what);
    EXPECT_EQ(ended.exit_code, 0) << what << "\n" << ended.output;
    EXPECT_EQ(ended.output.find("second stop signal"), std::string::npos) << what << "\n" << ended.output;
    EXPECT_TRUE(has_checkpoint()) << what << "\n" << ended.output;
  }
}

TEST_F(StopSignal, TrainUnderGnuTimeoutEndsWithACheckpoint) {
  for (int seconds : {2, 3, 4}) {
    fs::remove_all(dir.path() / "run");
    // --preserve-status: timeout exits with paraflow's status, not 124.
    testing::Ended ended = run(fmt::format("timeout --preserve-status -s TERM {} {}", seconds, train()), 60s);
    const std::string what = fmt::format("timeout -s TERM {}", seconds);
    testing::expect_clean_end(ended, what);
    EXPECT_EQ(ended.exit_code, 0) << what << "\n" << ended.output;
    EXPECT_TRUE(has_checkpoint()) << what << "\n" << ended.output;
  }
}

// A signal after cli::kSameStopRequest is a second request: the process ends at once, during a
// step that takes seconds (so not after a checkpoint), with 128 + SIGTERM. The first signal comes
// just after the second step's memory line, so the third step has just begun (a signal before the
// first step, during the start-up's GEMM peak measurement, let the run checkpoint within 1.5 s).
TEST_F(StopSignal, ALaterSecondSignalExitsWithoutACheckpoint) {
  use_slow_steps();
  testing::Process process(train(), dir.path() / "output.txt");
  ASSERT_TRUE(wait_for_output(process, dir.path() / "output.txt", "memory: peak RSS grew")) << "training did not start";
  process.signal(SIGTERM);
  std::this_thread::sleep_for(cli::kSameStopRequest + 500ms);
  process.signal(SIGTERM);
  testing::Ended ended = process.wait(60s);
  EXPECT_EQ(ended.exit_code, 128 + SIGTERM) << ended.output;
  EXPECT_NE(ended.output.find("second stop signal: exiting without a checkpoint"), std::string::npos) << ended.output;
  EXPECT_FALSE(has_checkpoint()) << ended.output;
}

// `timeout -s TERM` around serve: its two copies of SIGTERM are one request, so serve drains
// (it skipped its drain in 6 runs of 10 from a shell).
TEST_F(StopSignal, ServeUnderGnuTimeoutDrains) {
  testing::Ended trained = run(train("--set train.steps=1"));
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  for (int attempt = 0; attempt < 5; ++attempt) {
    testing::Ended ended = run(fmt::format("timeout --preserve-status -s TERM 2 {} serve --model {} --port 0 --threads 1 "
                                           "--kv-cache-gb 0.002", binary(), (dir.path() / "run/export").string()));
    const std::string what = fmt::format("timeout -s TERM 2 serve (attempt {})", attempt);
    testing::expect_clean_end(ended, what);
    EXPECT_EQ(ended.exit_code, 0) << what << "\n" << ended.output;
    EXPECT_NE(ended.output.find("stopping: finishing requests in flight"), std::string::npos) << what << "\n" << ended.output;
    EXPECT_NE(ended.output.find("paraflow serve: stopped"), std::string::npos) << what << "\n" << ended.output;
    EXPECT_EQ(ended.output.find("second stop signal"), std::string::npos) << what << "\n" << ended.output;
  }
}

}  // namespace
}  // namespace paraflow
