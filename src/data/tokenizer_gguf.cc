// GGUF's tokenizer.ggml.* as llama.cpp's converter writes them, both ways. Byte-level BPE ("gpt2"):
// tokens in GPT-2's byte-to-unicode spelling and merges, the split pattern named by
// tokenizer.ggml.pre. SentencePiece-style ("llama"): pieces spelled with "▁", byte tokens <0xNN>
// and a score per piece but no merges; the merges are the ones Hugging Face derives from a
// SentencePiece model (transformers' convert_slow_tokenizer.generate_merges): every split of a
// piece into two pieces, ranked by the whole piece's score, highest first, then the longer left
// part, then the longer right part. Token types say which tokens are added: CONTROL ones are
// special, USER_DEFINED ones are not.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>

#include "base/error.h"
#include "data/tokenizer.h"
#include "data/tokenizer_vocab.h"

namespace paraflow::data {
namespace {

// llama.cpp's token types.
constexpr int32_t kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kByte = 6;

struct PreTokenizerName {
  const char* name;
  PreTokenizer pre_tokenizer;
};
// tokenizer.ggml.pre values and our split patterns; the first of each is the one written.
constexpr PreTokenizerName kPreTokenizers[] = {
    {"gpt-2", PreTokenizer::kGpt2}, {"default", PreTokenizer::kGpt2}, {"llama-bpe", PreTokenizer::kLlama3},
    {"qwen2", PreTokenizer::kQwen2},
};

size_t characters(std::string_view text) {
  return static_cast<size_t>(std::count_if(text.begin(), text.end(), [](char c) { return (c & 0xC0) != 0x80; }));
}

// generate_merges: for each piece (in id order), its splits into two pieces, ordered by their
// ids; all of them then stably ordered by (score, left length, right length), largest first.
std::vector<std::pair<TokenId, TokenId>> sentencepiece_merges(const GgufVocabulary& g, const Vocab& v,
                                                              const std::vector<bool>& whole) {
  struct Candidate {
    float score;
    size_t left_length, right_length;
    TokenId left, right;
  };
  std::vector<Candidate> candidates;
  for (size_t id = 0; id < g.tokens.size(); ++id) {
    if (whole[id]) continue;  // added and byte tokens are never merged into
    const std::string& piece = g.tokens[id];
    const size_t first = candidates.size();
    for (size_t cut = 1; cut < piece.size(); ++cut) {
      if ((piece[cut] & 0xC0) == 0x80) continue;  // inside a character
      const auto left = v.by_string.find(piece.substr(0, cut)), right = v.by_string.find(piece.substr(cut));
      if (left == v.by_string.end() || right == v.by_string.end()) continue;
      candidates.push_back({g.scores[id], characters(left->first), characters(right->first), left->second, right->second});
    }
    std::sort(candidates.begin() + static_cast<std::ptrdiff_t>(first), candidates.end(),
              [](const Candidate& a, const Candidate& b) { return std::pair(a.left, a.right) < std::pair(b.left, b.right); });
  }
  std::stable_sort(candidates.begin(), candidates.end(), [](const Candidate& a, const Candidate& b) {
    return std::tuple(a.score, a.left_length, a.right_length) > std::tuple(b.score, b.left_length, b.right_length);
  });
  std::vector<std::pair<TokenId, TokenId>> merges;
  merges.reserve(candidates.size());
  for (const Candidate& c : candidates) merges.emplace_back(c.left, c.right);
  return merges;
}

}  // namespace

Tokenizer Tokenizer::from_gguf(const GgufVocabulary& g, const std::string& where) {
  const bool sentencepiece = g.model == "llama";
  check(sentencepiece || g.model == "gpt2",
        "{}: tokenizer.ggml.model '{}' is not read (gpt2: byte-level BPE; llama: SentencePiece-style BPE)", where, g.model);
  const size_t n = g.tokens.size();
  check(g.token_types.empty() || g.token_types.size() == n, "{}: tokenizer.ggml.token_type has {} entries for {} tokens",
        where, g.token_types.size(), n);
  auto type = [&](size_t id) { return g.token_types.empty() ? kNormal : g.token_types[id]; };
  nlohmann::json object = nlohmann::json::object();
  std::vector<std::string> added_texts;
  std::vector<bool> whole(n, false);
  for (size_t id = 0; id < n; ++id) {
    check(object.emplace(g.tokens[id], id).second, "{}: tokenizer.ggml.tokens: \"{}\" (id {}) appears twice", where,
          g.tokens[id], id);
    if (type(id) == kControl || type(id) == kUserDefined) added_texts.push_back(g.tokens[id]);
    whole[id] = type(id) == kControl || type(id) == kUserDefined || type(id) == kByte;
  }
  Vocab v = read_vocab(object, where + ": tokenizer.ggml.tokens", added_texts,
                       sentencepiece ? Spelling::kMetaspace : Spelling::kByteLevel);
  std::vector<AddedToken> added;
  for (TokenId id : v.special_ids) added.push_back({.id = id, .special = type(static_cast<size_t>(id)) != kUserDefined});
  TokenizerOptions options;
  std::vector<std::pair<TokenId, TokenId>> merges;
  if (sentencepiece) {
    options.sentencepiece = true;
    options.pre_tokenizer = PreTokenizer::kWhole;  // a section of text is one word
    // llama.cpp puts a space before the text and after each special token: every section.
    options.prepend_space = g.add_space_prefix ? PrependSpace::kAlwaysEvenAfterSpace : PrependSpace::kNever;
    options.strip_leading_space = g.add_space_prefix;
    const auto missing = std::find(v.byte_fallback.begin(), v.byte_fallback.end(), -1);
    check(missing == v.byte_fallback.end(), "{}: tokenizer.ggml.tokens has no byte token <0x{:02X}> (byte fallback needs all 256)",
          where, missing - v.byte_fallback.begin());
    options.byte_fallback = v.byte_fallback;
    options.unk_id = g.unk;
    for (size_t id = 0; id < n && options.unk_id < 0; ++id) {
      if (type(id) == kUnknown) options.unk_id = static_cast<TokenId>(id);
    }
    options.fuse_unk = true;
    check(g.scores.size() == n, "{}: tokenizer.ggml.scores has {} entries for {} tokens", where, g.scores.size(), n);
    merges = sentencepiece_merges(g, v, whole);
  } else {
    const auto* named = std::find_if(std::begin(kPreTokenizers), std::end(kPreTokenizers),
                                     [&](const PreTokenizerName& p) { return g.pre == p.name; });
    check(named != std::end(kPreTokenizers), "{}: tokenizer.ggml.pre '{}' is not implemented (gpt-2, default, llama-bpe, qwen2)",
          where, g.pre);
    options.pre_tokenizer = named->pre_tokenizer;
    options.ignore_merges = options.pre_tokenizer == PreTokenizer::kLlama3;
    options.nfc = options.pre_tokenizer == PreTokenizer::kQwen2;  // Qwen2's files put text in NFC
    for (size_t rank = 0; rank < g.merges.size(); ++rank) {
      merges.push_back(parse_merge_line(v, g.merges[rank], fmt::format("{}: tokenizer.ggml.merges[{}]", where, rank)));
    }
  }
  auto token = [&](TokenId id, const char* key) {
    check(id >= 0 && static_cast<size_t>(id) < n, "{}: {} {} is not a token id (of {})", where, key, id, n);
    return id;
  };
  if (g.add_bos.value_or(sentencepiece || options.pre_tokenizer == PreTokenizer::kLlama3)) {
    options.template_prefix.push_back(token(g.bos, "tokenizer.ggml.bos_token_id"));
  }
  if (g.add_eos.value_or(false)) options.template_suffix.push_back(token(g.eos, "tokenizer.ggml.eos_token_id"));
  try {
    return Tokenizer(std::move(v.tokens), std::move(merges), std::move(added), std::move(options));
  } catch (const InputError& e) {
    fail("{}: {}", where, e.what());
  }
}

GgufVocabulary Tokenizer::gguf_vocabulary() const {
  const bool sentencepiece = options_.sentencepiece;
  GgufVocabulary g;
  g.model = sentencepiece ? "llama" : "gpt2";
  const int n = vocab_size();
  std::vector<bool> byte_token(static_cast<size_t>(n), false);
  for (TokenId id : options_.byte_fallback) byte_token[static_cast<size_t>(id)] = true;
  for (TokenId id = 0; id < n; ++id) {
    const std::string_view bytes = token_bytes(id);
    const bool added = std::binary_search(special_ids_.begin(), special_ids_.end(), id);
    std::string spelled;
    int32_t type = kNormal;
    if (added) {
      spelled = bytes;
      type = is_special(id) ? kControl : kUserDefined;
    } else if (sentencepiece && byte_token[static_cast<size_t>(id)]) {
      spelled = fmt::format("<0x{:02X}>", static_cast<unsigned char>(bytes[0]));
      type = kByte;
    } else {
      for (const char byte : bytes) {
        if (sentencepiece) {
          spelled += byte == ' ' ? std::string(kMetaspace) : std::string(1, byte);
        } else {
          spelled += byte_to_unicode_utf8(static_cast<unsigned char>(byte));
        }
      }
      if (id == options_.unk_id) type = kUnknown;
    }
    g.tokens.push_back(std::move(spelled));
    g.token_types.push_back(type);
  }
  if (sentencepiece) {
    // Scores that rank the pieces as the merges made them: merge r's piece scores -r.
    g.scores.assign(static_cast<size_t>(n), 0);
    std::vector<bool> scored(static_cast<size_t>(n), false);
    for (size_t rank = 0; rank < merges_.size(); ++rank) {
      const std::string made = std::string(token_bytes(merges_[rank].first)) + std::string(token_bytes(merges_[rank].second));
      const auto it = index_.find(made);
      if (it == index_.end() || scored[static_cast<size_t>(it->second)]) continue;
      scored[static_cast<size_t>(it->second)] = true;
      g.scores[static_cast<size_t>(it->second)] = -static_cast<float>(rank);
    }
    for (TokenId id = 0; id < n; ++id) {
      if (!scored[static_cast<size_t>(id)]) g.scores[static_cast<size_t>(id)] = -1e6f - static_cast<float>(id);
    }
    g.unk = options_.unk_id;
    g.add_space_prefix = options_.prepend_space != PrependSpace::kNever;
  } else {
    const auto* named = std::find_if(std::begin(kPreTokenizers), std::end(kPreTokenizers),
                                     [&](const PreTokenizerName& p) { return options_.pre_tokenizer == p.pre_tokenizer; });
    check(named != std::end(kPreTokenizers), "GGUF: this tokenizer's split pattern has no tokenizer.ggml.pre name");
    g.pre = named->name;
    for (const auto& [left, right] : merges_) {
      g.merges.push_back(g.tokens[static_cast<size_t>(left)] + " " + g.tokens[static_cast<size_t>(right)]);
    }
  }
  g.add_bos = !options_.template_prefix.empty();
  if (*g.add_bos) g.bos = options_.template_prefix.front();
  g.add_eos = !options_.template_suffix.empty();
  if (*g.add_eos) g.eos = options_.template_suffix.back();
  return g;
}

}  // namespace paraflow::data
