// Without tokenizer files a model's text is bytes: every byte 0-255 is its own id and decodes
// back to itself (bytes above 127 included: char is signed on x86-64); ids past 255 have none.
// With a Llama-style tokenizer.json, prompts get the BOS transformers gives them and generation
// stops at the eos_token_id list of generation_config.json (ids worked out by hand below).
#include <gtest/gtest.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/file_io.h"
#include "infer/text_codec.h"
#include "reference_runner.h"

namespace paraflow {
namespace {

TEST(TextCodec, WithoutATokenizerBytesAreIdsBothWays) {
  testing::TempDir dir;
  const infer::TextCodec codec(dir.path());
  const std::string text = "caf\xc3\xa9 \xff";
  EXPECT_EQ(codec.encode(text), (std::vector<int32_t>{'c', 'a', 'f', 0xc3, 0xa9, ' ', 0xff}));
  std::string decoded;
  for (int32_t id : codec.encode(text)) decoded += codec.decode(id);
  EXPECT_EQ(decoded, text);
  EXPECT_TRUE(codec.end_of_text().empty());
  EXPECT_EQ(codec.decode(300), "");  // a model vocabulary padded past the 256 bytes
}

// Llama 2's layout in miniature: <unk> <s> </s>, the 256 byte tokens, then "▁" a b "▁a".
void write_llama_tokenizer(const std::filesystem::path& dir) {
  using nlohmann::json;
  json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}};
  for (int b = 0; b < 256; ++b) vocab[fmt::format("<0x{:02X}>", b)] = 3 + b;
  vocab["\u2581"] = 259;
  vocab["a"] = 260;
  vocab["b"] = 261;
  vocab["\u2581a"] = 262;
  json added = json::array();
  for (int id = 0; id < 3; ++id) {
    added.push_back({{"id", id}, {"content", id == 0 ? "<unk>" : id == 1 ? "<s>" : "</s>"}, {"special", true},
                     {"normalized", false}, {"lstrip", false}, {"rstrip", false}, {"single_word", false}});
  }
  const json tokenizer = {
      {"added_tokens", added},
      {"normalizer",
       {{"type", "Sequence"},
        {"normalizers",
         {{{"type", "Prepend"}, {"prepend", "\u2581"}},
          {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}}}}}},
      {"pre_tokenizer", nullptr},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single", {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
        {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}}}}},
      {"decoder",
       {{"type", "Sequence"},
        {"decoders",
         {{{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}},
          {{"type", "ByteFallback"}},
          {{"type", "Fuse"}},
          {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}}},
      {"model",
       {{"type", "BPE"}, {"unk_token", "<unk>"}, {"fuse_unk", true}, {"byte_fallback", true}, {"vocab", vocab},
        {"merges", {"\u2581 a"}}}}};
  write_file_atomic(dir / "tokenizer.json", tokenizer.dump());
}

TEST(TextCodec, LlamaPromptsStartWithBosAndStopAtEveryEosId) {
  testing::TempDir dir;
  write_llama_tokenizer(dir.path());
  write_file_atomic(dir.path() / "generation_config.json", R"({"bos_token_id": 1, "eos_token_id": [2, 0]})");
  const infer::TextCodec codec(dir.path());
  // "a b" -> "▁a▁b" -> ▁ a ▁ b -> "▁a" ▁ b; "c" is no token: its byte's <0x63>.
  EXPECT_EQ(codec.encode("a b"), (std::vector<int32_t>{1, 262, 259, 261}));
  EXPECT_EQ(codec.encode("a b", false), (std::vector<int32_t>{262, 259, 261}));
  EXPECT_EQ(codec.encode("c"), (std::vector<int32_t>{1, 259, 3 + 0x63}));
  EXPECT_EQ(codec.decode(262), " a");  // a continuation keeps its space
  EXPECT_EQ(codec.decode(3 + 0x63), "c");
  EXPECT_EQ(codec.end_of_text(), (std::vector<int32_t>{2, 0}));
  EXPECT_TRUE(codec.is_end_of_text(2));
  EXPECT_TRUE(codec.is_end_of_text(0));
  EXPECT_FALSE(codec.is_end_of_text(1));
}

TEST(TextCodec, LlamaTokenizerConfigRebuildsTheTemplateAsTransformersDoes) {
  testing::TempDir dir;
  write_llama_tokenizer(dir.path());
  write_file_atomic(dir.path() / "tokenizer_config.json",
                    R"({"tokenizer_class": "LlamaTokenizerFast", "add_bos_token": false, "add_eos_token": true,
                        "bos_token": "<s>", "eos_token": {"content": "</s>", "special": true}})");
  write_file_atomic(dir.path() / "config.json", R"({"eos_token_id": 2})");
  const infer::TextCodec codec(dir.path());
  EXPECT_EQ(codec.encode("a b"), (std::vector<int32_t>{262, 259, 261, 2}));
  EXPECT_EQ(codec.end_of_text(), (std::vector<int32_t>{2}));
}

}  // namespace
}  // namespace paraflow
