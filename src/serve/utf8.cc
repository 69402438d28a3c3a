#include "serve/utf8.h"

namespace paraflow::serve {

namespace {

constexpr std::string_view replacement = "\xEF\xBF\xBD";

// The byte sequence starting at text[i], after Unicode's table 3-7 of well-formed sequences.
struct Sequence {
  size_t length = 0;       // bytes: the character's, or the maximal well-formed prefix of an ill-formed one (>= 1)
  bool complete = false;   // a whole character
  bool truncated = false;  // well-formed so far, but the text ends before the character does
};

Sequence sequence_at(std::string_view text, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char lead = byte(i);
  if (lead < 0x80) return {1, true, false};
  size_t length = 0;
  unsigned char low = 0x80, high = 0xBF;  // the range of the second byte
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) low = 0xA0;
    if (lead == 0xED) high = 0x9F;  // no UTF-16 surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) low = 0x90;
    if (lead == 0xF4) high = 0x8F;  // nothing beyond U+10FFFF
  } else {
    return {1, false, false};  // a continuation byte or C0, C1, F5..FF: never a lead
  }
  for (size_t k = 1; k < length; ++k) {
    if (i + k >= text.size()) return {k, false, true};
    const unsigned char next = byte(i + k);
    const bool fits = k == 1 ? next >= low && next <= high : next >= 0x80 && next <= 0xBF;
    if (!fits) return {k, false, false};
  }
  return {length, true, false};
}

}  // namespace

size_t complete_utf8_prefix(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    const Sequence sequence = sequence_at(text, i);
    if (sequence.truncated) return i;
    i += sequence.length;
  }
  return i;
}

std::string to_valid_utf8(std::string_view text) {
  std::string valid;
  valid.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const Sequence sequence = sequence_at(text, i);
    if (sequence.complete) {
      valid.append(text.substr(i, sequence.length));
    } else {
      valid.append(replacement);
    }
    i += sequence.length;
  }
  return valid;
}

size_t utf8_length(std::string_view text) {
  size_t characters = 0;
  for (size_t i = 0; i < text.size(); i += sequence_at(text, i).length) ++characters;
  return characters;
}

}  // namespace paraflow::serve
