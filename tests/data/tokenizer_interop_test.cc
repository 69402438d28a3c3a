// Interop: our ids must equal tiktoken's, tokenizers' and transformers' (fast and slow GPT-2
// tokenizers) on the same vocabulary, for a vocabulary trained here and for GPT-2's. The oracle
// is tests/reference/tokenizer_oracle.py in .venv-data (scripts/setup_python_data.sh), which also
// holds GPT-2's ranks (.venv-data/assets/gpt2.tiktoken, from openai-whisper's PyPI sdist).
// Missing oracle or vocabulary: the test fails.
#include <gtest/gtest.h>

#include "reference_runner.h"
#include "tokenizer_test_texts.h"

#include "test_util.h"
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <random>

#include "base/file_io.h"
#include "data/tokenizer.h"
#include "data/tokenizer_pretokenize.h"
#include "data/tokenizer_train.h"

namespace paraflow::data {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

uint64_t seed() { return testing::test_seed(); }

using testing::source_dir;
using testing_texts::fragments;
using testing_texts::make_texts;

// Runs the oracle on DIR and returns {"ids": {library: [[ids]...]}, "pieces": [[...]...]}.
json run_oracle(const fs::path& dir, const std::vector<std::string>& texts, const std::string& extra) {
  fs::path root = source_dir();
  fs::path python = root / ".venv-data/bin/python";
  fs::path oracle = root / "tests/reference/tokenizer_oracle.py";
  if (root.empty() || !fs::exists(python) || !fs::exists(oracle)) {
    ADD_FAILURE() << "oracle not found: PARAFLOW_SOURCE_DIR=" << root << ", need " << python << " and " << oracle
                  << " (run scripts/setup_python_data.sh)";
    return json();
  }
  fs::path in = dir / "texts.json", out = dir / "oracle.json";
  write_file_atomic(in, json(texts).dump());
  std::string command = python.string() + " " + oracle.string() + " --dir " + dir.string() + " --texts " +
                        in.string() + " --out " + out.string() + " " + extra;
  int status = std::system(command.c_str());
  if (status != 0) {
    ADD_FAILURE() << "oracle failed (" << status << "): " << command;
    return json();
  }
  json result = json::parse(read_file(out));
  std::printf("oracle versions: %s\n", result["versions"].dump().c_str());
  return result;
}

std::string escaped(const std::string& s) {
  std::string e = json(s).dump();
  return e.size() > 300 ? e.substr(0, 300) + "..." : e;
}

void compare(const Tokenizer& tok, const fs::path& dir, const std::vector<std::string>& texts,
             const std::string& extra) {
  json result = run_oracle(dir, texts, extra);
  ASSERT_TRUE(result.is_object()) << "no oracle output";
  // Pre-tokenisation alone (tokenizers' Oniguruma), where a difference would be hidden from ids
  // when no merge spans the boundary.
  const json& pieces = result["pieces"];
  ASSERT_EQ(pieces.size(), texts.size());
  int split_mismatches = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    std::vector<std::string> ours;
    gpt2_split(texts[i], [&](std::string_view p) { ours.emplace_back(p); });
    auto theirs = pieces[i].get<std::vector<std::string>>();
    if (ours != theirs && ++split_mismatches <= 5) {
      ADD_FAILURE() << "pre-tokenisation differs on text " << i << " " << escaped(texts[i]) << "\n ours:   "
                    << escaped(json(ours).dump()) << "\n theirs: " << escaped(json(theirs).dump());
    }
  }
  EXPECT_EQ(split_mismatches, 0);
  const json& libs = result["ids"];
  for (const char* name : {"tiktoken", "tokenizers_json", "tokenizers_files", "transformers_fast", "transformers_fast_files",
                           "transformers_slow"}) {
    ASSERT_TRUE(libs.contains(name)) << name << " missing from the oracle's output";
    const json& all = libs[name];
    ASSERT_EQ(all.size(), texts.size());
    int mismatches = 0;
    for (size_t i = 0; i < texts.size(); ++i) {
      std::vector<TokenId> ours = tok.encode(texts[i]);
      auto theirs = all[i].get<std::vector<TokenId>>();
      if (ours != theirs && ++mismatches <= 5) {
        ADD_FAILURE() << name << " differs on text " << i << " " << escaped(texts[i]) << "\n ours:   "
                      << json(ours).dump().substr(0, 400) << "\n theirs: " << json(theirs).dump().substr(0, 400);
      }
    }
    EXPECT_EQ(mismatches, 0) << name << ": " << mismatches << " of " << texts.size() << " texts differ";
    std::printf("%-18s %zu texts: %d differ\n", name, texts.size(), mismatches);
  }
}

fs::path temp_dir(const std::string& name) {
  fs::path dir = fs::temp_directory_path() / ("paraflow_tok_interop_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

TEST(TokenizerInterop, TrainedVocabularyMatchesTiktokenAndHuggingFace) {
  std::vector<std::string> texts = make_texts(seed());
  // Train on a different mix of the same fragments (so both frequent and rare pieces occur).
  std::mt19937_64 rng(seed() + 17);
  std::vector<std::string> corpus;
  for (int d = 0; d < 300; ++d) {
    std::string doc;
    for (int k = 0; k < 300; ++k) doc += fragments()[rng() % fragments().size()] + (rng() % 2 ? " " : "");
    corpus.push_back(doc);
  }
  std::vector<std::string_view> views(corpus.begin(), corpus.end());
  BpeTrainOptions options;
  options.vocab_size = 3000;
  BpeTrainer trainer(options);
  trainer.add_texts(views);
  Tokenizer tok = trainer.train();
  std::printf("trained %d tokens (%zu merges)\n", tok.vocab_size(), tok.merges().size());
  fs::path dir = temp_dir("trained");
  tok.save(dir);
  compare(tok, dir, texts, "");
  if (!HasFailure()) fs::remove_all(dir);
}

// A special token added by Hugging Face after training (add_special_tokens: a pad token) is not
// in model.vocab: it takes the next id, and text holding it encodes to that id as tokenizers does.
TEST(TokenizerInterop, AnAddedSpecialTokenTakesTheNextIdAsInHuggingFace) {
  BpeTrainOptions options;
  options.vocab_size = 400;
  BpeTrainer trainer(options);
  const std::string corpus = "the quick brown fox jumps over the lazy dog. <|endoftext|> pack my box with jugs ";
  std::vector<std::string_view> views(20, corpus);
  trainer.add_texts(views);
  Tokenizer tok = trainer.train();
  fs::path dir = temp_dir("added");
  tok.save(dir);
  const std::vector<std::string> texts = {"<|pad|>", "the fox<|pad|><|pad|> jumps", "no pad here <|endoftext|>",
                                          "a<|pad|>b<|endoftext|><|pad|>"};
  json result = run_oracle(dir, texts, "--add-special '<|pad|>' --skip tiktoken --skip tokenizers_files "
                                      "--skip transformers_fast --skip transformers_fast_files --skip transformers_slow");
  ASSERT_TRUE(result.is_object()) << "no oracle output";
  const Tokenizer added = Tokenizer::load_tokenizer_json(dir / "added" / "tokenizer.json");
  EXPECT_EQ(added.vocab_size(), tok.vocab_size() + 1);
  EXPECT_EQ(added.encode("<|pad|>"), (std::vector<TokenId>{tok.vocab_size()}));
  for (size_t i = 0; i < texts.size(); ++i) {
    EXPECT_EQ(added.encode(texts[i]), result["ids"]["tokenizers_added"][i].get<std::vector<TokenId>>()) << texts[i];
  }
  // Saved and loaded again, the token stays.
  added.save(dir / "again");
  EXPECT_EQ(Tokenizer::load(dir / "again").encode("<|pad|>"), (std::vector<TokenId>{tok.vocab_size()}));
  if (!HasFailure()) fs::remove_all(dir);
}

TEST(TokenizerInterop, Gpt2VocabularyMatchesTiktokenAndHuggingFace) {
  fs::path ranks = source_dir() / ".venv-data/assets/gpt2.tiktoken";
  ASSERT_TRUE(fs::exists(ranks)) << ranks << " missing: run scripts/setup_python_data.sh";
  Tokenizer tok = Tokenizer::load_tiktoken(ranks);
  ASSERT_EQ(tok.vocab_size(), 50257);
  ASSERT_EQ(tok.merges().size(), 50000u);
  ASSERT_EQ(tok.eot_id(), 50256);
  // Well-known GPT-2 ids.
  EXPECT_EQ(tok.encode("Hello world"), (std::vector<TokenId>{15496, 995}));
  EXPECT_EQ(tok.encode("<|endoftext|>"), (std::vector<TokenId>{50256}));
  fs::path dir = temp_dir("gpt2");
  tok.save(dir);
  // Our files load back to the same tokenizer.
  EXPECT_EQ(Tokenizer::load(dir).fingerprint(), tok.fingerprint());
  EXPECT_EQ(Tokenizer::load_vocab_merges(dir / "vocab.json", dir / "merges.txt").fingerprint(), tok.fingerprint());
  compare(tok, dir, make_texts(seed() + 1), "--tiktoken-file " + ranks.string());
  if (!HasFailure()) fs::remove_all(dir);
}

}  // namespace
}  // namespace paraflow::data
