// Interop for the Llama family's tokenizers: ids and decoded text equal Hugging Face tokenizers'
// on tokenizer.json files built by tests/reference/tokenizer_family_oracle.py (in .venv-data)
// with the exact components of Llama 3's, Qwen2's, Llama 2's and Mistral's files, on a BPE
// trained there from licence texts every Debian machine has (/usr/share/common-licenses, from
// base-files) and our text fragments. The texts compared are held out: GPL-3 (not trained on),
// random mixes of the fragments, and hard cases. With the family's tokenizer_config.json, prompt
// ids also equal transformers' AutoTokenizer's. Missing oracle: the test fails.
#include <gtest/gtest.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <random>

#include "base/error.h"
#include "base/file_io.h"
#include "data/tokenizer.h"
#include "expect_error.h"
#include "reference_runner.h"
#include "test_util.h"
#include "tokenizer_test_texts.h"

namespace paraflow::data {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const fs::path kLicenses = "/usr/share/common-licenses";

// Cases where the families differ from GPT-2 and from each other.
const std::vector<std::string>& hard_cases() {
  static const std::vector<std::string> cases = {
      "", " ", "  ", "\t", "\n", "hello", " hello", "  hello", "hello ", "hello  world", "a\tb\t\tc",
      // contractions, any case (Llama 3 and Qwen2 match them case-insensitively)
      "It's I'M we'Ll THEY'VE you'Re he'D 'S 's 'st x'sy ''s '", "'\u017F 'K 'ſt",
      // digit runs (Llama 3: up to 3, Qwen2: 1), other digits
      "1", "12", "123", "1234", "1234567890", " 2024-12-04", "3.14159", "٣٤٥٦٧", "①②③", "Ⅻ", "x²³",
      // punctuation before letters, and before line breaks
      "...hello", "'hello", "(x)", "!!!\n\n", "?!\r\n\r\nx", "--\n  y", "$$$\n", "\"quoted\"",
      // whitespace runs and line breaks
      "a\n\n\nb", "a \n \n b", "  \n  ", "\r\n", "\r\r\n\n", "x  \t  y", "end   ", "\u3000x\u3000", "\u00A0\u00A0y",
      // CJK, emoji, other scripts, combining marks (NFC for Qwen2), Hangul jamo
      "日本語のテキスト", "中文，标点。", "한국어", "\u1100\u1161\u11A8", "e\u0301 caf\u00E9 cafe\u0301",
      "\u212B \u2126 A\u030A", "\u0915\u093C \u0958", "a\u0328\u0301 a\u0301\u0328", "😀👍🏽👨‍👩‍👧‍👦🇺🇸",
      "\U0001D518\U0001D52B\U0001D526", "\U0010FFFD\U000E0001", "\x01\x7F\x1B[0m",
      // SentencePiece's own space character typed in text
      "\u2581", "a\u2581b", "\u2581\u2581x ",
      // added tokens in text, with and without spaces around them
      "<|begin_of_text|>Hello<|eot_id|>", "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
      "x <|lstrip|> y", "x<|rstrip|>   y", "  <|lstrip|>", "<|rstrip|>\n\n", "<|begin_of_text|",
      "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\n", "<tool_call>{\"a\": 1}</tool_call>",
      "<|endoftext|>", "<s>Hello</s>", "<s> Hello</s> <s>", "</s><s>", "<unk>", "a<unk>b", "<s",
  };
  return cases;
}

std::vector<std::string> held_out_texts(uint64_t seed) {
  std::vector<std::string> texts = hard_cases();
  std::string gpl3 = read_file(kLicenses / "GPL-3");
  for (size_t pos = 0; pos < gpl3.size();) {
    size_t end = gpl3.find("\n\n", pos);
    if (end == std::string::npos) end = gpl3.size();
    texts.push_back(gpl3.substr(pos, end - pos));
    pos = end + 2;
  }
  texts.push_back(gpl3);
  std::vector<std::string> mixed = testing_texts::make_texts(seed);
  texts.insert(texts.end(), mixed.begin(), mixed.end());
  return texts;
}

// Trains the family's tokenizer with the oracle; returns its directory (empty on failure).
fs::path build(const std::string& family, const fs::path& dir, uint64_t seed) {
  fs::path python = testing::source_dir() / ".venv-data/bin/python";
  fs::path oracle = testing::source_dir() / "tests/reference/tokenizer_family_oracle.py";
  if (!fs::exists(python) || !fs::exists(oracle)) {
    ADD_FAILURE() << "oracle not found: need " << python << " and " << oracle << " (run scripts/setup_python_data.sh)";
    return {};
  }
  // Training text: licences other than GPL-3, and a mix of the fragments (so CJK, emoji and the
  // like are in the vocabulary, some of them only in part).
  std::mt19937_64 rng(seed);
  std::string mix;
  const auto& fragments = testing_texts::fragments();
  for (int d = 0; d < 200; ++d) {
    for (int k = 0; k < 100; ++k) mix += fragments[rng() % fragments.size()] + (rng() % 2 ? " " : "");
    mix += "\n\n";
  }
  write_file_atomic(dir / "fragments.txt", mix);
  std::string train;
  for (const char* name : {"GPL-2", "Apache-2.0", "LGPL-2.1", "MPL-2.0"}) train += fmt::format(" {}", (kLicenses / name).string());
  const std::string command = fmt::format("{} {} build --family {} --vocab-size 2000 --out {} --train{} {}", python.string(),
                                          oracle.string(), family, dir.string(), train, (dir / "fragments.txt").string());
  int status = std::system(command.c_str());
  if (status != 0) {
    ADD_FAILURE() << "oracle failed (" << status << "): " << command;
    return {};
  }
  return dir;
}

json encode_with_oracle(const fs::path& dir, const std::vector<std::string>& texts) {
  write_file_atomic(dir / "texts.json", json(texts).dump());
  const std::string command =
      fmt::format("{} {} encode --dir {} --texts {} --out {}", (testing::source_dir() / ".venv-data/bin/python").string(),
                  (testing::source_dir() / "tests/reference/tokenizer_family_oracle.py").string(), dir.string(),
                  (dir / "texts.json").string(), (dir / "oracle.json").string());
  int status = std::system(command.c_str());
  if (status != 0) {
    ADD_FAILURE() << "oracle failed (" << status << "): " << command;
    return json();
  }
  json result = json::parse(read_file(dir / "oracle.json"));
  std::printf("oracle versions: %s\n", result["versions"].dump().c_str());
  return result;
}

std::string shown(const std::string& s) {
  std::string e = json(s).dump();
  return e.size() > 300 ? e.substr(0, 300) + "..." : e;
}

// Counts and reports (the first few) texts where ours differs from theirs.
template <typename Ours, typename Theirs>
int count_differences(const std::string& what, const std::vector<std::string>& texts, Ours ours, Theirs theirs) {
  int differ = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    auto a = ours(i);
    auto b = theirs(i);
    if (a != b && ++differ <= 5) {
      ADD_FAILURE() << what << " differs on text " << i << " " << shown(texts[i]) << "\n ours:   "
                    << json(a).dump().substr(0, 500) << "\n theirs: " << json(b).dump().substr(0, 500);
    }
  }
  std::printf("%-14s %zu texts: %d differ\n", what.c_str(), texts.size(), differ);
  return differ;
}

void compare_family(const std::string& family) {
  testing::TempDir temp;
  const uint64_t seed = testing::test_seed();
  fs::path dir = build(family, temp.path(), seed);
  ASSERT_FALSE(dir.empty());
  // tokenizer.json alone, as tokenizers reads it; the directory, as transformers reads it.
  Tokenizer tok = Tokenizer::load_tokenizer_json(dir / "tokenizer.json");
  Tokenizer with_config = Tokenizer::load(dir);
  std::vector<std::string> texts = held_out_texts(seed + 1);
  json oracle = encode_with_oracle(dir, texts);
  ASSERT_TRUE(oracle.is_object());
  auto theirs = [&](const char* key) {
    return [&oracle, key](size_t i) { return oracle[key][i].get<std::vector<TokenId>>(); };
  };
  auto their_text = [&](const char* key) {
    return [&oracle, key](size_t i) { return oracle[key][i].get<std::string>(); };
  };
  auto ids = [&](size_t i) { return oracle["ids"][i].get<std::vector<TokenId>>(); };
  auto ids_template = [&](size_t i) { return oracle["ids_template"][i].get<std::vector<TokenId>>(); };
  EXPECT_EQ(count_differences("ids", texts, [&](size_t i) { return tok.encode(texts[i]); }, theirs("ids")), 0);
  EXPECT_EQ(count_differences("ids+template", texts, [&](size_t i) { return tok.encode_with_template(texts[i]); },
                              theirs("ids_template")),
            0);
  EXPECT_EQ(count_differences("decoded", texts, [&](size_t i) { return tok.decode(ids(i)); }, their_text("decoded")), 0);
  EXPECT_EQ(count_differences("decoded skip", texts, [&](size_t i) { return tok.decode(ids_template(i), true); },
                              their_text("decoded_skip")),
            0);
  EXPECT_EQ(count_differences("decoded keep", texts, [&](size_t i) { return tok.decode(ids_template(i), false); },
                              their_text("decoded_keep")),
            0);
  // transformers' tokenizer(text) for generation: its class's own template (LlamaTokenizerFast's
  // from tokenizer_config.json) around the ids.
  EXPECT_EQ(count_differences("transformers", texts,
                              [&](size_t i) { return with_config.encode_with_template(texts[i]); },
                              theirs("transformers")),
            0);
  // The whole held-out set in one text through the parallel encoder: the same ids.
  std::string all;
  for (const std::string& t : texts) all += t;
  EXPECT_EQ(tok.encode_parallel(all, 4), tok.encode(all));
}

// What the SentencePiece-style and split-pattern readers do not implement is refused naming the
// file, the JSON field and its value (GPT-2-style refusals: tokenizer_test.cc).
TEST(TokenizerFamily, RefusesWhatItDoesNotImplement) {
  testing::TempDir temp;
  for (const std::string family : {"mistral", "llama3"}) {
    fs::path dir = temp.path() / family;
    fs::create_directories(dir);
    ASSERT_FALSE(build(family, dir, testing::test_seed()).empty());
    const json full = json::parse(read_file(dir / "tokenizer.json"));
    const fs::path t = dir / "changed.json";
    auto refused = [&](const std::string& pointer, const json& value, std::vector<std::string> says) {
      json changed = full;
      changed[json::json_pointer(pointer)] = value;
      write_file_atomic(t, changed.dump());
      says.insert(says.begin(), t.string());
      testing::expect_error<InputError>([&] { Tokenizer::load_tokenizer_json(t); }, says);
    };
    if (family == "mistral") {
      refused("/pre_tokenizer/split", true, {"pre_tokenizer.split = true is not supported"});
      refused("/pre_tokenizer/prepend_scheme", "sometimes", {"pre_tokenizer.prepend_scheme = \"sometimes\""});
      refused("/pre_tokenizer/replacement", "_", {"pre_tokenizer.replacement = \"_\""});
      refused("/decoder/decoders/3", {{"type", "Strip"}, {"content", " "}, {"start", 2}, {"stop", 0}},
              {"decoder.decoders[3]", "expected Strip"});
      refused("/decoder/decoders/1", {{"type", "CTC"}}, {"decoder.decoders[1] = {\"type\":\"CTC\"}"});
      refused("/added_tokens/1/normalized", true, {"added_tokens[1].normalized = true", "\"<s>\""});
      refused("/model/unk_token", "<nothing>", {"model.unk_token \"<nothing>\" is not in the vocabulary"});
      refused("/normalizer", {{"type", "NFKC"}}, {"normalizer = {\"type\":\"NFKC\"}"});
      refused("/model/type", "Unigram", {"model.type = \"Unigram\" is not supported"});
      refused("/post_processor/single/0", {{"Sequence", {{"id", "B"}, {"type_id", 0}}}},
              {"post_processor.single[0]", "expected one Sequence A"});
    } else {
      refused("/pre_tokenizer/pretokenizers/0/behavior", "Removed", {"pretokenizers[0].behavior = \"Removed\""});
      refused("/pre_tokenizer/pretokenizers/1/use_regex", true, {"pretokenizers[1].use_regex = true"});
      refused("/model/continuing_subword_prefix", "##", {"model.continuing_subword_prefix = \"##\""});
      refused("/normalizer", {{"type", "Lowercase"}}, {"normalizer = {\"type\":\"Lowercase\"}"});
      refused("/added_tokens/0/single_word", true, {"added_tokens[0].single_word = true", "<|begin_of_text|>"});
      refused("/post_processor/processors/1/type", "RobertaProcessing", {"post_processor.processors[1]"});
    }
  }
}

TEST(TokenizerFamily, Llama3MatchesTokenizers) { compare_family("llama3"); }
TEST(TokenizerFamily, Qwen2MatchesTokenizers) { compare_family("qwen2"); }
TEST(TokenizerFamily, Llama2MatchesTokenizers) { compare_family("llama2"); }
TEST(TokenizerFamily, MistralMatchesTokenizers) { compare_family("mistral"); }

}  // namespace
}  // namespace paraflow::data
