// Llama-family GGUF files decode as transformers decodes their Hugging Face weights: each model of
// tests/gguf_llama_cases.h (random weights), saved as a Hugging Face dir and converted to an F32
// GGUF file as llama.cpp's converter writes it (tests/reference/gguf_llama.py, q/k rows permuted
// for `llama`, Llama 3's rope scaling as rope_freqs), is decoded greedily by `paraflow generate
// --dtype float32` on the file, and by transformers (tests/reference/gpt2_hf.py greedy, float64)
// on the dir: the same tokens up to the first near-tie. No tokenizer: each token is one byte.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cstdlib>

#include "base/file_io.h"
#include "gguf_llama_cases.h"
#include "model/model_files.h"
#include "model/safetensors.h"
#include "random_llama.h"
#include "reference_runner.h"

namespace paraflow {
namespace {

class GgufLlamaGenerate : public ::testing::TestWithParam<testing::GgufLlamaCase> {};

TEST_P(GgufLlamaGenerate, GreedyTokensOfTheFileEqualTransformersOnTheDir) {
  const model::GptConfig& config = GetParam().config;
  testing::TempDir dir;
  Rng rng(testing::test_seed());
  model::save_model_dir(dir.path() / "hf", config, testing::random_llama_parameters(config, rng));
  const std::filesystem::path file = dir.path() / "model.gguf";
  ASSERT_EQ(testing::gguf_llama_oracle(fmt::format("convert {} {} f32", (dir.path() / "hf").string(), file.string())), 0);

  const std::string prompt = "Hello, gguf";
  const int64_t max_new = 24;
  std::string prompt_ids;
  for (unsigned char c : prompt) prompt_ids += (prompt_ids.empty() ? "" : ",") + std::to_string(c);
  ASSERT_TRUE(testing::run_oracle("gpt2_hf.py", fmt::format("greedy --model {} --prompt {} --max-new {} --out {}",
                                                            (dir.path() / "hf").string(), prompt_ids, max_new,
                                                            (dir.path() / "greedy.safetensors").string())));
  const model::SafetensorsFile expected = model::SafetensorsFile::load((dir.path() / "greedy.safetensors").string());
  const Tensor tokens = expected.tensor("tokens"), gaps = expected.tensor("gaps");
  const std::filesystem::path printed = dir.path() / "generated.txt";
  ASSERT_EQ(std::system(fmt::format("{} generate --model {} --prompt '{}' --max-tokens {} --temperature 0 "
                                    "--dtype float32 > {} 2>/dev/null",
                                    std::getenv("PARAFLOW_BINARY"), file.string(), prompt, max_new, printed.string())
                            .c_str()),
            0);
  const std::string text = read_file(printed);
  ASSERT_GE(text.size(), prompt.size() + 1);
  const std::string generated = text.substr(prompt.size(), text.size() - prompt.size() - 1);
  int compared = 0;
  for (int64_t step = 0; step < max_new && gaps.data<double>()[step] >= 1e-3; ++step, ++compared) {
    ASSERT_LT(static_cast<size_t>(step), generated.size());
    EXPECT_EQ(static_cast<unsigned char>(generated[static_cast<size_t>(step)]), tokens.data<int64_t>()[step])
        << "step " << step;
  }
  std::printf("  %s: the GGUF file's greedy tokens equal transformers' for %d of %lld steps\n", GetParam().name,
              compared, static_cast<long long>(max_new));
  EXPECT_GE(compared, 12);
}

INSTANTIATE_TEST_SUITE_P(Families, GgufLlamaGenerate, ::testing::ValuesIn(testing::gguf_llama_cases()),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace paraflow
