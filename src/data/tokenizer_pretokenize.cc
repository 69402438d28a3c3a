#include "data/tokenizer_pretokenize.h"

#include <algorithm>
#include <array>
#include <vector>

#include "base/utf8.h"

namespace paraflow::data {
namespace {

struct CodeRange {
  char32_t first, last;
};

#include "data/tokenizer_unicode_table.inc"

bool in_ranges(const CodeRange* begin, const CodeRange* end, char32_t cp) {
  const CodeRange* it = std::upper_bound(begin, end, cp, [](char32_t c, const CodeRange& r) { return c < r.first; });
  return it != begin && cp <= (it - 1)->last;
}

bool is_white_space(char32_t cp) {
  // Unicode's White_Space property: what both Rust's regex and Oniguruma mean by \s.
  return (cp >= 0x9 && cp <= 0xD) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
         cp == 0x3000;
}

CharClass classify_slow(char32_t cp) {
  if (is_white_space(cp)) return CharClass::kSpace;
  if (in_ranges(std::begin(kLetterRanges), std::end(kLetterRanges), cp)) return CharClass::kLetter;
  if (in_ranges(std::begin(kNumberRanges), std::end(kNumberRanges), cp)) return CharClass::kNumber;
  return CharClass::kOther;
}

// A flat table for the Basic Multilingual Plane (64 KiB, built once); binary search above it.
constexpr char32_t kTableSize = 0x10000;
const CharClass* bmp_table() {
  static const std::vector<CharClass> table = [] {
    std::vector<CharClass> t(kTableSize);
    for (char32_t cp = 0; cp < kTableSize; ++cp) t[cp] = classify_slow(cp);
    return t;
  }();
  return table.data();
}

struct Char {
  CharClass cls;
  uint32_t len;  // bytes
};

inline bool is_cont(unsigned char c) { return (c & 0xC0) == 0x80; }

// Decodes the character at p (< end). Ill-formed sequences (overlong, surrogates, > U+10FFFF,
// truncated, stray continuation bytes) yield one byte of class kOther.
inline Char next_char(const unsigned char* p, const unsigned char* end, const CharClass* table) {
  unsigned char c = *p;
  if (c < 0x80) return {table[c], 1};
  size_t left = static_cast<size_t>(end - p);
  if (c >= 0xC2 && c <= 0xDF) {
    if (left >= 2 && is_cont(p[1])) return {table[utf8_code_point(p, 2)], 2};
  } else if (c >= 0xE0 && c <= 0xEF) {
    if (left >= 3 && is_cont(p[1]) && is_cont(p[2])) {
      char32_t cp = utf8_code_point(p, 3);
      if (cp >= 0x800 && (cp < 0xD800 || cp > 0xDFFF)) return {table[cp], 3};
    }
  } else if (c >= 0xF0 && c <= 0xF4) {
    if (left >= 4 && is_cont(p[1]) && is_cont(p[2]) && is_cont(p[3])) {
      char32_t cp = utf8_code_point(p, 4);
      if (cp >= 0x10000 && cp <= 0x10FFFF) return {classify_slow(cp), 4};
    }
  }
  return {CharClass::kOther, 1};
}

// A run of characters of class `cls` from q; returns its end.
inline const unsigned char* run_of(const unsigned char* q, const unsigned char* end, CharClass cls,
                                   const CharClass* table) {
  while (q < end) {
    Char c = next_char(q, end, table);
    if (c.cls != cls) break;
    q += c.len;
  }
  return q;
}

inline bool is_line_break(unsigned char c) { return c == '\r' || c == '\n'; }
inline unsigned char ascii_lower(unsigned char c) { return c >= 'A' && c <= 'Z' ? c + 32 : c; }

}  // namespace

CharClass char_class(char32_t code_point) {
  return code_point < kTableSize ? bmp_table()[code_point] : classify_slow(code_point);
}

const char* unicode_version() { return kUnicodeVersion; }

size_t gpt2_piece_end(std::string_view text, size_t pos) {
  static const CharClass* const table = bmp_table();
  const auto* begin = reinterpret_cast<const unsigned char*>(text.data());
  const unsigned char* end = begin + text.size();
  const unsigned char* p = begin + pos;

  // 's|'t|'re|'ve|'m|'ll|'d (case-sensitive, as in GPT-2)
  if (*p == '\'' && end - p >= 2) {
    unsigned char a = p[1];
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return pos + 2;
    if (end - p >= 3) {
      unsigned char b = p[2];
      if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return pos + 3;
    }
  }

  Char first = next_char(p, end, table);
  // ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+': an optional U+0020, then a run of one class.
  const unsigned char* run = p;
  if (*p == ' ' && end - p >= 2) {
    Char second = next_char(p + 1, end, table);
    if (second.cls != CharClass::kSpace) {
      run = p + 1;
      first = second;
    }
  }
  if (first.cls != CharClass::kSpace) {
    const unsigned char* q = run + first.len;
    while (q < end) {
      Char c = next_char(q, end, table);
      if (c.cls != first.cls) break;
      q += c.len;
    }
    return static_cast<size_t>(q - begin);
  }

  // '\s+(?!\S)': a whitespace run that reaches the end, or all of a run but its last character
  // when a non-space follows; '\s+': a single whitespace character before a non-space.
  const unsigned char* q = p + first.len;
  const unsigned char* last = p;  // start of the run's last character
  while (q < end) {
    Char c = next_char(q, end, table);
    if (c.cls != CharClass::kSpace) break;
    last = q;
    q += c.len;
  }
  if (q == end || last == p) return static_cast<size_t>(q - begin);
  return static_cast<size_t>(last - begin);
}

}  // namespace paraflow::data

namespace paraflow::data {

size_t utf8_char_length(const unsigned char* p, const unsigned char* end) {
  return next_char(p, end, bmp_table()).len;
}

size_t white_space_at(std::string_view text, size_t pos) {
  const auto* begin = reinterpret_cast<const unsigned char*>(text.data());
  Char c = next_char(begin + pos, begin + text.size(), bmp_table());
  return c.cls == CharClass::kSpace ? c.len : 0;
}

size_t llama3_piece_end(std::string_view text, size_t pos, int max_digits) {
  static const CharClass* const table = bmp_table();
  const auto* begin = reinterpret_cast<const unsigned char*>(text.data());
  const unsigned char* end = begin + text.size();
  const unsigned char* p = begin + pos;
  auto at = [&](const unsigned char* q) { return static_cast<size_t>(q - begin); };

  // (?i:'s|'t|'re|'ve|'m|'ll|'d)
  if (*p == '\'' && end - p >= 2) {
    unsigned char a = ascii_lower(p[1]);
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return pos + 2;
    if (end - p >= 3) {
      unsigned char b = ascii_lower(p[2]);
      if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return pos + 3;
    }
  }

  Char first = next_char(p, end, table);
  // [^\r\n\p{L}\p{N}]?\p{L}+: letters, with one character before them that is none of those.
  if (first.cls == CharClass::kLetter) return at(run_of(p + first.len, end, CharClass::kLetter, table));
  if (first.cls != CharClass::kNumber && !is_line_break(*p) && p + first.len < end) {
    Char second = next_char(p + first.len, end, table);
    if (second.cls == CharClass::kLetter) {
      return at(run_of(p + first.len + second.len, end, CharClass::kLetter, table));
    }
  }
  // \p{N}{1,3} (Qwen2: \p{N})
  if (first.cls == CharClass::kNumber) {
    const unsigned char* q = p + first.len;
    for (int n = 1; n < max_digits && q < end; ++n) {
      Char c = next_char(q, end, table);
      if (c.cls != CharClass::kNumber) break;
      q += c.len;
    }
    return at(q);
  }
  // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
  const unsigned char* run = p;
  Char head = first;
  if (*p == ' ' && end - p >= 2) {
    Char second = next_char(p + 1, end, table);
    if (second.cls == CharClass::kOther) {
      run = p + 1;
      head = second;
    }
  }
  if (head.cls == CharClass::kOther) {
    const unsigned char* q = run_of(run + head.len, end, CharClass::kOther, table);
    while (q < end && is_line_break(*q)) ++q;
    return at(q);
  }

  // Whitespace from here. `\s*[\r\n]+`: up to the run's last line break, if it has one.
  const unsigned char* q = p;
  const unsigned char* last = p;          // start of the run's last character
  const unsigned char* after_break = p;   // just past the run's last line break
  while (q < end) {
    Char c = next_char(q, end, table);
    if (c.cls != CharClass::kSpace) break;
    last = q;
    q += c.len;
    if (is_line_break(*last)) after_break = q;
  }
  if (after_break != p) return at(after_break);
  // `\s+(?!\S)`: a run that reaches the end, or all of it but its last character when a
  // non-space follows; `\s+`: a single whitespace character before a non-space.
  if (q == end || last == p) return at(q);
  return at(last);
}

}  // namespace paraflow::data
