// Runs a Python oracle from tests/reference/ with the reference interpreter that CTest passes in
// PARAFLOW_REFERENCE_PYTHON. A missing interpreter or a failing oracle fails the test.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "base/file_io.h"
#include "base/random.h"

namespace paraflow::testing {

inline std::string reference_python() {
  const char* python = std::getenv("PARAFLOW_REFERENCE_PYTHON");
  return python ? python : "";
}

inline std::filesystem::path source_dir() {
  const char* dir = std::getenv("PARAFLOW_SOURCE_DIR");
  return dir ? std::filesystem::path(dir) : std::filesystem::path(PARAFLOW_SOURCE_DIR_FALLBACK);
}

// Returns true when the oracle exited 0; the test fails otherwise.
inline bool run_oracle(const std::string& script, const std::string& arguments) {
  std::string python = reference_python();
  EXPECT_TRUE(!python.empty() && std::filesystem::exists(python))
      << "reference Python not found (PARAFLOW_REFERENCE_PYTHON='" << python << "'); run scripts/setup.sh";
  std::string command = python + " " + (source_dir() / "tests/reference" / script).string() + " " + arguments;
  int status = std::system(command.c_str());
  EXPECT_EQ(status, 0) << "oracle failed: " << command;
  return status == 0;
}

// `bytes` random letters from the first `letters` of the alphabet: a corpus for byte-level runs.
inline void write_letter_corpus(const std::filesystem::path& path, size_t bytes, int letters, uint64_t seed) {
  Rng rng(seed);
  std::string corpus(bytes, 'a');
  for (char& c : corpus) c = static_cast<char>('a' + rng.below(static_cast<uint64_t>(letters)));
  write_file_atomic(path, corpus);
}

// A fresh temporary directory, removed when the object goes away.
class TempDir {
 public:
  TempDir() {
    Rng rng(static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()));
    path_ = std::filesystem::temp_directory_path() / ("paraflow-test-" + std::to_string(rng.next_u64()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace paraflow::testing
