#include "infer/jinja_lex.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <stdexcept>

#include "infer/jinja_syntax.h"

namespace paraflow::infer::jinja {

namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

class Lexer {
 public:
  Lexer(std::string_view source, const std::string& name) : name_(name) {
    // jinja2 reads \r\n and \r as \n, and drops one trailing newline (keep_trailing_newline=False).
    for (size_t i = 0; i < source.size(); ++i) {
      if (source[i] == '\r') {
        source_ += '\n';
        if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
      } else {
        source_ += source[i];
      }
    }
    if (!source_.empty() && source_.back() == '\n') source_.pop_back();
    for (size_t i = 0; i < source_.size(); ++i) {
      if (source_[i] == '\n') newlines_.push_back(i);
    }
  }

  std::vector<Piece> pieces() {
    std::vector<Piece> out;
    size_t pos = 0;
    bool strip_next = false;  // the previous tag ended with `-`
    while (pos < source_.size()) {
      if (strip_next) {
        while (pos < source_.size() && is_space(source_[pos])) ++pos;
        strip_next = false;
        continue;
      }
      const size_t start = find_tag(pos);
      std::string text = source_.substr(pos, start - pos);
      if (start < source_.size()) {
        const char kind = source_[start + 1];
        const char sign = start + 2 < source_.size() ? source_[start + 2] : '\0';
        if (sign == '-') {
          while (!text.empty() && is_space(text.back())) text.pop_back();
        } else if (kind != '{' && sign != '+') {
          lstrip_block(text, pos);
        }
      }
      if (!text.empty()) out.push_back({Piece::Type::text, std::move(text), {}, line_at(pos)});
      if (start >= source_.size()) break;
      pos = read_tag(start, out, strip_next);
    }
    return out;
  }

 private:
  [[noreturn]] void refuse(int line, const std::string& what) const {
    throw TemplateSyntaxError(fmt::format("{} line {}: {}", name_, line, what));
  }

  int line_at(size_t pos) const {
    return 1 + static_cast<int>(std::lower_bound(newlines_.begin(), newlines_.end(), pos) - newlines_.begin());
  }

  size_t find_tag(size_t pos) const {
    for (size_t i = pos; i + 1 < source_.size(); ++i) {
      if (source_[i] == '{' && (source_[i + 1] == '{' || source_[i + 1] == '%' || source_[i + 1] == '#')) return i;
    }
    return source_.size();
  }

  // lstrip_blocks: the spaces and tabs from the start of the line up to a block or comment tag go,
  // when nothing else precedes the tag on its line.
  void lstrip_block(std::string& text, size_t text_start) const {
    const size_t newline = text.rfind('\n');
    const size_t line_start = newline == std::string::npos ? 0 : newline + 1;
    const bool at_line_start = newline != std::string::npos || text_start == 0 || source_[text_start - 1] == '\n';
    if (!at_line_start || line_start == text.size()) return;
    for (size_t i = line_start; i < text.size(); ++i) {
      if (!is_space(text[i])) return;
    }
    text.resize(line_start);
  }

  // Reads the tag at `start`; returns the position after it (and after the newline trim_blocks eats).
  size_t read_tag(size_t start, std::vector<Piece>& out, bool& strip_next) {
    const char kind = source_[start + 1];
    const int line = line_at(start);
    size_t pos = start + 2;
    if (pos < source_.size() && (source_[pos] == '-' || source_[pos] == '+')) ++pos;
    if (kind == '#') {
      const size_t end = source_.find("#}", pos);
      if (end == std::string::npos) refuse(line, "a comment {# is never closed with #}");
      strip_next = end > pos && source_[end - 1] == '-';
      return after_block(end + 2, strip_next || (end > pos && source_[end - 1] == '+'));
    }
    const std::string close = kind == '{' ? "}}" : "%}";
    Piece piece{kind == '{' ? Piece::Type::output : Piece::Type::block, "", {}, line};
    while (true) {
      while (pos < source_.size() && is_space(source_[pos])) ++pos;
      if (pos >= source_.size()) refuse(line, fmt::format("a tag opened with {}{} is never closed", '{', kind));
      const bool signed_close = (source_[pos] == '-' || source_[pos] == '+') && source_.compare(pos + 1, 2, close) == 0;
      if (signed_close || source_.compare(pos, 2, close) == 0) {
        piece.tokens.push_back({Token::Type::end, close, {}, line_at(pos)});
        strip_next = signed_close && source_[pos] == '-';
        const size_t after = pos + (signed_close ? 3 : 2);
        out.push_back(std::move(piece));
        return kind == '{' ? after : after_block(after, signed_close);
      }
      pos = read_token(pos, piece.tokens);
    }
  }

  // trim_blocks: the first newline after a block or comment tag goes (unless the tag ends in `-`
  // or `+`, which decide themselves).
  size_t after_block(size_t pos, bool signed_close) const {
    return !signed_close && pos < source_.size() && source_[pos] == '\n' ? pos + 1 : pos;
  }

  size_t read_token(size_t pos, std::vector<Token>& tokens) const {
    const int line = line_at(pos);
    const char c = source_[pos];
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t end = pos;
      while (end < source_.size() && (std::isalnum(static_cast<unsigned char>(source_[end])) || source_[end] == '_')) ++end;
      const std::string word = source_.substr(pos, end - pos);
      if (word == "true" || word == "True") tokens.push_back({Token::Type::literal, word, Value::boolean(true), line});
      else if (word == "false" || word == "False") tokens.push_back({Token::Type::literal, word, Value::boolean(false), line});
      else if (word == "none" || word == "None") tokens.push_back({Token::Type::literal, word, Value::none(), line});
      else tokens.push_back({Token::Type::name, word, {}, line});
      return end;
    }
    if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t end = pos;
      while (end < source_.size() && (std::isdigit(static_cast<unsigned char>(source_[end])) || source_[end] == '_')) ++end;
      bool real = false;
      if (end + 1 < source_.size() && source_[end] == '.' && std::isdigit(static_cast<unsigned char>(source_[end + 1]))) {
        real = true;
        ++end;
        while (end < source_.size() && std::isdigit(static_cast<unsigned char>(source_[end]))) ++end;
      }
      // An exponent (1e-05, 2E3) makes a float too.
      if (end < source_.size() && (source_[end] == 'e' || source_[end] == 'E')) {
        size_t after = end + 1;
        if (after < source_.size() && (source_[after] == '+' || source_[after] == '-')) ++after;
        if (after < source_.size() && std::isdigit(static_cast<unsigned char>(source_[after]))) {
          real = true;
          end = after;
          while (end < source_.size() && std::isdigit(static_cast<unsigned char>(source_[end]))) ++end;
        }
      }
      std::string digits = source_.substr(pos, end - pos);
      digits.erase(std::remove(digits.begin(), digits.end(), '_'), digits.end());
      Value number;
      try {
        number = real ? Value::real(std::stod(digits)) : Value::integer(std::stoll(digits));
      } catch (const std::out_of_range&) {
        refuse(line, fmt::format("the number {} is out of range", digits));
      }
      tokens.push_back({Token::Type::literal, digits, number, line});
      return end;
    }
    if (c == '\'' || c == '"') return read_string(pos, tokens);
    static const char* const kOperators[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<", ">", "=",
                                             "(", ")", "[", "]", "{", "}", ",", ".", ":", "|"};
    for (const char* op : kOperators) {
      if (source_.compare(pos, std::char_traits<char>::length(op), op) == 0) {
        tokens.push_back({Token::Type::op, op, {}, line});
        return pos + std::char_traits<char>::length(op);
      }
    }
    refuse(line, fmt::format("unexpected character '{}'", c));
  }

  // A string literal with Python's escapes (jinja2 decodes them as "unicode-escape").
  size_t read_string(size_t pos, std::vector<Token>& tokens) const {
    const int line = line_at(pos);
    const char quote = source_[pos];
    std::string text;
    size_t i = pos + 1;
    const auto hex = [&](size_t digits) {
      char32_t value = 0;
      for (size_t d = 1; d <= digits; ++d) {
        const char h = i + d < source_.size() ? source_[i + d] : '\0';
        if (!std::isxdigit(static_cast<unsigned char>(h))) refuse(line, "a \\x or \\u escape needs hex digits");
        value = value * 16 + static_cast<char32_t>(std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : std::tolower(h) - 'a' + 10);
      }
      i += digits;
      if (value > 0x10ffff) refuse(line, "a \\U escape beyond U+10FFFF");
      return encode_utf8(std::u32string(1, value));
    };
    for (; i < source_.size() && source_[i] != quote; ++i) {
      if (source_[i] != '\\') {
        text += source_[i];
        continue;
      }
      if (++i >= source_.size()) break;
      switch (source_[i]) {
        case 'n': text += '\n'; break;
        case 't': text += '\t'; break;
        case 'r': text += '\r'; break;
        case 'b': text += '\b'; break;
        case 'f': text += '\f'; break;
        case 'v': text += '\v'; break;
        case 'a': text += '\a'; break;
        case '0': text += '\0'; break;
        case '\\': text += '\\'; break;
        case '\'': text += '\''; break;
        case '"': text += '"'; break;
        case '\n': break;
        case 'x': text += hex(2); break;
        case 'u': text += hex(4); break;
        case 'U': text += hex(8); break;
        default: text += '\\'; text += source_[i];  // Python keeps an unknown escape as written
      }
    }
    if (i >= source_.size()) refuse(line, fmt::format("a string opened with {} is never closed", quote));
    tokens.push_back({Token::Type::literal, "string", Value::string(std::move(text)), line});
    return i + 1;
  }

  std::string source_;
  std::vector<size_t> newlines_;  // their offsets, for line numbers
  const std::string& name_;
};

}  // namespace

std::vector<Piece> lex_template(std::string_view source, const std::string& name) { return Lexer(source, name).pieces(); }

}  // namespace paraflow::infer::jinja
