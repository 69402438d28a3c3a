// Tokenizers from GGUF metadata against Hugging Face tokenizers: a Qwen2-style byte-level BPE and a
// Llama 2-style SentencePiece BPE (byte fallback), trained by tests/reference/tokenizer_family_oracle.py
// with the tokenizers library, written as llama.cpp's converter writes tokenizer.ggml.*
// (tests/reference/gguf_llama.py vocab: tokens, token types, merges or SentencePiece scores, BOS /
// EOS ids, add_bos / add_eos), read back by us: the ids of the test texts
// (tests/data/tokenizer_test_texts.h) equal the tokenizers library's on the original
// tokenizer.json, and with the template ids transformers' tokenizer(text) on the original dir.
// The keys we write from a tokenizer read back to the same ids too, `paraflow quantize` writes the
// converter's keys, and the end-of-text and chat template come from the file. Unknown tokenizer models and split patterns are refused by name.
#include <gtest/gtest.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>

#include "base/error.h"
#include "base/file_io.h"
#include "data/tokenizer_test_texts.h"
#include "gguf_llama_cases.h"
#include "infer/gguf_tokenizer.h"
#include "infer/text_codec.h"
#include "model/model_files.h"
#include "random_llama.h"

namespace paraflow::infer {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// The family's tokenizer trained by the oracle into `dir`, its ids of `texts` by the tokenizers library.
json build_and_encode(const std::string& family, const fs::path& dir, const std::vector<std::string>& texts) {
  const fs::path python = testing::source_dir() / ".venv-data/bin/python";
  const fs::path oracle = testing::source_dir() / "tests/reference/tokenizer_family_oracle.py";
  std::string train;
  for (const char* name : {"GPL-2", "Apache-2.0"}) train += fmt::format(" /usr/share/common-licenses/{}", name);
  std::string mix;
  for (const std::string& text : data::testing_texts::make_texts(testing::test_seed() + 7)) mix += text + "\n\n";
  write_file_atomic(dir / "mix.txt", mix);
  const std::string build = fmt::format("{} {} build --family {} --vocab-size 2000 --out {} --train{} {}", python.string(),
                                        oracle.string(), family, dir.string(), train, (dir / "mix.txt").string());
  EXPECT_EQ(std::system(build.c_str()), 0) << build;
  write_file_atomic(dir / "texts.json", json(texts).dump());
  const std::string encode = fmt::format("{} {} encode --dir {} --texts {} --out {}", python.string(), oracle.string(),
                                         dir.string(), (dir / "texts.json").string(), (dir / "ids.json").string());
  EXPECT_EQ(std::system(encode.c_str()), 0) << encode;
  return json::parse(read_file(dir / "ids.json"));
}

// How many texts `codec` encodes other than `expected` (the first few reported).
int differences(const std::string& what, const TextCodec& codec, const std::vector<std::string>& texts,
                const json& expected, bool template_ids) {
  int differ = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    const std::vector<int32_t> ours = codec.encode(texts[i], template_ids);
    const std::vector<int32_t> theirs = expected[i].get<std::vector<int32_t>>();
    if (ours != theirs && ++differ <= 3) {
      ADD_FAILURE() << what << ": text " << i << " " << json(texts[i]).dump().substr(0, 200) << "\n ours:   "
                    << json(ours).dump().substr(0, 300) << "\n theirs: " << json(theirs).dump().substr(0, 300);
    }
  }
  std::printf("  %s: %zu texts, %d differ\n", what.c_str(), texts.size(), differ);
  return differ;
}

class GgufTokenizer : public ::testing::TestWithParam<const char*> {};

TEST_P(GgufTokenizer, IdsEqualTheTokenizersLibrarys) {
  const std::string family = GetParam();
  testing::TempDir dir;
  const std::vector<std::string> texts = data::testing_texts::make_texts(testing::test_seed());
  const json expected = build_and_encode(family, dir.path(), texts);
  ASSERT_TRUE(expected.is_object());
  if (family == "qwen2") write_file_atomic(dir.path() / "gguf_pre.txt", "qwen2\n");
  // A ChatML template in tokenizer_config.json, which the converter carries into tokenizer.chat_template.
  json tokenizer_config = json::parse(read_file(dir.path() / "tokenizer_config.json"));
  tokenizer_config["chat_template"] =
      "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
      "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}{{ eos_token }}";
  write_file_atomic(dir.path() / "tokenizer_config.json", tokenizer_config.dump());
  const fs::path converted = dir.path() / "converted.gguf";
  ASSERT_EQ(testing::gguf_llama_oracle(fmt::format("vocab {} {}", dir.path().string(), converted.string())), 0);
  const model::GgufFile file = model::GgufFile::open(converted);
  const TextCodec from_converter(file);
  EXPECT_EQ(differences(family + " ids", from_converter, texts, expected["ids"], false), 0);
  // With the template: transformers' tokenizer(text) (Llama 2's tokenizer_config.json here asks
  // for EOS too, which the converter carries into add_eos_token).
  EXPECT_EQ(differences(family + " ids with template", from_converter, texts, expected["transformers"], true), 0);
  // The end of text is the file's EOS (tokenizer_config.json's eos_token).
  const std::string eos = family == "qwen2" ? "<|endoftext|>" : "</s>";
  EXPECT_EQ(from_converter.end_of_text(), std::vector<int32_t>{*from_converter.special_token(eos)});

  // The file's chat template renders as the dir's, its eos_token the file's EOS token.
  const std::optional<ChatTemplate> from_file = gguf_chat_template(file), from_dir = ChatTemplate::load(dir.path());
  ASSERT_TRUE(from_file && from_dir);
  const nlohmann::ordered_json messages = {{{"role", "user"}, {"content", "Hi there"}}};
  EXPECT_EQ(from_file->render(messages, true), from_dir->render(messages, true));
  EXPECT_NE(from_file->render(messages, true).find(eos), std::string::npos);

  // What we write from the tokenizer.json reads back to the same ids.
  const data::Tokenizer original = data::Tokenizer::load(dir.path());
  const fs::path ours = dir.path() / "ours.gguf";
  model::write_gguf(ours, gguf_vocabulary_metadata(original.gguf_vocabulary()), {});
  const TextCodec from_ours(model::GgufFile::open(ours));
  EXPECT_EQ(differences(family + " ids (our keys)", from_ours, texts, expected["ids"], false), 0);
  EXPECT_EQ(differences(family + " ids with template (our keys)", from_ours, texts, expected["transformers"], true), 0);

  // `paraflow quantize` on a model dir with this tokenizer writes the converter's tokenizer keys
  // (and chat template) with the model's: gguf-py's reader finds every key the converter writes,
  // with the same values. Qwen2's embedding has more rows than tokens (Qwen2.5's 151936 for
  // 151646): the converter pads the tokens with unused ones, and so must we.
  const int64_t rows = original.vocab_size() + (family == "qwen2" ? 5 : 0);
  model::GptConfig config = testing::llama_config(family == "qwen2" ? "qwen2" : "llama", rows, 64, 32, 64, 1, 4, 2, 8);
  Rng rng(testing::test_seed());
  model::save_model_dir(dir.path(), config, testing::random_llama_parameters(config, rng), *from_converter.special_token(eos));
  const fs::path quantized = dir.path() / "quantized.gguf";
  const std::string quantize = fmt::format("{} quantize --model {} --type q8_0 --out {}", std::getenv("PARAFLOW_BINARY"),
                                           dir.path().string(), quantized.string());
  ASSERT_EQ(std::system(quantize.c_str()), 0) << quantize;
  EXPECT_EQ(testing::gguf_llama_oracle(fmt::format("read {} {} q8_0", quantized.string(), dir.path().string())), 0);
}

INSTANTIATE_TEST_SUITE_P(Families, GgufTokenizer, ::testing::Values("qwen2", "llama2"));

TEST(GgufTokenizerKeys, RefusedNamingTheKey) {
  data::GgufVocabulary vocabulary;
  for (int byte = 0; byte < 256; ++byte) vocabulary.tokens.push_back(data::byte_to_unicode_utf8(static_cast<unsigned char>(byte)));
  vocabulary.model = "bert";
  auto refused = [&](const std::string& named) {
    try {
      data::Tokenizer::from_gguf(vocabulary, "model.gguf");
      ADD_FAILURE() << "accepted; expected an error naming " << named;
    } catch (const InputError& error) {
      EXPECT_NE(std::string(error.what()).find(named), std::string::npos) << error.what();
    }
  };
  refused("tokenizer.ggml.model 'bert'");
  vocabulary.model = "gpt2";
  vocabulary.pre = "deepseek-llm";
  refused("tokenizer.ggml.pre 'deepseek-llm'");
  vocabulary.pre = "gpt-2";
  vocabulary.token_types = {1, 1};
  refused("tokenizer.ggml.token_type has 2 entries for 256 tokens");
  vocabulary.token_types.clear();
  vocabulary.add_bos = true;
  refused("tokenizer.ggml.bos_token_id -1");
  vocabulary.add_bos.reset();
  vocabulary.model = "llama";
  refused("tokenizer.ggml.tokens has no byte token <0x00>");
}

}  // namespace
}  // namespace paraflow::infer
