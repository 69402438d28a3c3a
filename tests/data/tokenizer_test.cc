// Tokenizer unit tests: GPT-2 pre-tokenisation cases, the fast BPE against the reference one,
// round trips of arbitrary bytes, special tokens, training, files and their errors.
#include <gtest/gtest.h>

#include "test_util.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "base/error.h"
#include "base/file_io.h"
#include "data/tokenizer.h"
#include "data/tokenizer_pretokenize.h"
#include "data/tokenizer_train.h"

namespace paraflow::data {
namespace {

namespace fs = std::filesystem;

uint64_t seed() { return testing::test_seed(); }

std::vector<std::string> split(std::string_view text) {
  std::vector<std::string> pieces;
  gpt2_split(text, [&](std::string_view p) { pieces.emplace_back(p); });
  return pieces;
}

using Pieces = std::vector<std::string>;

TEST(Pretokenize, Gpt2Cases) {
  EXPECT_EQ(split("Hello world"), (Pieces{"Hello", " world"}));
  EXPECT_EQ(split("don't we'll I'M"), (Pieces{"don", "'t", " we", "'ll", " I", "'", "M"}));
  EXPECT_EQ(split("a   b"), (Pieces{"a", "  ", " b"}));
  EXPECT_EQ(split("a   "), (Pieces{"a", "   "}));
  EXPECT_EQ(split("x\n\ny"), (Pieces{"x", "\n", "\n", "y"}));
  EXPECT_EQ(split("x \n y"), (Pieces{"x", " \n", " y"}));
  EXPECT_EQ(split("line\r\nnext"), (Pieces{"line", "\r", "\n", "next"}));
  EXPECT_EQ(split("abc123 456!!"), (Pieces{"abc", "123", " 456", "!!"}));
  EXPECT_EQ(split(" 's"), (Pieces{" '", "s"}));
  EXPECT_EQ(split("'''s"), (Pieces{"'''", "s"}));
  EXPECT_EQ(split("café naïve"), (Pieces{"café", " naïve"}));
  EXPECT_EQ(split("e\xCC\x81"), (Pieces{"e", "\xCC\x81"}));  // combining acute is Mn: not a letter
  EXPECT_EQ(split("日本語 テキスト"), (Pieces{"日本語", " テキスト"}));
  EXPECT_EQ(split("\xF0\x9F\x98\x80\xF0\x9F\x98\x80 ok"), (Pieces{"\xF0\x9F\x98\x80\xF0\x9F\x98\x80", " ok"}));
  EXPECT_EQ(split("\u00A0\u3000x"), (Pieces{"\u00A0", "\u3000", "x"}));  // White_Space beyond ASCII
  EXPECT_EQ(split("\u0663\u0664"), (Pieces{"\u0663\u0664"}));            // Arabic-Indic digits: \p{N}
}

TEST(Pretokenize, InvalidUtf8IsOtherBytes) {
  EXPECT_EQ(split("a\xFF\xFE" "b"), (Pieces{"a", "\xFF\xFE", "b"}));
  EXPECT_EQ(split(" \x80x"), (Pieces{" \x80", "x"}));
  EXPECT_EQ(split("\xC3"), (Pieces{"\xC3"}));                  // truncated sequence
  EXPECT_EQ(split("\xED\xA0\x80"), (Pieces{"\xED\xA0\x80"}));  // surrogate: three other bytes
  EXPECT_EQ(split("\xC0\xAF" "a"), (Pieces{"\xC0\xAF", "a"}));  // overlong
}

TEST(Pretokenize, CharClasses) {
  EXPECT_EQ(char_class('a'), CharClass::kLetter);
  EXPECT_EQ(char_class(0xE9), CharClass::kLetter);
  EXPECT_EQ(char_class(0x4E2D), CharClass::kLetter);
  EXPECT_EQ(char_class(0x20000), CharClass::kLetter);  // CJK extension B
  EXPECT_EQ(char_class(0x1C89), CharClass::kLetter);  // new in Unicode 16.0
  EXPECT_EQ(char_class(0x1CCF0), CharClass::kNumber);  // new in Unicode 16.0
  EXPECT_STREQ(unicode_version(), "16.0.0");
  EXPECT_EQ(char_class('7'), CharClass::kNumber);
  EXPECT_EQ(char_class(0x2167), CharClass::kNumber);  // Roman numeral eight (Nl)
  EXPECT_EQ(char_class(0x3000), CharClass::kSpace);
  EXPECT_EQ(char_class(0x85), CharClass::kSpace);
  EXPECT_EQ(char_class(0x1C), CharClass::kOther);  // Python's isspace() says yes; \s does not
  EXPECT_EQ(char_class(0x20AC), CharClass::kOther);
  EXPECT_EQ(char_class(0x1F600), CharClass::kOther);
}

TEST(Pretokenize, PiecesCoverTheText) {
  std::mt19937_64 rng(seed());
  for (int round = 0; round < 2000; ++round) {
    std::string text(rng() % 64, '\0');
    for (char& c : text) c = static_cast<char>(rng());
    std::string joined;
    for (const auto& p : split(text)) {
      ASSERT_FALSE(p.empty());
      joined += p;
    }
    ASSERT_EQ(joined, text);
  }
}

std::vector<std::string> split_llama3(std::string_view text, int max_digits) {
  std::vector<std::string> pieces;
  for (size_t pos = 0; pos < text.size();) {
    size_t end = llama3_piece_end(text, pos, max_digits);
    pieces.emplace_back(text.substr(pos, end - pos));
    pos = end;
  }
  return pieces;
}

// Llama 3's pattern worked through by hand (Qwen2's differs in digits only).
TEST(Pretokenize, Llama3Cases) {
  EXPECT_EQ(split_llama3("Hello world's 12345\n\n  x", 3),
            (Pieces{"Hello", " world", "'s", " ", "123", "45", "\n\n", " ", " x"}));
  EXPECT_EQ(split_llama3("12345", 1), (Pieces{"1", "2", "3", "4", "5"}));
  EXPECT_EQ(split_llama3("I'M WE'LL 'Ve", 3), (Pieces{"I", "'M", " WE", "'LL", " '", "Ve"}));  // any case
  EXPECT_EQ(split_llama3("...hello (x)", 3), (Pieces{"...", "hello", " (", "x", ")"}));   // one symbol joins letters
  EXPECT_EQ(split_llama3("!!!\n\nx", 3), (Pieces{"!!!\n\n", "x"}));  // line breaks follow punctuation
  EXPECT_EQ(split_llama3("a \n \n b", 3), (Pieces{"a", " \n \n", " b"}));
  EXPECT_EQ(split_llama3("\tx\u3000y", 3), (Pieces{"\tx", "\u3000y"}));  // any non-break space leads letters
  EXPECT_EQ(split_llama3("x   ", 3), (Pieces{"x", "   "}));
  EXPECT_EQ(split_llama3("\xFF" "ab \x80", 3), (Pieces{"\xFF" "ab", " \x80"}));  // invalid bytes are symbols
}

TEST(Pretokenize, Llama3PiecesCoverTheText) {
  std::mt19937_64 rng(seed() + 3);
  for (int round = 0; round < 2000; ++round) {
    std::string text(rng() % 64, '\0');
    for (char& c : text) c = static_cast<char>(rng() % 4 ? rng() : "\r\n '"[rng() % 4]);
    for (int digits : {1, 3}) {
      std::string joined;
      for (const auto& p : split_llama3(text, digits)) {
        ASSERT_FALSE(p.empty());
        joined += p;
      }
      ASSERT_EQ(joined, text);
    }
  }
}

// A small tokenizer trained on a fixed English/code/whitespace text.
const Tokenizer& small_tokenizer() {
  static const Tokenizer tokenizer = [] {
    std::string text;
    for (int i = 0; i < 50; ++i) {
      text += "The quick brown fox jumps over the lazy dog. It's 2024, isn't it? ";
      text += "for (int i = 0; i < n; ++i) {\n    sum += x[i];\n}\n\n";
      text += "aaaaaaaaaaaaaaaa          1234567890 1234567890 <|endoftext|>";
    }
    BpeTrainOptions options;
    options.vocab_size = 400;
    BpeTrainer trainer(options);
    trainer.add_text(text);
    return trainer.train();
  }();
  return tokenizer;
}

std::string random_text(std::mt19937_64& rng, size_t size) {
  static const std::vector<std::string> alphabet = {"a", "b", "e", "t", "h", " ", " ", "\n", "\r\n", "1", "9", "'",
                                                    "'s", "!", "é", "日", "\xF0\x9F\x98\x80", "\xFF", "\x80",
                                                    "<|endoftext|>", "\t", "aaaa"};
  std::string text;
  while (text.size() < size) text += alphabet[rng() % alphabet.size()];
  return text;
}

TEST(Bpe, FastMatchesReference) {
  const Tokenizer& tok = small_tokenizer();
  std::mt19937_64 rng(seed() + 1);
  for (int round = 0; round < 3000; ++round) {
    std::string piece = random_text(rng, 1 + rng() % (round % 10 == 0 ? 600 : 40));
    ASSERT_EQ(tok.encode_piece(piece), tok.encode_piece_reference(piece)) << "piece of " << piece.size() << " bytes";
  }
  // Long runs take the heap path.
  for (std::string piece : {std::string(1000, 'a'), std::string(777, ' '), std::string(300, '1')}) {
    EXPECT_EQ(tok.encode_piece(piece), tok.encode_piece_reference(piece));
  }
}

TEST(Bpe, RoundTripsArbitraryBytes) {
  const Tokenizer& tok = small_tokenizer();
  std::mt19937_64 rng(seed() + 2);
  for (int round = 0; round < 3000; ++round) {
    std::string bytes(rng() % 200, '\0');
    for (char& c : bytes) c = static_cast<char>(rng());
    if (round % 2) bytes = random_text(rng, bytes.size());
    for (bool allow : {true, false}) {
      std::vector<TokenId> ids = tok.encode(bytes, allow);
      ASSERT_EQ(tok.decode(ids), bytes);
    }
  }
}

// The same vocabulary with Llama 3's pre-tokenizer and ignore_merges, and Qwen2's with NFC:
// arbitrary bytes still round-trip (NFC keeps invalid bytes; random bytes are rarely valid
// non-NFC text), and the parallel encoder cuts where both families' patterns allow.
TEST(Bpe, Llama3AndQwen2StyleRoundTripAndSplitInParallel) {
  const Tokenizer& small = small_tokenizer();
  std::vector<std::string> tokens;
  for (TokenId id = 0; id < small.vocab_size(); ++id) tokens.emplace_back(small.token_bytes(id));
  for (PreTokenizer pre : {PreTokenizer::kLlama3, PreTokenizer::kQwen2}) {
    TokenizerOptions options{.pre_tokenizer = pre, .ignore_merges = pre == PreTokenizer::kLlama3};
    std::vector<AddedToken> added;
    for (TokenId id : small.special_ids()) added.push_back({.id = id});
    Tokenizer tok(tokens, small.merges(), added, options);
    std::mt19937_64 rng(seed() + 4);
    for (int round = 0; round < 1000; ++round) {
      std::string bytes(rng() % 200, '\0');
      for (char& c : bytes) c = static_cast<char>(rng());
      if (round % 2) bytes = random_text(rng, bytes.size());
      ASSERT_EQ(tok.decode(tok.encode(bytes)), bytes);
    }
    std::string big;
    while (big.size() < 3 * 1024 * 1024) big += random_text(rng, 1000) + "!\n x";
    EXPECT_EQ(tok.encode_parallel(big, 4), tok.encode(big));
  }
}

// SentencePiece-style without byte tokens: an unknown character is the unk token, a run of them
// one unk when fuse_unk (Hugging Face's BPE; worked out by hand). Vocabulary: <unk> " " a b " a".
TEST(Bpe, SentencePieceUnknownCharactersBecomeUnk) {
  for (bool fuse : {false, true}) {
    TokenizerOptions options{.pre_tokenizer = PreTokenizer::kWhole, .sentencepiece = true,
                             .prepend_space = PrependSpace::kAlwaysEvenAfterSpace, .unk_id = 0, .fuse_unk = fuse};
    Tokenizer tok({"<unk>", " ", "a", "b", " a"}, {{1, 2}}, {AddedToken{.id = 0}}, options);
    // "a☃☃b c" -> " a☃☃b c": " a" unk unk b " " unk
    std::vector<TokenId> expected = fuse ? std::vector<TokenId>{4, 0, 3, 1, 0} : std::vector<TokenId>{4, 0, 0, 3, 1, 0};
    EXPECT_EQ(tok.encode("a\u2603\u2603b c"), expected) << "fuse_unk " << fuse;
    EXPECT_EQ(tok.decode(tok.encode("a b")), " a b");  // no Strip decoder here: the prepended space stays
  }
}

TEST(Bpe, ParallelAndBatchMatchSerial) {
  const Tokenizer& tok = small_tokenizer();
  std::mt19937_64 rng(seed() + 3);
  std::string big = random_text(rng, 3 << 20);
  std::vector<TokenId> serial = tok.encode(big);
  EXPECT_EQ(tok.encode_parallel(big, 4), serial);
  std::vector<std::string> docs;
  for (int i = 0; i < 40; ++i) docs.push_back(random_text(rng, rng() % 5000));
  std::vector<std::string_view> views(docs.begin(), docs.end());
  auto batch = tok.encode_batch(views, 3);
  for (size_t i = 0; i < docs.size(); ++i) EXPECT_EQ(batch[i], tok.encode(docs[i]));
}

TEST(Bpe, ParallelNeverCutsASpecialTokenWithSpaces) {
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.emplace_back(1, static_cast<char>(b));
  tokens.emplace_back("x <sep> y");
  Tokenizer tok(tokens, {}, {256});
  std::string text;
  std::mt19937_64 rng(seed() + 4);
  while (text.size() < (2u << 20)) text += rng() % 4 ? "ab x <sep> y " : "cd\n";
  std::vector<TokenId> serial = tok.encode(text);
  EXPECT_EQ(tok.encode_parallel(text, 8), serial);
  EXPECT_EQ(tok.decode(serial), text);
}

TEST(Bpe, SpecialTokens) {
  const Tokenizer& tok = small_tokenizer();
  TokenId eot = tok.eot_id();
  ASSERT_EQ(eot, tok.vocab_size() - 1);
  std::vector<TokenId> ids = tok.encode("fox<|endoftext|>dog");
  EXPECT_EQ(std::count(ids.begin(), ids.end(), eot), 1);
  EXPECT_EQ(tok.decode(ids), "fox<|endoftext|>dog");
  std::vector<TokenId> plain = tok.encode("fox<|endoftext|>dog", /*allow_special=*/false);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), eot), 0);
  EXPECT_EQ(tok.decode(plain), "fox<|endoftext|>dog");
  EXPECT_EQ(tok.encode("<|endoftext|><|endoftext|>"), (std::vector<TokenId>{eot, eot}));
  EXPECT_THROW(tok.decode(std::vector<TokenId>{tok.vocab_size()}), InputError);
}

// Several special tokens: the earliest occurrence wins, the longest where two start together, and
// one that never occurs changes nothing; against the text split by hand and each piece encoded.
TEST(Bpe, SeveralSpecialTokensEarliestThenLongest) {
  BpeTrainOptions options;
  options.vocab_size = 256 + 4;
  options.special_tokens = {"<|sep|>", "<|sep|>!", "<|never|>", std::string(kEndOfText)};
  BpeTrainer trainer(options);
  trainer.add_text("ab");
  const Tokenizer tok = trainer.train();
  const TokenId sep = 256, sep_bang = 257, eot = 259;
  ASSERT_EQ(tok.token_bytes(sep_bang), "<|sep|>!");
  std::string text;
  std::vector<TokenId> expected;
  for (int i = 0; i < 200; ++i) {
    const std::string piece = fmt::format("x{}", i);
    text += piece;
    for (TokenId id : tok.encode(piece, false)) expected.push_back(id);
    text += i % 3 == 0 ? "<|sep|>!" : i % 3 == 1 ? "<|sep|>" : std::string(kEndOfText);
    expected.push_back(i % 3 == 0 ? sep_bang : i % 3 == 1 ? sep : eot);
  }
  EXPECT_EQ(tok.encode(text), expected);
}

TEST(Train, DeterministicWithDocumentedTieRule) {
  BpeTrainOptions options;
  options.vocab_size = 256 + 3 + 1;
  options.min_pair_count = 1;
  BpeTrainer trainer(options);
  trainer.add_text("ab cd");  // words "ab", " cd": pairs (a,b), (' ',c), (c,d) all once
  Tokenizer tok = trainer.train();
  ASSERT_EQ(tok.merges().size(), 3u);
  // Equal counts: the smaller (left id, right id) first: (' ', 'c') < ('a', 'b') < ('c', 'd').
  EXPECT_EQ(tok.merges()[0], (std::pair<TokenId, TokenId>{' ', 'c'}));
  EXPECT_EQ(tok.merges()[1], (std::pair<TokenId, TokenId>{'a', 'b'}));
  EXPECT_EQ(tok.token_bytes(258), " cd");
  EXPECT_EQ(tok.vocab_size(), 260);
  EXPECT_EQ(tok.token_bytes(259), "<|endoftext|>");

  // Same counts in a different order give the same tokenizer.
  BpeTrainOptions big;
  big.vocab_size = 400;
  BpeTrainer t1(big), t2(big);
  std::string one = "alpha beta gamma beta beta alpha delta\n", two = "zeta zeta eta theta eta\n";
  t1.add_text(one);
  t1.add_text(two);
  std::vector<std::string_view> docs = {two, one};
  t2.add_texts(docs);
  EXPECT_EQ(t1.train().fingerprint(), t2.train().fingerprint());
}

TEST(Train, MergesMakeTokens256PlusRank) {
  const Tokenizer& tok = small_tokenizer();
  // The corpus is small: training stops early once no pair occurs twice.
  EXPECT_GT(tok.vocab_size(), 300);
  EXPECT_LE(tok.vocab_size(), 400);
  for (size_t r = 0; r < tok.merges().size(); ++r) {
    auto [l, rgt] = tok.merges()[r];
    EXPECT_EQ(tok.token_bytes(static_cast<TokenId>(256 + r)),
              std::string(tok.token_bytes(l)) + std::string(tok.token_bytes(rgt)));
  }
  // Special-token text was cut out of the training text, never learnt as ordinary text.
  for (TokenId id = 256; id < tok.vocab_size() - 1; ++id) {
    EXPECT_EQ(tok.token_bytes(id).find("endoftext"), std::string_view::npos);
  }
}

fs::path temp_dir(const std::string& name) {
  fs::path dir = fs::temp_directory_path() / fmt::format("paraflow_tok_{}_{}_{}", name, getpid(), seed());
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

TEST(Files, SaveAndLoadAllFormats) {
  const Tokenizer& tok = small_tokenizer();
  fs::path dir = temp_dir("save");
  tok.save(dir);
  std::string text = "The lazy dog's 1234 <|endoftext|> sum += x[i];\n\n  日本\xFF";
  for (const Tokenizer& loaded : {Tokenizer::load(dir), Tokenizer::load_vocab_merges(dir / "vocab.json", dir / "merges.txt"),
                                  Tokenizer::load_tokenizer_json(dir / "tokenizer.json")}) {
    EXPECT_EQ(loaded.fingerprint(), tok.fingerprint());
    EXPECT_EQ(loaded.encode(text), tok.encode(text));
  }
  // GPT-2's names for the same two formats.
  fs::copy_file(dir / "vocab.json", dir / "encoder.json");
  fs::copy_file(dir / "merges.txt", dir / "vocab.bpe");
  EXPECT_EQ(Tokenizer::load_vocab_merges(dir / "encoder.json", dir / "vocab.bpe").fingerprint(), tok.fingerprint());
  fs::remove_all(dir);
}

// Expects `load` to throw InputError whose message contains every one of `parts`.
template <typename Load>
void expect_error(Load load, const std::vector<std::string>& parts) {
  try {
    load();
    ADD_FAILURE() << "no error";
  } catch (const InputError& e) {
    for (const auto& part : parts) EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

TEST(Files, BadFilesGiveClearErrors) {
  fs::path dir = temp_dir("bad");
  small_tokenizer().save(dir);
  std::string vocab = read_file(dir / "vocab.json"), merges = read_file(dir / "merges.txt");
  fs::path v = dir / "v.json", m = dir / "m.txt";

  write_file_atomic(v, "{\"a\": 0,");
  write_file_atomic(m, merges);
  expect_error([&] { Tokenizer::load_vocab_merges(v, m); }, {v.string(), "invalid JSON"});
  // What Hugging Face would apply and this tokenizer cannot is refused, not ignored (the ids
  // would differ), naming the field and its value.
  nlohmann::json full = nlohmann::json::parse(read_file(dir / "tokenizer.json"));
  fs::path t = dir / "t.json";
  auto refused = [&](const std::string& pointer, const nlohmann::json& value, std::vector<std::string> parts) {
    nlohmann::json changed = full;
    changed[nlohmann::json::json_pointer(pointer)] = value;
    write_file_atomic(t, changed.dump());
    parts.insert(parts.begin(), t.string());
    expect_error([&] { Tokenizer::load_tokenizer_json(t); }, parts);
  };
  refused("/normalizer", {{"type", "Lowercase"}}, {"normalizer = {\"type\":\"Lowercase\"} is not supported"});
  refused("/model/type", "WordPiece", {"model.type = \"WordPiece\" is not supported"});
  refused("/model/dropout", 0.1, {"model.dropout = 0.1 is not supported"});
  refused("/model/byte_fallback", true, {"model.byte_fallback = true is not supported"});
  refused("/pre_tokenizer", {{"type", "Whitespace"}}, {"pre_tokenizer = {\"type\":\"Whitespace\"}"});
  refused("/pre_tokenizer/add_prefix_space", true, {"pre_tokenizer.add_prefix_space = true"});
  refused("/pre_tokenizer",
          {{"type", "Sequence"},
           {"pretokenizers",
            {{{"type", "Split"}, {"pattern", {{"Regex", "\\s+"}}}, {"behavior", "Isolated"}, {"invert", false}},
             {{"type", "ByteLevel"}, {"use_regex", false}}}}},
          {"pre_tokenizer.pretokenizers[0].pattern = {\"Regex\":\"\\\\s+\"} is not supported",
           "only Llama 3's and Qwen2's split patterns"});
  refused("/decoder", {{"type", "WordPiece"}}, {"decoder = {\"type\":\"WordPiece\"} is not supported"});
  refused("/post_processor", {{"type", "BertProcessing"}}, {"post_processor = {\"type\":\"BertProcessing\"}"});
  refused("/added_tokens/0/single_word", true, {"added_tokens[0].single_word = true is not supported"});
  // An added special token not in model.vocab takes the next id; one in it, the id it has there.
  nlohmann::json gap = full;
  gap["added_tokens"].push_back({{"id", 100000}, {"content", "<|pad|>"}, {"special", true}});
  write_file_atomic(t, gap.dump());
  expect_error([&] { Tokenizer::load_tokenizer_json(t); }, {t.string(), "\"<|pad|>\" has id 100000", "must take the next id"});
  nlohmann::json moved = full;
  for (auto& token : moved["added_tokens"]) token["id"] = 0;
  write_file_atomic(t, moved.dump());
  expect_error([&] { Tokenizer::load_tokenizer_json(t); }, {t.string(), "\"<|endoftext|>\" has id 0, model.vocab gives it"});
  // Nested 100,000 deep: refused while parsing (copying or printing it would overflow the stack).
  write_file_atomic(v, "{\"a\": " + std::string(100000, '[') + std::string(100000, ']') + "}");
  expect_error([&] { Tokenizer::load_vocab_merges(v, m); }, {v.string(), "JSON nested deeper than 64 levels"});

  write_file_atomic(v, vocab);
  write_file_atomic(m, "#version: 0.2\nĠ t\nq zzz\n");
  expect_error([&] { Tokenizer::load_vocab_merges(v, m); }, {m.string() + ":3", "\"zzz\" is not in the vocabulary"});

  std::string first_merge = merges.substr(merges.find('\n') + 1);
  first_merge = first_merge.substr(0, first_merge.find('\n') + 1);
  write_file_atomic(m, "#version: 0.2\n" + first_merge + first_merge);
  expect_error([&] { Tokenizer::load_vocab_merges(v, m); }, {m.string(), "repeats an earlier merge"});

  write_file_atomic(m, "#version: 0.2\nĠ\n");
  expect_error([&] { Tokenizer::load_vocab_merges(v, m); }, {m.string() + ":2", "LEFT RIGHT"});

  write_file_atomic(v, "{\"a\": 0, \"b\": 0}");
  write_file_atomic(m, "");
  expect_error([&] { Tokenizer::load_vocab_merges(v, m); }, {v.string(), "id 0 is used twice"});

  write_file_atomic(v, "{\"a\": 0, \"\xE2\x82\xAC\": 1}");
  expect_error([&] { Tokenizer::load_vocab_merges(v, m); }, {v.string(), "byte-to-unicode"});

  write_file_atomic(v, "{\"a\": 0, \"b\": 1}");
  expect_error([&] { Tokenizer::load_vocab_merges(v, m); }, {"no token for byte"});

  write_file_atomic(v, "{\"a\": \"zero\"}");
  expect_error([&] { Tokenizer::load_vocab_merges(v, m); }, {v.string(), "must be an integer"});

  expect_error([&] { Tokenizer::load(dir / "nothing"); }, {"nothing", "vocab.json"});

  write_file_atomic(dir / "t.tiktoken", "YQ== 0\nYg== 5\n");
  expect_error([&] { Tokenizer::load_tiktoken(dir / "t.tiktoken"); }, {"t.tiktoken:2", "rank"});
  fs::remove_all(dir);
}

TEST(Files, TiktokenFormatRecoversMerges) {
  const Tokenizer& tok = small_tokenizer();
  fs::path dir = temp_dir("tiktoken");
  // Write the small tokenizer as .tiktoken (its ids are already ranks; eot last).
  static const char* kB64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string file;
  for (TokenId id = 0; id + 1 < tok.vocab_size(); ++id) {
    std::string_view b = tok.token_bytes(id);
    std::string enc;
    for (size_t i = 0; i < b.size(); i += 3) {
      uint32_t n = static_cast<unsigned char>(b[i]) << 16;
      if (i + 1 < b.size()) n |= static_cast<unsigned char>(b[i + 1]) << 8;
      if (i + 2 < b.size()) n |= static_cast<unsigned char>(b[i + 2]);
      enc += kB64[(n >> 18) & 63];
      enc += kB64[(n >> 12) & 63];
      enc += i + 1 < b.size() ? kB64[(n >> 6) & 63] : '=';
      enc += i + 2 < b.size() ? kB64[n & 63] : '=';
    }
    file += fmt::format("{} {}\n", enc, id);
  }
  write_file_atomic(dir / "small.tiktoken", file);
  Tokenizer loaded = Tokenizer::load_tiktoken(dir / "small.tiktoken");
  EXPECT_EQ(loaded.merges(), tok.merges());
  EXPECT_EQ(loaded.fingerprint(), tok.fingerprint());
  fs::remove_all(dir);
}

}  // namespace
}  // namespace paraflow::data
