// Pre-tokenisation by the byte-level families' regexes, written by hand over UTF-8 bytes. GPT-2's
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// and Llama 3's (Qwen2's is the same with \p{N} for \p{N}{1,3})
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
//   \s*[\r\n]+|\s+(?!\S)|\s+
// split text exactly as the regex does (leftmost alternative first, greedy), as tiktoken (Rust
// regex) and tokenizers (Oniguruma) run it. \s is Unicode White_Space; \p{L} and \p{N} come from tokenizer_unicode_table.inc.
// Bytes that are not well-formed UTF-8 are one-byte characters of their own, of none of the
// classes (so they join `[^\s\p{L}\p{N}]+` runs); splitting therefore never loses or reorders a
// byte, which is what makes decode(encode(b)) == b hold for arbitrary bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace paraflow::data {

enum class CharClass : uint8_t { kOther = 0, kLetter = 1, kNumber = 2, kSpace = 3 };

// The class of a code point (not of an invalid byte: those are kOther).
CharClass char_class(char32_t code_point);

// The Unicode version the letter/number tables were generated from.
const char* unicode_version();

// The end (exclusive byte offset) of the GPT-2 pre-token that starts at `pos` < text.size().
size_t gpt2_piece_end(std::string_view text, size_t pos);

// The end of the Llama 3 pre-token (max_digits 3) or Qwen2 one (max_digits 1) at `pos`.
size_t llama3_piece_end(std::string_view text, size_t pos, int max_digits);

// The byte length of the character at `p` < end: 1 to 4, and 1 for a byte that does not start a
// well-formed UTF-8 sequence.
size_t utf8_char_length(const unsigned char* p, const unsigned char* end);

// The byte length of the White_Space character at `pos` (< text.size()), or 0.
size_t white_space_at(std::string_view text, size_t pos);

// Calls emit(std::string_view piece) for each pre-token of `text`, in order.
template <typename Emit>
void gpt2_split(std::string_view text, Emit&& emit) {
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = gpt2_piece_end(text, pos);
    emit(text.substr(pos, end - pos));
    pos = end;
  }
}

// True when every pre-tokenisation of a text has a piece boundary at `pos` (0 < pos < size):
// the byte before is an ASCII non-space and the byte at `pos` an ASCII space. No pattern
// alternative spans a non-space followed by a space, and the regex has no look-behind, so the
// parts before and after `pos` can be split (and encoded) independently.
inline bool is_safe_split_point(std::string_view text, size_t pos) {
  auto is_ascii_space = [](unsigned char c) { return c == ' ' || (c >= '\t' && c <= '\r'); };
  auto before = static_cast<unsigned char>(text[pos - 1]);
  auto at = static_cast<unsigned char>(text[pos]);
  return before < 0x80 && !is_ascii_space(before) && is_ascii_space(at);
}

// The same for Llama 3's and Qwen2's patterns, where `[\r\n]*` may follow punctuation: the byte at
// `pos` must be a space or tab (or \v, \f), not a line break.
inline bool is_safe_split_point_llama3(std::string_view text, size_t pos) {
  auto at = static_cast<unsigned char>(text[pos]);
  return at != '\n' && at != '\r' && is_safe_split_point(text, pos);
}

}  // namespace paraflow::data
