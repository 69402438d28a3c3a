// A fixture for tests that run the real `paraflow train` as jobs of several processes (mpirun,
// or TF_CONFIG tasks on loopback) and compare what they export, log and checkpoint.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "base/file_io.h"
#include "data/event.pb.h"
#include "data/tfrecord.h"
#include "model/safetensors.h"
#include "reference_runner.h"
#include "test_util.h"

namespace paraflow::testing {

class TrainingJob : public ::testing::Test {
 protected:
  // A letter corpus and a config of this model and train section (YAML flow maps).
  void write_config(const std::string& model, const std::string& train) {
    write_letter_corpus(dir.path() / "corpus.txt", 60000, 26, 3);
    write_file_atomic(dir.path() / "config.yaml", fmt::format(R"(model: {}
data: {{train: "{}", format: text}}
train: {}
dist: {{bucket_mb: 0.002, timeout_seconds: 20}}
)", model, (dir.path() / "corpus.txt").string(), train));
  }

  std::string train_command(const std::string& out, const std::string& extra = "") const {
    return fmt::format("{} train --config {} --threads 1 --set train.out_dir={} {}", binary(),
                       (dir.path() / "config.yaml").string(), (dir.path() / out).string(), extra);
  }
  static std::string binary() { return std::getenv("PARAFLOW_BINARY"); }
  static std::string mpirun(int ranks) {
    return fmt::format("mpirun --allow-run-as-root --oversubscribe -np {} -x OMP_NUM_THREADS=1 ", ranks);
  }
  static std::string tf_config(int ranks) {
    return (source_dir() / "tests/dist/launch_tf_config.sh").string() + " " + std::to_string(ranks) + " ";
  }
  static int run(const std::string& command) {
    int status = std::system((command + " > /dev/null 2>&1").c_str());
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  // Starts `command` in its own process group, without waiting.
  static pid_t start(const std::string& command) {
    pid_t job = fork();
    if (job == 0) {
      setpgid(0, 0);
      execl("/bin/sh", "sh", "-c", (command + " > /dev/null 2>&1").c_str(), nullptr);
      _exit(127);
    }
    return job;
  }
  // Waits up to a minute for `done()`.
  template <typename Done>
  static bool wait_until(Done done) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!done() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return done();
  }
  // Waits up to a minute for `path` to exist.
  static bool wait_for(const std::filesystem::path& path) {
    return wait_until([&] { return std::filesystem::exists(path); });
  }

  // The step of the newest complete checkpoint in `run`, -1 if none (or no `run` yet).
  static int64_t latest_checkpoint(const std::filesystem::path& run) {
    int64_t latest = -1;
    std::error_code error;
    for (const auto& entry : std::filesystem::directory_iterator(run, error)) {
      std::string name = entry.path().filename().string();
      if (name.rfind("ckpt-", 0) == 0 && name.find(".tmp") == std::string::npos) {
        latest = std::max<int64_t>(latest, std::stoll(name.substr(5)));
      }
    }
    return latest;
  }
  // Waits up to a minute for a checkpoint at a step >= `step` in `run`. Not for one checkpoint by
  // name: a fast job can write it and prune it (train.keep_checkpoints) between two looks.
  static bool wait_for_checkpoint(const std::filesystem::path& run, int64_t step) {
    return wait_until([&] { return latest_checkpoint(run) >= step; });
  }

  // Runs `command` (training into `out`) until it has checkpointed at `step` or later, then
  // SIGKILLs the newest paraflow process of the job (the launchers start rank 0 first); the job
  // must fail without an export.
  void crash_newest_rank_after(const std::string& out, const std::string& command, int step) const {
    pid_t job = start(command);
    ASSERT_TRUE(wait_for_checkpoint(dir.path() / out, step));
    // The pattern is anchored at the binary so it matches neither the launcher nor this shell.
    std::system(fmt::format("pkill -9 -n -f '^{} train.*{}/{}'", binary(), dir.path().string(), out).c_str());
    int status = 0;
    waitpid(job, &status, 0);
    EXPECT_FALSE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the job should fail when a rank dies";
    EXPECT_FALSE(std::filesystem::exists(dir.path() / out / "export")) << "the crashed run must not have finished";
  }

  // Runs `command` (training into `out`, checkpointing every 2 steps) until a checkpoint exists,
  // then SIGTERMs every process of the job, as Kubernetes and mpirun deliver preemption: every
  // rank must stop at the same step with a checkpoint and exit 0.
  void preempt_after_first_checkpoint(const std::string& out, const std::string& command) const {
    pid_t job = start(command);
    wait_for_checkpoint(dir.path() / out, 2);
    std::system(fmt::format("pkill -TERM -f '^{} train.*{}/{}'", binary(), dir.path().string(), out).c_str());
    int status = 0;
    waitpid(job, &status, 0);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0) << "every rank exits 0";
    EXPECT_TRUE(std::filesystem::exists(dir.path() / out / "export/model.safetensors"));
    train_checkpoint_exists_after(dir.path() / out, 3);
  }

  std::vector<double> weights(const std::string& out) const {
    model::SafetensorsFile file = model::SafetensorsFile::load((dir.path() / out / "export/model.safetensors").string());
    std::vector<double> all;
    for (const auto& [name, entry] : file.entries()) {
      std::vector<double> part = to_vector(file.tensor(name));
      all.insert(all.end(), part.begin(), part.end());
    }
    return all;
  }
  bool bitwise_equal(const std::string& a, const std::string& b) const {
    return read_file(dir.path() / a / "export/model.safetensors") == read_file(dir.path() / b / "export/model.safetensors");
  }
  // The run's TensorBoard scalars `tag` by step, from every event file in its directory.
  std::map<int64_t, double> scalars(const std::string& out, const std::string& tag) const {
    std::map<int64_t, double> values;
    for (const auto& entry : std::filesystem::directory_iterator(dir.path() / out)) {
      if (entry.path().filename().string().rfind("events.out.tfevents.", 0) != 0) continue;
      data::TFRecordReader reader(entry.path());
      while (auto record = reader.next()) {
        tf::Event event;
        EXPECT_TRUE(event.ParseFromArray(record->data(), static_cast<int>(record->size())));
        for (const auto& value : event.summary().value()) {
          if (value.tag() == tag) values[event.step()] = value.simple_value();
        }
      }
    }
    return values;
  }

  // The run's losses, gradient norms and final weights against the reference run's. The
  // micro-batches' gradients are summed in another order than one process sums its batch's rows,
  // so results agree to float32 rounding, compounded over the steps: 1e-5 relative, as data
  // parallelism's, unless the test asks for less.
  void expect_same_training(const std::string& out, const std::string& reference, double bound = 1e-5) {
    double worst_loss = 0, worst_norm = 0;
    for (const auto& [tag, worst] : {std::pair<const char*, double*>{"train/loss", &worst_loss},
                                     std::pair<const char*, double*>{"train/grad_norm", &worst_norm}}) {
      std::map<int64_t, double> values = scalars(out, tag), expected = scalars(reference, tag);
      ASSERT_EQ(values.size(), expected.size()) << out << " " << tag;
      for (const auto& [step, value] : expected) *worst = std::max(*worst, std::abs(values[step] - value) / value);
    }
    const double weight_error = relative_error(weights(out), weights(reference));
    std::printf("  %-16s loss rel err %.2e, grad norm rel err %.2e, weights rel err %.2e\n", out.c_str(), worst_loss,
                worst_norm, weight_error);
    EXPECT_LE(worst_loss, bound) << out;
    EXPECT_LE(worst_norm, bound) << out;
    EXPECT_LE(weight_error, bound) << out;
  }

  std::string failure_message(const std::string& command) const {
    const std::string log = (dir.path() / "failure.log").string();
    std::system((command + " > " + log + " 2>&1").c_str());
    return read_file(log);
  }
  // A valid checkpoint at a step >= `step` exists in `run`.
  static void train_checkpoint_exists_after(const std::filesystem::path& run, int64_t step) {
    EXPECT_GE(latest_checkpoint(run), step);
  }

  TempDir dir;
};

}  // namespace paraflow::testing
