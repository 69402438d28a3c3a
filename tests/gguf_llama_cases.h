// The Llama-family models the GGUF tests write and read (vocabulary 128: each token one ASCII byte,
// rows whole Q8_0 blocks): Llama with plain heads and linear rope scaling, Llama 3 with grouped
// k/v heads, llama3 rope scaling and an untied head, Mistral with one k/v head, Qwen2 with q/k/v
// biases and a tied head. And the oracle that writes them as llama.cpp's converter does.
#pragma once

#include <fmt/format.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "model_configs.h"
#include "reference_runner.h"
#include "test_util.h"

namespace paraflow::testing {

struct GgufLlamaCase {
  const char* name;
  model::GptConfig config;
};
inline void PrintTo(const GgufLlamaCase& c, std::ostream* out) { *out << c.name; }

inline std::vector<GgufLlamaCase> gguf_llama_cases() {
  model::GptConfig llama = llama_config("llama", 128, 64, 32, 64, 2, 4, 4, 8);
  llama.rope = {.theta = 10000, .scaling = RopeScaling::linear, .factor = 2};
  model::GptConfig llama3 = llama_config("llama", 128, 64, 64, 64, 2, 4, 2, 16);
  // Two of its eight frequencies between the two wavelengths: the smooth part that llama.cpp's
  // rope_freqs holds and the reader recovers the parameters from.
  llama3.rope = {.theta = 500000, .scaling = RopeScaling::llama3, .factor = 8, .low_freq_factor = 1,
                 .high_freq_factor = 32, .original_max_position = 8192};
  model::GptConfig mistral = llama_config("mistral", 128, 64, 32, 64, 2, 4, 1, 8);
  model::GptConfig qwen2 = llama_config("qwen2", 128, 64, 32, 64, 2, 4, 2, 8);
  qwen2.tie_word_embeddings = true;
  return {{"llama", llama}, {"llama3", llama3}, {"mistral", mistral}, {"qwen2", qwen2}};
}

// tests/reference/gguf_llama.py ACTION ARGUMENTS in .venv-data; its exit status.
inline int gguf_llama_oracle(const std::string& arguments) {
  const std::filesystem::path root = source_dir(), python = root / ".venv-data/bin/python";
  EXPECT_TRUE(std::filesystem::exists(python)) << python << " missing: run scripts/setup_python_data.sh";
  const std::string command = python.string() + " " + (root / "tests/reference/gguf_llama.py").string() + " " + arguments;
  const int status = std::system(command.c_str());
  EXPECT_EQ(status, 0) << command;
  return status;
}

}  // namespace paraflow::testing
