// Tokenizer files: GPT-2's encoder.json + vocab.bpe, Hugging Face's vocab.json + merges.txt (the
// same two formats), tiktoken's ranks, and saving as Hugging Face's files. Token strings spell
// bytes through GPT-2's byte-to-unicode map; special tokens are spelled as their text.
// tokenizer.json is read by tokenizer_json.cc.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <charconv>
#include <unordered_map>

#include "base/error.h"
#include "base/json.h"
#include "base/file_io.h"
#include "data/tokenizer.h"
#include "data/tokenizer_vocab.h"

namespace paraflow::data {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string bytes_to_unicode(std::string_view bytes) {
  std::string out;
  for (char c : bytes) out += byte_to_unicode_utf8(static_cast<unsigned char>(c));
  return out;
}

std::string json_string(std::string_view s) { return json(std::string(s)).dump(); }

std::string vocab_json_body(const Tokenizer& t) {
  std::string out = "{";
  for (TokenId id = 0; id < t.vocab_size(); ++id) {
    std::string_view bytes = t.token_bytes(id);
    std::string key = t.is_special(id) ? std::string(bytes) : bytes_to_unicode(bytes);
    if (id) out += ", ";
    out += json_string(key);
    out += ": ";
    out += std::to_string(id);
  }
  out += "}";
  return out;
}

std::string merge_string(const Tokenizer& t, std::pair<TokenId, TokenId> m) {
  return bytes_to_unicode(t.token_bytes(m.first)) + " " + bytes_to_unicode(t.token_bytes(m.second));
}

bool base64_decode(std::string_view in, std::string& out) {
  out.clear();
  uint32_t acc = 0;
  int bits = 0;
  for (char c : in) {
    int v;
    if (c >= 'A' && c <= 'Z') v = c - 'A';
    else if (c >= 'a' && c <= 'z') v = c - 'a' + 26;
    else if (c >= '0' && c <= '9') v = c - '0' + 52;
    else if (c == '+') v = 62;
    else if (c == '/') v = 63;
    else if (c == '=') break;
    else return false;
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((acc >> bits) & 0xFF);
    }
  }
  return true;
}

}  // namespace


Tokenizer Tokenizer::load_vocab_merges(const fs::path& vocab_json, const fs::path& merges_txt) {
  Vocab v = read_vocab(parse_json_file(vocab_json), vocab_json.string(), {}, Spelling::kByteLevel);
  std::string text = read_file(merges_txt);
  std::vector<std::pair<TokenId, TokenId>> merges;
  size_t line_no = 0, pos = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string::npos) eol = text.size();
    std::string_view line(text.data() + pos, eol - pos);
    pos = eol + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || (line_no == 1 && line.starts_with("#version"))) continue;
    merges.push_back(parse_merge_line(v, line, fmt::format("{}:{}", merges_txt.string(), line_no)));
  }
  try {
    return Tokenizer(std::move(v.tokens), std::move(merges), std::move(v.special_ids));
  } catch (const InputError& e) {
    fail("{} + {}: {}", vocab_json.string(), merges_txt.string(), e.what());
  }
}

Tokenizer Tokenizer::load_tiktoken(const fs::path& path) {
  std::string text = read_file(path);
  std::vector<std::string> tokens;
  std::unordered_map<std::string, TokenId> by_bytes;
  size_t line_no = 0, pos = 0;
  std::string bytes;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string::npos) eol = text.size();
    std::string_view line(text.data() + pos, eol - pos);
    pos = eol + 1;
    ++line_no;
    if (line.empty()) continue;
    size_t space = line.find(' ');
    check(space != std::string_view::npos, "{}:{}: expected \"BASE64 RANK\"", path.string(), line_no);
    check(base64_decode(line.substr(0, space), bytes) && !bytes.empty(), "{}:{}: bad base64 token", path.string(),
          line_no);
    std::string_view rank_text = line.substr(space + 1);
    int64_t rank = -1;
    auto [end, ec] = std::from_chars(rank_text.data(), rank_text.data() + rank_text.size(), rank);
    check(ec == std::errc() && end == rank_text.data() + rank_text.size() && rank == static_cast<int64_t>(tokens.size()),
          "{}:{}: rank \"{}\" must be the line's index {} (dense, in order)", path.string(), line_no, rank_text,
          tokens.size());
    check(by_bytes.emplace(bytes, static_cast<TokenId>(rank)).second, "{}:{}: token listed twice", path.string(), line_no);
    tokens.push_back(bytes);
  }
  // Recover the merges: BPE each multi-byte token with the merges found so far (all of lower
  // rank); it must end in exactly two parts.
  std::unordered_map<uint64_t, TokenId> pair_rank;
  std::vector<std::pair<TokenId, TokenId>> merges;
  for (size_t r = 0; r < tokens.size(); ++r) {
    const std::string& token = tokens[r];
    if (token.size() == 1) continue;
    std::vector<TokenId> parts;
    for (char c : token) {
      auto it = by_bytes.find(std::string(1, c));
      check(it != by_bytes.end() && it->second < static_cast<TokenId>(r),
            "{}: token of rank {}: byte 0x{:02X} has no lower-ranked token", path.string(), r,
            static_cast<unsigned char>(c));
      parts.push_back(it->second);
    }
    while (parts.size() > 2) {
      size_t best = 0;
      TokenId best_rank = -1;
      for (size_t i = 0; i + 1 < parts.size(); ++i) {
        auto it = pair_rank.find((uint64_t(uint32_t(parts[i])) << 32) | uint32_t(parts[i + 1]));
        if (it != pair_rank.end() && (best_rank < 0 || it->second < best_rank)) {
          best_rank = it->second;
          best = i;
        }
      }
      if (best_rank < 0) break;
      parts[best] = best_rank;
      parts.erase(parts.begin() + static_cast<ptrdiff_t>(best) + 1);
    }
    check(parts.size() == 2, "{}: token of rank {} is not one merge of two lower-ranked tokens", path.string(), r);
    pair_rank.emplace((uint64_t(uint32_t(parts[0])) << 32) | uint32_t(parts[1]), static_cast<TokenId>(r));
    merges.emplace_back(parts[0], parts[1]);
  }
  std::vector<TokenId> special_ids = {static_cast<TokenId>(tokens.size())};
  tokens.emplace_back(kEndOfText);
  try {
    return Tokenizer(std::move(tokens), std::move(merges), std::move(special_ids));
  } catch (const InputError& e) {
    fail("{}: {}", path.string(), e.what());
  }
}

bool Tokenizer::present_in(const fs::path& dir) {
  return fs::exists(dir / "tokenizer.json") || fs::exists(dir / "vocab.json") || fs::exists(dir / "encoder.json");
}

Tokenizer Tokenizer::load(const fs::path& dir) {
  if (fs::exists(dir / "tokenizer.json")) return load_tokenizer_json(dir / "tokenizer.json", dir / "tokenizer_config.json");
  if (fs::exists(dir / "vocab.json")) return load_vocab_merges(dir / "vocab.json", dir / "merges.txt");
  if (fs::exists(dir / "encoder.json")) return load_vocab_merges(dir / "encoder.json", dir / "vocab.bpe");
  fail("{}: no tokenizer.json, vocab.json + merges.txt or encoder.json + vocab.bpe", dir.string());
}

namespace {

bool gpt2_style(const TokenizerOptions& o, const std::vector<AddedToken>& added) {
  return o.pre_tokenizer == PreTokenizer::kGpt2 && !o.ignore_merges && !o.nfc && !o.sentencepiece &&
         o.template_prefix.empty() && o.template_suffix.empty() &&
         std::all_of(added.begin(), added.end(), [](const AddedToken& a) { return a.special && !a.lstrip && !a.rstrip; });
}

}  // namespace

void Tokenizer::export_to(const fs::path& source_dir, const fs::path& dir) const {
  if (gpt2_style(options_, added_)) {
    save(dir);
    return;
  }
  fs::create_directories(dir);
  for (const char* name : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"}) {
    if (fs::exists(source_dir / name)) write_file_atomic(dir / name, read_file(source_dir / name));
  }
}

void Tokenizer::save(const fs::path& dir) const {
  check(gpt2_style(options_, added_),
        "tokenizer: only GPT-2-style tokenizers are written by save(); export_to() copies the others' files");
  fs::create_directories(dir);
  for (TokenId id : special_ids_) {
    std::string_view text = token_bytes(id);
    check(json::accept(json_string(text)), "tokenizer: special token {} is not valid UTF-8", id);
  }
  std::string vocab = vocab_json_body(*this);
  write_file_atomic(dir / "vocab.json", vocab + "\n");

  std::string merges = "#version: 0.2\n";
  for (const auto& m : merges_) merges += merge_string(*this, m) + "\n";
  write_file_atomic(dir / "merges.txt", merges);

  // tokenizer.json as `tokenizers` writes it for GPT-2 (ByteLevel pre-tokenizer, decoder and
  // post-processor; plain BPE without ignore_merges so every word goes through the merges).
  std::string added = "[";
  for (size_t i = 0; i < special_ids_.size(); ++i) {
    if (i) added += ",";
    added += fmt::format(
        "\n    {{\"id\": {}, \"content\": {}, \"single_word\": false, \"lstrip\": false, \"rstrip\": false, "
        "\"normalized\": false, \"special\": true}}",
        special_ids_[i], json_string(token_bytes(special_ids_[i])));
  }
  added += special_ids_.empty() ? "]" : "\n  ]";
  std::string tok = "{\n  \"version\": \"1.0\",\n  \"truncation\": null,\n  \"padding\": null,\n";
  tok += "  \"added_tokens\": " + added + ",\n  \"normalizer\": null,\n";
  tok += "  \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": true, "
         "\"use_regex\": true},\n";
  tok += "  \"post_processor\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"trim_offsets\": false, "
         "\"use_regex\": true},\n";
  tok += "  \"decoder\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"trim_offsets\": true, "
         "\"use_regex\": true},\n";
  tok += "  \"model\": {\"type\": \"BPE\", \"dropout\": null, \"unk_token\": null, \"continuing_subword_prefix\": "
         "\"\", \"end_of_word_suffix\": \"\", \"fuse_unk\": false, \"byte_fallback\": false, \"ignore_merges\": "
         "false,\n    \"vocab\": ";
  tok += vocab + ",\n    \"merges\": [";
  for (size_t i = 0; i < merges_.size(); ++i) {
    tok += i ? ", " : "";
    tok += json_string(merge_string(*this, merges_[i]));
  }
  tok += "]\n  }\n}\n";
  write_file_atomic(dir / "tokenizer.json", tok);

  json config = {{"tokenizer_class", "GPT2Tokenizer"}, {"add_prefix_space", false}, {"errors", "replace"}};
  if (TokenId eot = eot_id(); eot >= 0) {
    config["bos_token"] = std::string(kEndOfText);
    config["eos_token"] = std::string(kEndOfText);
    config["unk_token"] = std::string(kEndOfText);
  }
  write_file_atomic(dir / "tokenizer_config.json", config.dump(2) + "\n");
}

}  // namespace paraflow::data
