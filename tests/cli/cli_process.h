// A fixture for tests of the `paraflow` command line as a real process (PARAFLOW_BINARY): a letter
// corpus, a tiny model's config, and the command run through tests/faults/process.h.
#pragma once

#include <gtest/gtest.h>

#include <fmt/format.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include "base/file_io.h"
#include "faults/process.h"
#include "reference_runner.h"

namespace paraflow::testing {

class CliProcess : public ::testing::Test {
 protected:
  void SetUp() override {
    write_letter_corpus(dir.path() / "corpus.txt", 100000, 26, 5);
    write_config("config.yaml", "{vocab_size: 256, n_positions: 32, n_embd: 32, n_layer: 2, n_head: 2}", 4, 32);
  }

  // A config of this model (a YAML flow map) on the letter corpus, training into dir/run.
  void write_config(const std::string& name, const std::string& model, int batch_size, int sequence_length) const {
    write_file_atomic(dir.path() / name, fmt::format(R"(model: {}
data: {{train: "{}", format: text}}
train: {{batch_size: {}, sequence_length: {}, steps: 1000000, log_every: 1000, out_dir: "{}"}}
dist: {{timeout_seconds: 20}}
)", model, (dir.path() / "corpus.txt").string(), batch_size, sequence_length, (dir.path() / "run").string()));
  }
  static std::string binary() { return std::getenv("PARAFLOW_BINARY"); }
  std::string config() const { return (dir.path() / "config.yaml").string(); }
  std::string train(const std::string& extra = "") const {
    return fmt::format("{} train --config {} --threads 1 {}", binary(), config(), extra);
  }
  Ended run(const std::string& command, std::chrono::duration<double> deadline = std::chrono::seconds(60)) const {
    return run_process(command, dir.path() / "output.txt", deadline);
  }
  // Waits until the process has printed `needle` (false if it ended first or within a minute).
  bool wait_for_output(Process& process, const std::filesystem::path& output, const std::string& needle) const {
    for (auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60); std::chrono::steady_clock::now() < until;) {
      if (std::filesystem::exists(output) && read_file(output).find(needle) != std::string::npos) return true;
      if (process.finished()) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }

  TempDir dir;
};

}  // namespace paraflow::testing
