// Reading Hugging Face's vocabulary and merges (vocab.json + merges.txt, tokenizer.json's model):
// token strings spell bytes through GPT-2's byte-to-unicode map (byte-level BPE) or with "▁" for
// a space and `<0xNN>` for a byte (SentencePiece-style); added tokens are spelled as their text.
// Used by tokenizer_files.cc and tokenizer_json.cc.
#pragma once

#include <nlohmann/json.hpp>

#include <filesystem>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "data/tokenizer.h"

namespace paraflow::data {

enum class Spelling { kByteLevel, kMetaspace };

// Vocabulary as token string -> id; tokens (bytes) by id and the added tokens' ids.
struct Vocab {
  std::vector<std::string> tokens;
  std::vector<TokenId> special_ids;  // in the vocabulary and added (or `<|endoftext|>`, byte-level)
  std::unordered_map<std::string, TokenId> by_string;
  std::vector<TokenId> byte_fallback;  // kMetaspace: byte -> `<0xNN>` id or -1
};

// `added`: the texts of added tokens (kept as text). Errors name `where`.
Vocab read_vocab(const nlohmann::json& object, const std::string& where, const std::vector<std::string>& added,
                 Spelling spelling);

// A merge by its two token strings -> their ids.
std::pair<TokenId, TokenId> merge_ids(const Vocab& v, std::string_view left, std::string_view right,
                                      const std::string& where);
// A merge "LEFT RIGHT".
std::pair<TokenId, TokenId> parse_merge_line(const Vocab& v, std::string_view line, const std::string& where);

nlohmann::json parse_json_file(const std::filesystem::path& path);

}  // namespace paraflow::data
