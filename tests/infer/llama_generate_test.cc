// The Llama family's decoding against transformers' own KV-cache greedy decoding
// (tests/reference/gpt2_hf.py greedy, float64): the generator's contiguous cache in process, and
// `paraflow generate --temperature 0 --dtype float32` (the serving engine's paged cache) on the
// export, for Llama 3 (grouped k/v heads, llama3 rope scaling, an untied head) and Qwen2 (q/k/v
// biases, a tied head). Vocabulary 128 with no tokenizer: each token is one ASCII byte.
#include <gtest/gtest.h>

#include <cstdlib>

#include "base/file_io.h"
#include "infer/generator.h"
#include "train/trainer.h"
#include "trained_model.h"
#include "model/model_files.h"
#include "model/safetensors.h"
#include "model_configs.h"
#include "random_llama.h"
#include "reference_runner.h"
#include "test_util.h"

namespace paraflow {
namespace {

struct Case {
  const char* name;
  model::GptConfig config;
};

class LlamaGenerate : public ::testing::TestWithParam<Case> {};

// Decodes one random model of the case's config with the generator and with `paraflow generate`,
// checks every step before transformers' first near-tie (where float32 may rightly pick the other
// token) and bf16 weights' parting step; returns how many float32 steps were compared.
int greedy_steps_equal(const Case& model_case, uint64_t seed) {
  const model::GptConfig& config = model_case.config;
  testing::TempDir dir;
  Rng rng(seed);
  const model::ParameterSet parameters = testing::random_llama_parameters(config, rng);
  model::save_model_dir(dir.path() / "export", config, parameters);
  const std::string prompt_text = "Hello, llama";
  const std::vector<int32_t> prompt(prompt_text.begin(), prompt_text.end());
  const int64_t max_new = 24;
  std::string prompt_ids;
  for (int32_t id : prompt) prompt_ids += (prompt_ids.empty() ? "" : ",") + std::to_string(id);
  EXPECT_TRUE(testing::run_oracle("gpt2_hf.py", fmt::format("greedy --model {} --prompt {} --max-new {} --out {}",
                                                            (dir.path() / "export").string(), prompt_ids, max_new,
                                                            (dir.path() / "greedy.safetensors").string())));
  const model::SafetensorsFile expected = model::SafetensorsFile::load((dir.path() / "greedy.safetensors").string());
  const Tensor tokens = expected.tensor("tokens"), gaps = expected.tensor("gaps");

  // The generator (contiguous KV cache), in process.
  infer::Generator generator(config, parameters, cpu_backend());
  infer::Sampler greedy({.temperature = 0.0});
  const std::vector<int32_t> ours = generator.generate(prompt, max_new, greedy).tokens;
  // paraflow generate on the export (the engine's paged KV cache).
  const std::filesystem::path printed = dir.path() / "generated.txt";
  EXPECT_EQ(std::system(fmt::format("{} generate --model {} --prompt '{}' --max-tokens {} --temperature 0 "
                                    "--dtype float32 > {}",
                                    std::getenv("PARAFLOW_BINARY"), (dir.path() / "export").string(), prompt_text,
                                    max_new, printed.string())
                            .c_str()),
            0);
  const std::string text = read_file(printed);
  if (text.size() < prompt_text.size() + static_cast<size_t>(max_new) + 1) {
    ADD_FAILURE() << "generate printed " << text.size() << " bytes: " << text;
    return 0;
  }
  const std::string generated = text.substr(prompt_text.size(), text.size() - prompt_text.size() - 1);

  // Up to the first near-tie, where float32 may rightly pick the other token.
  int compared = 0;
  for (int64_t step = 0; step < max_new; ++step) {
    if (gaps.data<double>()[step] < 1e-3) break;
    const int64_t token = tokens.data<int64_t>()[step];
    EXPECT_EQ(ours[static_cast<size_t>(step)], token) << "generator, step " << step;
    EXPECT_EQ(static_cast<unsigned char>(generated[static_cast<size_t>(step)]), token) << "paraflow generate, step "
                                                                                       << step;
    ++compared;
  }
  // bfloat16 weights (and rmsnorm's bf16 rows): transformers' tokens until they part, which may
  // only happen where its top two logits are within bf16's rounding of each other.
  infer::Generator bf16(config, parameters, cpu_backend(), DType::bf16);
  infer::Sampler greedy_bf16({.temperature = 0.0});
  const std::vector<int32_t> rounded = bf16.generate(prompt, max_new, greedy_bf16).tokens;
  int agreed = 0;
  for (; agreed < max_new && rounded[static_cast<size_t>(agreed)] == tokens.data<int64_t>()[agreed]; ++agreed) {
  }
  if (agreed < max_new) {
    EXPECT_LT(gaps.data<double>()[agreed], 0.05) << "bfloat16 parted at a clear step " << agreed;
  }
  std::printf("  %s: bfloat16 weights give transformers' tokens for %d of %lld steps\n", model_case.name, agreed,
              static_cast<long long>(max_new));
  return compared;
}

TEST_P(LlamaGenerate, GreedyTokensEqualTransformers) {
  // At least 12 steps must be compared; a random model whose near-tie comes sooner is followed by
  // another, every model's compared steps checked all the same.
  int compared = 0;
  for (uint64_t model = 0; model < 3 && compared < 12; ++model) {
    compared = greedy_steps_equal(GetParam(), testing::test_seed() + model);
    std::printf("  %s, model %llu: greedy tokens equal transformers' for %d of 24 steps\n", GetParam().name,
                static_cast<unsigned long long>(model), compared);
  }
  EXPECT_GE(compared, 12);
}

// Trained by paraflow (loss falling), exported, and loaded by transformers, whose greedy
// tokens on the trained model are the generator's.
TEST(LlamaTraining, ATrainedModelDecodesAsTransformersDecodesIt) {
  testing::TempDir dir;
  model::GptConfig config = testing::llama_config("llama", 67, 48, 32, 64, 2, 4, 2, 8);
  train::TokenSource data = testing::repetitive_tokens(config.vocab_size);
  train::Trainer trainer(config, testing::short_training(dir.path() / "run", 40), data, cpu_backend());
  trainer.initialize_or_resume();
  const double first = trainer.step().loss;
  double last = first;
  for (int i = 1; i < 40; ++i) last = trainer.step().loss;
  std::printf("  llama training loss %.3f -> %.3f\n", first, last);
  EXPECT_LT(last, first - 1.0);
  trainer.export_model(dir.path() / "export");

  const std::vector<int32_t> prompt{3, 24, 38, 1, 10};
  const int64_t max_new = 20;
  ASSERT_TRUE(testing::run_oracle("gpt2_hf.py", fmt::format("greedy --model {} --prompt 3,24,38,1,10 --max-new {} --out {}",
                                                            (dir.path() / "export").string(), max_new,
                                                            (dir.path() / "greedy.safetensors").string())));
  const model::SafetensorsFile expected = model::SafetensorsFile::load((dir.path() / "greedy.safetensors").string());
  const Tensor tokens = expected.tensor("tokens"), gaps = expected.tensor("gaps");
  const model::LoadedModel loaded = model::load_model_dir(dir.path() / "export", cpu_backend());
  infer::Generator generator(loaded.config, loaded.parameters, cpu_backend());
  infer::Sampler greedy({.temperature = 0.0});
  const std::vector<int32_t> ours = generator.generate(prompt, max_new, greedy).tokens;
  int compared = 0;
  for (int64_t step = 0; step < max_new && gaps.data<double>()[step] >= 1e-3; ++step, ++compared) {
    EXPECT_EQ(ours[static_cast<size_t>(step)], tokens.data<int64_t>()[step]) << "step " << step;
  }
  std::printf("  trained llama: greedy tokens equal transformers' for %d of %lld steps\n", compared,
              static_cast<long long>(max_new));
  EXPECT_GE(compared, 10);
}

// The command line end to end: `paraflow train` on a YAML with model.architecture llama (byte
// text), then `paraflow generate` on its export prints transformers' greedy continuation.
TEST(LlamaTraining, TrainAndGenerateCommandsAgreeWithTransformers) {
  testing::TempDir dir;
  const std::vector<std::string> words{"the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran"};
  Rng rng(7);
  std::string corpus;
  for (int i = 0; i < 20000; ++i) corpus += words[rng.below(words.size())] + " ";
  write_file_atomic(dir.path() / "corpus.txt", corpus);
  write_file_atomic(dir.path() / "run.yaml",
                    fmt::format("model: {{architecture: llama, vocab_size: 256, n_positions: 64, n_embd: 32, n_layer: 2,\n"
                                "        n_head: 4, n_kv_head: 2, head_dim: 8, intermediate_size: 64, rope_theta: 500000,\n"
                                "        tie_word_embeddings: false}}\n"
                                "data: {{train: {}, format: text}}\n"
                                "train: {{batch_size: 8, sequence_length: 32, steps: 60, lr: 3e-3, out_dir: {}, "
                                "eval_every: 0}}\n",
                                (dir.path() / "corpus.txt").string(), (dir.path() / "run").string()));
  const std::string paraflow = std::getenv("PARAFLOW_BINARY");
  ASSERT_EQ(std::system(fmt::format("{} train --config {} > {} 2>&1", paraflow, (dir.path() / "run.yaml").string(),
                                    (dir.path() / "train.log").string())
                            .c_str()),
            0)
      << read_file(dir.path() / "train.log");
  const std::filesystem::path exported = dir.path() / "run" / "export";
  const std::string prompt = "the cat ";
  const int64_t max_new = 24;
  ASSERT_EQ(std::system(fmt::format("{} generate --model {} --prompt '{}' --max-tokens {} --temperature 0 --dtype float32 "
                                    "> {} 2>/dev/null",
                                    paraflow, exported.string(), prompt, max_new, (dir.path() / "out.txt").string())
                            .c_str()),
            0);
  std::string prompt_ids;
  for (unsigned char c : prompt) prompt_ids += (prompt_ids.empty() ? "" : ",") + std::to_string(c);
  ASSERT_TRUE(testing::run_oracle("gpt2_hf.py", fmt::format("greedy --model {} --prompt {} --max-new {} --out {}",
                                                            exported.string(), prompt_ids, max_new,
                                                            (dir.path() / "greedy.safetensors").string())));
  const model::SafetensorsFile greedy = model::SafetensorsFile::load((dir.path() / "greedy.safetensors").string());
  const Tensor tokens = greedy.tensor("tokens"), gaps = greedy.tensor("gaps");
  // The printed text up to the first near-tie, where float32 may rightly pick the other token.
  std::string expected = prompt;
  for (int64_t i = 0; i < max_new && gaps.data<double>()[i] >= 1e-3; ++i) {
    expected += static_cast<char>(tokens.data<int64_t>()[i]);
  }
  std::printf("  paraflow generate printed %s\n", read_file(dir.path() / "out.txt").c_str());
  EXPECT_GE(expected.size(), prompt.size() + 12);
  EXPECT_EQ(read_file(dir.path() / "out.txt").substr(0, expected.size()), expected);
}

model::GptConfig llama3() {
  model::GptConfig config = testing::llama_config("llama", 128, 64, 32, 48, 2, 4, 2, 12);
  config.rope = {.theta = 500000, .scaling = RopeScaling::llama3, .factor = 8, .low_freq_factor = 1,
                 .high_freq_factor = 4, .original_max_position = 16};
  return config;
}

model::GptConfig qwen2() {
  model::GptConfig config = testing::llama_config("qwen2", 128, 64, 24, 40, 2, 6, 3, 8);
  config.tie_word_embeddings = true;
  return config;
}

INSTANTIATE_TEST_SUITE_P(Models, LlamaGenerate, ::testing::Values(Case{"llama3", llama3()}, Case{"qwen2", qwen2()}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace paraflow
