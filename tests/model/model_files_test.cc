// Model files: GPT-2 dirs saved by transformers load in paraflow and give transformers' logits;
// malformed safetensors and config files are refused with an error naming the file and problem.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>

#include "base/error.h"
#include "expect_error.h"
#include "base/file_io.h"
#include "graph/executor.h"
#include "model/gpt_graph.h"
#include "model/model_files.h"
#include "model/safetensors.h"
#include "reference_runner.h"
#include "model_configs.h"
#include "test_util.h"

namespace paraflow {
namespace {

class HfSavedModel : public ::testing::TestWithParam<const char*> {};

TEST_P(HfSavedModel, LoadsAndGivesTransformersLogits) {
  testing::TempDir dir;
  const std::vector<int32_t> tokens{5, 17, 0, 42, 42, 8, 60, 3, 11};
  const std::string token_text = fmt::format("{}", fmt::join(tokens, ","));
  ASSERT_TRUE(testing::run_oracle(
      "gpt2_hf.py",
      fmt::format("save --kind {} --config '{}' --seed 3 --dir {} --tokens {} --out {}", GetParam(),
                  R"({"vocab_size": 61, "n_positions": 32, "n_embd": 24, "n_layer": 2, "n_head": 2})",
                  (dir.path() / "hf").string(), token_text, (dir.path() / "logits.safetensors").string())));
  model::LoadedModel loaded = model::load_model_dir(dir.path() / "hf", cpu_backend());
  EXPECT_EQ(loaded.config.n_embd, 24);
  EXPECT_TRUE(loaded.parameters.mapped()) << "transformers' f32 GPT-2 file is read in place";
  model::GptGraph g = model::build_gpt_training_graph(loaded.config, 1, static_cast<int64_t>(tokens.size()));
  graph::Executor executor(g.graph, cpu_backend());
  model::bind_parameters(executor, g, loaded.parameters, nullptr);
  executor.keep(g.logits);
  std::copy(tokens.begin(), tokens.end(), executor.tensor(g.tokens).data<int32_t>());
  executor.forward();
  Tensor reference = model::SafetensorsFile::load((dir.path() / "logits.safetensors").string()).tensor("logits");
  std::vector<double> expected_f64(static_cast<size_t>(reference.numel()));
  for (size_t i = 0; i < expected_f64.size(); ++i) expected_f64[i] = reference.data<double>()[i];
  double error = testing::relative_error(testing::to_vector(executor.tensor(g.logits)), expected_f64);
  std::printf("  %s dir: logits rel err %.3e\n", GetParam(), error);
  EXPECT_LE(error, 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Kinds, HfSavedModel, ::testing::Values("model", "lmhead"));

// Expects parse() to throw InputError whose message contains every fragment.
void expect_refused(const std::string& bytes, const std::vector<std::string>& fragments) {
  try {
    model::SafetensorsFile::parse(bytes, "bad.safetensors");
    ADD_FAILURE() << "accepted a malformed file; expected: " << fragments[0];
  } catch (const InputError& e) {
    std::string message = e.what();
    for (const std::string& fragment : fragments) EXPECT_NE(message.find(fragment), std::string::npos) << message;
  }
}

std::string with_header(const std::string& header, size_t data_bytes) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((header.size() >> (8 * i)) & 0xFF);
  return out + header + std::string(data_bytes, '\0');
}

TEST(Safetensors, MalformedFilesAreRefusedWithTheProblemNamed) {
  Tensor t = Tensor::zeros({2, 3});
  std::string good = model::serialize_safetensors({{"w", t}});
  EXPECT_NO_THROW(model::SafetensorsFile::parse(good, "good.safetensors"));

  expect_refused("abc", {"bad.safetensors", "too short"});
  std::string huge_header = good;
  huge_header[0] = '\xff';
  huge_header[1] = '\xff';
  expect_refused(huge_header, {"bad.safetensors", "header length"});
  expect_refused(with_header("{not json", 0), {"header: invalid JSON at byte"});
  expect_refused(with_header(R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}})", 8),
                 {"tensor 'w'", "run past", "truncated"});
  expect_refused(with_header(R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}})", 24),
                 {"tensor 'w'", "needs 24 bytes"});
  expect_refused(with_header(R"({"w":{"dtype":"Q4","shape":[2],"data_offsets":[0,2]}})", 2), {"unsupported dtype 'Q4'"});
  expect_refused(with_header(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4), {"non-negative"});
  // Sizes past int64 (once read as -1) and a product that wraps to 0 (with no bytes to match).
  expect_refused(with_header(R"({"w":{"dtype":"F32","shape":[18446744073709551615,18446744073709551615],"data_offsets":[0,4]}})", 4),
                 {"tensor 'w'", "implausibly large"});
  expect_refused(with_header(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", 0),
                 {"tensor 'w'", "implausibly large"});
  expect_refused(with_header(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12),
                 {"overlap"});
  expect_refused(good.substr(0, good.size() - 5), {"run past"});
}

// config.json's bos/eos ids, where Hugging Face's generate() stops, are the tokenizer's
// end-of-text id (a vocabulary padded past the tokenizer's, for tensor parallelism, used to give
// an untrained padding row), or null without a tokenizer.
TEST(ModelFiles, TheExportStopsAtTheTokenizersEndOfText) {
  testing::TempDir dir;
  model::GptConfig config = testing::gpt_config(4098, 8, 4, 1, 2);
  model::ParameterSet parameters(model::gpt_tensor_specs(config), cpu_backend());
  model::save_model_dir(dir.path() / "bpe", config, parameters, 4095);
  const nlohmann::json bpe = nlohmann::json::parse(read_file(dir.path() / "bpe/config.json"));
  EXPECT_EQ(bpe["eos_token_id"], 4095);
  EXPECT_EQ(bpe["bos_token_id"], 4095);
  model::save_model_dir(dir.path() / "bytes", config, parameters);
  const nlohmann::json bytes = nlohmann::json::parse(read_file(dir.path() / "bytes/config.json"));
  EXPECT_TRUE(bytes["eos_token_id"].is_null()) << bytes;
  EXPECT_EQ(model::load_model_dir(dir.path() / "bpe", cpu_backend()).config.vocab_size, 4098);
}

TEST(ModelFiles, WrongShapeOrBadConfigNamesTheFile) {
  testing::TempDir dir;
  model::GptConfig config = testing::gpt_config(11, 8, 4, 1, 2);
  model::ParameterSet parameters(model::gpt_tensor_specs(config), cpu_backend());
  model::save_model_dir(dir.path(), config, parameters);
  EXPECT_NO_THROW(model::load_model_dir(dir.path(), cpu_backend()));

  nlohmann::json changed = config.to_hf_json();
  changed["n_embd"] = 6;  // the weights no longer fit
  write_file_atomic(dir.path() / "config.json", changed.dump());
  try {
    model::load_model_dir(dir.path(), cpu_backend());
    ADD_FAILURE() << "accepted weights of the wrong shape";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("model.safetensors"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("shape"), std::string::npos) << e.what();
  }
  write_file_atomic(dir.path() / "config.json", R"({"model_type": "gpt2", "vocab_size": "many"})");
  try {
    model::load_model_dir(dir.path(), cpu_backend());
    ADD_FAILURE() << "accepted a bad config";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("config.json"), std::string::npos) << e.what();
  }
}

// Where the file holds every tensor as f32 (a fused tensor's parts in order), the loaded
// parameters are views of its mapping, read-only; elsewhere a copy. Either way the file's values.
TEST(ModelFiles, F32FilesAreReadInPlaceOthersCopied) {
  testing::TempDir dir;
  const model::GptConfig config = testing::llama_config("llama", 40, 32, 12, 20, 2, 4, 2, 4);
  model::ParameterSet parameters(model::gpt_tensor_specs(config), cpu_backend());
  model::initialize_gpt(parameters, config, testing::test_seed());
  auto expect_loads = [&](const std::filesystem::path& at, bool mapped) {
    model::LoadedModel loaded = model::load_model_dir(at, cpu_backend());
    EXPECT_EQ(loaded.parameters.mapped(), mapped) << at;
    for (size_t i = 0; i < parameters.specs().size(); ++i) {
      EXPECT_EQ(testing::to_vector(loaded.parameters.at(i)), testing::to_vector(parameters.at(i)))
          << at << ": " << parameters.specs()[i].name;
    }
    return loaded;
  };
  // As paraflow writes it: in place, and a write is refused rather than faulting on a read-only page.
  model::save_model_dir(dir.path() / "ours", config, parameters);
  model::LoadedModel mapped = expect_loads(dir.path() / "ours", true);
  testing::expect_error<Error>([&] { mapped.parameters.write_on_host([](model::ParameterSet&) {}); },
                               {"mapped from a file", "read-only"});

  // transformers' order (names sorted): k_proj before q_proj, so the fused q/k/v projection is no
  // run of the file: a copy, of the same values.
  std::vector<std::pair<std::string, Tensor>> sorted = model::hf_tensors(parameters);
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::filesystem::create_directories(dir.path() / "sorted");
  std::filesystem::copy_file(dir.path() / "ours/config.json", dir.path() / "sorted/config.json");
  write_file_atomic(dir.path() / "sorted/model.safetensors", model::serialize_safetensors(sorted, {{"format", "pt"}}));
  expect_loads(dir.path() / "sorted", false);
}

}  // namespace
}  // namespace paraflow
