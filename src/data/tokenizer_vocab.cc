// The vocabulary and merges of Hugging Face's files, as token bytes and id pairs.
#include "data/tokenizer_vocab.h"

#include <algorithm>
#include <array>
#include <fmt/format.h>

#include "base/error.h"
#include "base/file_io.h"
#include "base/json.h"
#include "base/utf8.h"

namespace paraflow::data {
namespace {

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
      append_utf8(cp, m.to_utf8[b]);
    }
    return m;
  }();
  return map;
}

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

}  // namespace

const std::string& byte_to_unicode_utf8(unsigned char byte) { return byte_map().to_utf8[byte]; }

int unicode_to_byte(char32_t code_point) {
  return code_point < 512 ? byte_map().from_code_point[code_point] : -1;
}

nlohmann::json parse_json_file(const std::filesystem::path& path) { return paraflow::parse_json(read_file(path), path.string()); }

namespace {

// SentencePiece's byte token `<0xNN>` (uppercase hex, as Hugging Face writes and looks them up):
// the byte, or -1.
int fallback_byte(std::string_view key) {
  auto hex = [](char c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1; };
  if (key.size() != 6 || !key.starts_with("<0x") || key[5] != '>' || hex(key[3]) < 0 || hex(key[4]) < 0) return -1;
  return hex(key[3]) * 16 + hex(key[4]);
}

// SentencePiece spelling -> bytes: "▁" is a space.
std::string metaspace_to_bytes(std::string_view key) {
  std::string out;
  for (size_t i = 0; i < key.size();) {
    if (key.compare(i, kMetaspace.size(), kMetaspace) == 0) {
      out += ' ';
      i += kMetaspace.size();
    } else {
      out += key[i++];
    }
  }
  return out;
}

}  // namespace

Vocab read_vocab(const json& object, const std::string& where, const std::vector<std::string>& added,
                 Spelling spelling) {
  check(object.is_object(), "{}: the vocabulary must be a JSON object of token -> id", where);
  Vocab v;
  size_t n = object.size();
  v.tokens.resize(n);
  if (spelling == Spelling::kMetaspace) v.byte_fallback.assign(256, -1);
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
    check(!key.empty(), "{}: token id {} is empty", where, id);
    bool is_added = (spelling == Spelling::kByteLevel && key == kEndOfText) ||
                    std::find(added.begin(), added.end(), key) != added.end();
    if (is_added) {
      v.tokens[id] = key;
      v.special_ids.push_back(static_cast<TokenId>(id));
    } else if (spelling == Spelling::kMetaspace) {
      if (int b = fallback_byte(key); b >= 0) {
        v.tokens[id] = std::string(1, static_cast<char>(b));
        v.byte_fallback[b] = static_cast<TokenId>(id);
      } else {
        v.tokens[id] = metaspace_to_bytes(key);
      }
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

}  // namespace paraflow::data
