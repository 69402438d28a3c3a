// Tokenizer files: GPT-2's encoder.json + vocab.bpe, Hugging Face's vocab.json + merges.txt (the
// same two formats) and tokenizer.json. Token strings in all of them spell bytes through GPT-2's
// byte-to-unicode map; special tokens are spelled as their text.
#include <nlohmann/json.hpp>

#include <array>
#include <charconv>
#include <unordered_map>

#include "base/error.h"
#include "base/json.h"
#include "base/file_io.h"
#include "data/tokenizer.h"

namespace paraflow::data {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct ByteMap {
  std::array<std::string, 256> to_utf8;
  std::array<int, 512> from_code_point;  // every mapped code point is < 0x144
};

// GPT-2's bytes_to_unicode(): printable Latin-1 bytes map to themselves, the other 68 bytes to
// U+0100.. in byte order.
const ByteMap& byte_map() {
  static const ByteMap map = [] {
    ByteMap m;
    m.from_code_point.fill(-1);
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      char32_t cp = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + extra++);
      m.from_code_point[cp] = b;
      std::string utf8;
      if (cp < 0x80) {
        utf8 += static_cast<char>(cp);
      } else {
        utf8 += static_cast<char>(0xC0 | (cp >> 6));
        utf8 += static_cast<char>(0x80 | (cp & 0x3F));
      }
      m.to_utf8[b] = utf8;
    }
    return m;
  }();
  return map;
}

bool is_known_special(std::string_view text) { return text == kEndOfText; }

// Token string (GPT-2 unicode spelling) -> bytes. Empty optional-like: sets `bad` to the first
// code point outside the map.
bool unicode_to_bytes(std::string_view text, std::string& out, char32_t& bad) {
  out.clear();
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const unsigned char* end = p + text.size();
  while (p < end) {
    char32_t cp;
    if (*p < 0x80) {
      cp = *p++;
    } else if ((*p & 0xE0) == 0xC0 && end - p >= 2) {
      cp = ((p[0] & 0x1F) << 6) | (p[1] & 0x3F);
      p += 2;
    } else {
      bad = *p >= 0xE0 ? 0xFFFF : *p;  // 3- and 4-byte characters are never in the map
      return false;
    }
    int b = unicode_to_byte(cp);
    if (b < 0) {
      bad = cp;
      return false;
    }
    out += static_cast<char>(b);
  }
  return true;
}

std::string bytes_to_unicode(std::string_view bytes) {
  std::string out;
  for (char c : bytes) out += byte_to_unicode_utf8(static_cast<unsigned char>(c));
  return out;
}

json parse_json(const fs::path& path) { return paraflow::parse_json(read_file(path), path.string()); }

// Vocabulary as token string -> id; fills tokens (bytes) by id and the special ids.
struct Vocab {
  std::vector<std::string> tokens;
  std::vector<TokenId> special_ids;
  std::unordered_map<std::string, TokenId> by_string;
};

Vocab read_vocab(const json& object, const std::string& where, const std::vector<std::string>& extra_specials) {
  check(object.is_object(), "{}: the vocabulary must be a JSON object of token -> id", where);
  Vocab v;
  size_t n = object.size();
  v.tokens.resize(n);
  std::vector<bool> seen(n, false);
  std::string bytes;
  for (auto it = object.begin(); it != object.end(); ++it) {
    const std::string& key = it.key();
    check(it->is_number_integer(), "{}: token \"{}\": the id must be an integer, not {}", where, key, it->dump());
    int64_t id = it->get<int64_t>();
    check(id >= 0 && id < static_cast<int64_t>(n), "{}: token \"{}\": id {} outside [0, {}) (ids must be dense)",
          where, key, id, n);
    check(!seen[id], "{}: token \"{}\": id {} is used twice", where, key, id);
    seen[id] = true;
    bool special = is_known_special(key) ||
                   std::find(extra_specials.begin(), extra_specials.end(), key) != extra_specials.end();
    if (special) {
      v.tokens[id] = key;
      v.special_ids.push_back(static_cast<TokenId>(id));
    } else {
      char32_t bad = 0;
      const bool mapped = unicode_to_bytes(key, bytes, bad);  // sets `bad`, read below
      check(mapped, "{}: token \"{}\" (id {}): character U+{:04X} is not in GPT-2's byte-to-unicode map", where, key,
            id, static_cast<uint32_t>(bad));
      check(!bytes.empty(), "{}: token id {} is empty", where, id);
      v.tokens[id] = bytes;
    }
    v.by_string.emplace(key, static_cast<TokenId>(id));
  }
  std::sort(v.special_ids.begin(), v.special_ids.end());
  return v;
}

std::pair<TokenId, TokenId> merge_ids(const Vocab& v, std::string_view left, std::string_view right,
                                      const std::string& where) {
  auto l = v.by_string.find(std::string(left));
  auto r = v.by_string.find(std::string(right));
  check(l != v.by_string.end(), "{}: merge \"{} {}\": \"{}\" is not in the vocabulary", where, left, right, left);
  check(r != v.by_string.end(), "{}: merge \"{} {}\": \"{}\" is not in the vocabulary", where, left, right, right);
  return {l->second, r->second};
}

std::pair<TokenId, TokenId> parse_merge_line(const Vocab& v, std::string_view line, const std::string& where) {
  size_t space = line.find(' ');
  check(space != std::string_view::npos && space > 0 && space + 1 < line.size() &&
            line.find(' ', space + 1) == std::string_view::npos,
        "{}: expected a merge \"LEFT RIGHT\", got \"{}\"", where, line);
  return merge_ids(v, line.substr(0, space), line.substr(space + 1), where);
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

const std::string& byte_to_unicode_utf8(unsigned char byte) { return byte_map().to_utf8[byte]; }

int unicode_to_byte(char32_t code_point) {
  return code_point < 512 ? byte_map().from_code_point[code_point] : -1;
}

Tokenizer Tokenizer::load_vocab_merges(const fs::path& vocab_json, const fs::path& merges_txt) {
  Vocab v = read_vocab(parse_json(vocab_json), vocab_json.string(), {});
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

Tokenizer Tokenizer::from_strings(const std::vector<std::string>& tokens, const std::vector<std::string>& merges,
                                  const std::vector<std::string>& specials, const std::string& where) {
  json object = json::object();
  for (size_t id = 0; id < tokens.size(); ++id) {
    check(object.emplace(tokens[id], id).second, "{}: token \"{}\" (id {}) appears twice", where, tokens[id], id);
  }
  Vocab v = read_vocab(object, where, specials);
  std::vector<std::pair<TokenId, TokenId>> pairs;
  pairs.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    pairs.push_back(parse_merge_line(v, merges[rank], fmt::format("{} merge {}", where, rank)));
  }
  try {
    return Tokenizer(std::move(v.tokens), std::move(pairs), std::move(v.special_ids));
  } catch (const InputError& e) {
    fail("{}: {}", where, e.what());
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

Tokenizer Tokenizer::load_tokenizer_json(const fs::path& path) {
  std::string where = path.string();
  json j = parse_json(path);
  check(j.is_object() && j.contains("model") && j["model"].is_object(), "{}: no \"model\" object", where);
  const json& model = j["model"];
  check(model.value("type", std::string("BPE")) == "BPE", "{}: model.type is \"{}\", only \"BPE\" is supported",
        where, model.value("type", std::string()));
  check(!model.value("ignore_merges", false), "{}: model.ignore_merges = true is not supported", where);
  if (model.contains("continuing_subword_prefix") && model["continuing_subword_prefix"].is_string()) {
    check(model["continuing_subword_prefix"].get<std::string>().empty(),
          "{}: model.continuing_subword_prefix must be empty for byte-level BPE", where);
  }
  // What Hugging Face would apply and this tokenizer does not: refused, not ignored (the ids would differ).
  check(j.value("normalizer", json()).is_null(), "{}: a normalizer ({}) is not supported (GPT-2's byte-level BPE has none)",
        where, j["normalizer"].is_object() ? j["normalizer"].value("type", std::string("?")) : j["normalizer"].type_name());
  check(model.value("dropout", json()).is_null() || model["dropout"] == 0, "{}: model.dropout is not supported", where);
  check(model.value("end_of_word_suffix", json()).is_null() || model["end_of_word_suffix"] == "",
        "{}: model.end_of_word_suffix is not supported", where);
  const json& pre = j.value("pre_tokenizer", json());
  check(pre.is_object() && pre.value("type", std::string()) == "ByteLevel" && pre.value("use_regex", true) &&
            !pre.value("add_prefix_space", false),
        "{}: pre_tokenizer must be ByteLevel with use_regex and without add_prefix_space (GPT-2's), got {}", where,
        pre.dump());
  std::vector<std::string> specials;
  std::vector<std::pair<int64_t, std::string>> added_ids;  // (id, content)
  if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
    for (const json& added : j["added_tokens"]) {
      check(added.is_object(), "{}: added_tokens entries must be objects", where);
      const std::string content = added.value("content", std::string());
      // A non-special added token (GPT-NeoX's runs of spaces) is matched before BPE: not supported.
      check(added.value("special", false), "{}: added token \"{}\" is not special; only special added tokens are supported",
            where, content);
      check(added.contains("id") && added["id"].is_number_integer(), "{}: added token \"{}\" has no integer id", where,
            content);
      for (const char* flag : {"lstrip", "rstrip", "single_word"}) {
        check(!added.value(flag, false), "{}: added token \"{}\": {} = true is not supported", where, content, flag);
      }
      specials.push_back(content);
      added_ids.emplace_back(added["id"].get<int64_t>(), content);
    }
  }
  check(model.contains("vocab"), "{}: model.vocab is missing", where);
  Vocab v = read_vocab(model["vocab"], where + ": model.vocab", specials);
  // An added token is in model.vocab with the same id (GPT-2's <|endoftext|>), or, added later
  // (add_special_tokens), takes the next id after it.
  std::sort(added_ids.begin(), added_ids.end());
  for (const auto& [id, content] : added_ids) {
    if (auto found = v.by_string.find(content); found != v.by_string.end()) {
      check(found->second == id, "{}: added token \"{}\" has id {}, model.vocab gives it {}", where, content, id,
            found->second);
      continue;
    }
    check(id == static_cast<int64_t>(v.tokens.size()),
          "{}: added token \"{}\" has id {}; one not in model.vocab must take the next id, {}", where, content, id,
          v.tokens.size());
    v.tokens.push_back(content);
    v.special_ids.push_back(static_cast<TokenId>(id));
    v.by_string.emplace(content, static_cast<TokenId>(id));
  }
  check(model.contains("merges") && model["merges"].is_array(), "{}: model.merges must be an array", where);
  std::vector<std::pair<TokenId, TokenId>> merges;
  size_t index = 0;
  for (const json& m : model["merges"]) {
    std::string at = fmt::format("{}: model.merges[{}]", where, index++);
    if (m.is_string()) {
      merges.push_back(parse_merge_line(v, m.get<std::string>(), at));
    } else {
      check(m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string(),
            "{}: expected \"LEFT RIGHT\" or [LEFT, RIGHT], got {}", at, m.dump());
      merges.push_back(merge_ids(v, m[0].get<std::string>(), m[1].get<std::string>(), at));
    }
  }
  try {
    return Tokenizer(std::move(v.tokens), std::move(merges), std::move(v.special_ids));
  } catch (const InputError& e) {
    fail("{}: {}", where, e.what());
  }
}

bool Tokenizer::present_in(const fs::path& dir) {
  return fs::exists(dir / "tokenizer.json") || fs::exists(dir / "vocab.json") || fs::exists(dir / "encoder.json");
}

Tokenizer Tokenizer::load(const fs::path& dir) {
  if (fs::exists(dir / "tokenizer.json")) return load_tokenizer_json(dir / "tokenizer.json");
  if (fs::exists(dir / "vocab.json")) return load_vocab_merges(dir / "vocab.json", dir / "merges.txt");
  if (fs::exists(dir / "encoder.json")) return load_vocab_merges(dir / "encoder.json", dir / "vocab.bpe");
  fail("{}: no tokenizer.json, vocab.json + merges.txt or encoder.json + vocab.bpe", dir.string());
}

void Tokenizer::save(const fs::path& dir) const {
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
