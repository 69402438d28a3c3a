// UTF-8 encoding and decoding of one code point, shared by the tokenizer (its byte map,
// pre-tokenizer and normalizer) and the chat templates' string values.
#pragma once

#include <string>

namespace paraflow {

inline void append_utf8(char32_t cp, std::string& out) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// The length a lead byte announces (1 to 4), or 0 for a continuation byte or a byte that never
// leads (0xF8 and above). The caller checks the continuation bytes and the value's range.
inline int utf8_sequence_length(unsigned char lead) {
  return lead < 0x80 ? 1 : lead >> 5 == 0x6 ? 2 : lead >> 4 == 0xE ? 3 : lead >> 3 == 0x1E ? 4 : 0;
}

// The code point of the `length`-byte sequence at `p` (1 to 4 bytes, its continuation bytes
// already checked).
inline char32_t utf8_code_point(const unsigned char* p, int length) {
  char32_t cp = length == 1 ? p[0] : p[0] & (0x7F >> length);
  for (int k = 1; k < length; ++k) cp = (cp << 6) | (p[k] & 0x3F);
  return cp;
}

}  // namespace paraflow
