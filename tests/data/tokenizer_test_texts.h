// Texts the tokenizer interop tests encode with ours and the reference libraries: fragments of
// English, code, whitespace runs, digits, emoji, CJK, combining marks, other scripts, newlines,
// contractions and special-token text, mixed at random.
#pragma once

#include <random>
#include <string>
#include <vector>

namespace paraflow::data::testing_texts {

// Fragments the texts are made of: English, code, whitespace runs, digits, emoji, CJK, combining
// marks, other scripts, mixed newlines, contractions, special-token text.
inline const std::vector<std::string>& fragments() {
  static const std::vector<std::string> f = {
      "The quick brown fox jumps over the lazy dog.",
      " Fellow citizens of the Senate and House of Representatives:",
      "It's, I'm, we'll, they've, you're, he'd, she's, don't, WON'T, O'Neil's, 'quoted', ''s",
      "def f(x):\n    return x**2 + 3*x - 1  # comment\n",
      "for (int i = 0; i < n; ++i) {\n\tsum += a[i] * b[i];\n}\n",
      "if (a != b && c >= d) { return {}; } // ->> ::<>",
      "    ", "        \n", "\n\n\n", "\r\n", "\r\n\r\n", "\r", " \t \t", "\t\t", "   \n   ",
      "0", "12", "123456789", " 2024", "3.14159", "1,000,000", "-42", "0x7FFF", "1e-10", "٣٤٥", "Ⅷ ½ ²",
      "😀", "👍🏽", "👨‍👩‍👧‍👦", "🇺🇸🇫🇷", "❤️", "🤖 robots", "✨🎉✨",
      "日本語のテキスト", "中文文本，标点。", "한국어 텍스트", "漢字かなカナ",
      "e\u0301", "n\u0303", "a\u0308\u0304", "Ω\u0301", "\u0915\u094D\u0937", "हिन्दी", "ñandú",
      "Привет, мир!", "Γειά σου Κόσμε", "مرحبا بالعالم", "שלום עולם", "ภาษาไทย",
      "\u00A0", "\u3000", "\u2028", "\u200B", "\u2003x", "\u0085",
      "<|endoftext|>", "<|endoftext", "|>", "<|", "$$$", "...", "!!!", "?!", "\"\"", "@#%^&*()",
      "https://example.com/path?q=1&r=2", "user@example.org", "C++20", "naïve café résumé",
      " ", "  ", "a", "I", " I", "'s", " 's", "'S", "''",
      // Letters and digits of Unicode 15.0-16.0 (our table's version), and a 17.0 letter that
      // both libraries still treat as unassigned.
      "x\U00031350y", "\u1C89z", "7\U000116D0", "\U0001CCF0a", " \U00033475b",
  };
  return f;
}

inline std::vector<std::string> make_texts(uint64_t s) {
  std::vector<std::string> texts(fragments().begin(), fragments().end());
  std::mt19937_64 rng(s);
  for (int i = 0; i < 400; ++i) {
    std::string text;
    size_t n = 1 + rng() % (i % 20 == 0 ? 200 : 12);
    for (size_t k = 0; k < n; ++k) {
      const std::string& piece = fragments()[rng() % fragments().size()];
      text += piece;
      if (rng() % 3 == 0) text += ' ';
    }
    texts.push_back(text);
  }
  texts.push_back(std::string(5000, ' ') + "x" + std::string(3000, ' '));
  texts.push_back(std::string(3000, '7') + " " + std::string(1000, '\n') + "end");
  texts.push_back(std::string(2000, '!') + std::string(1000, 'a'));
  std::string mixed;
  for (int i = 0; i < 300; ++i) mixed += i % 3 ? "\r\n" : (i % 2 ? "\n" : "\r");
  texts.push_back(mixed + "tail");
  return texts;
}

}  // namespace paraflow::data::testing_texts
