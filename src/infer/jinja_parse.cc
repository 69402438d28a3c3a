// Jinja's lexer and parser for the chat-template subset. The whitespace rules are jinja2's with
// transformers' settings (trim_blocks, lstrip_blocks): a block or comment tag eats the newline
// after it and the indentation before it on its line; `-` beside a delimiter strips all
// whitespace on that side, `+` keeps it; one trailing newline of the template is dropped.
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <stdexcept>

#include "infer/jinja_builtins.h"
#include "infer/jinja_syntax.h"

namespace paraflow::infer::jinja {

namespace {

struct Token {
  enum class Type { name, literal, op, end };
  Type type;
  std::string text;  // name or operator
  Value value;       // literal
  int line = 0;
};

// One tag or run of text of the template.
struct Piece {
  enum class Type { text, output, block };
  Type type;
  std::string text;           // text
  std::vector<Token> tokens;  // output, block (ending with an end token)
  int line = 0;
};

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

class Parser {
 public:
  Parser(std::vector<Piece> pieces, const std::string& name) : pieces_(std::move(pieces)), name_(name) {}

  Body parse() { return statements({}); }

 private:
  [[noreturn]] void refuse(int line, const std::string& what) const {
    throw TemplateSyntaxError(fmt::format("{} line {}: {}", name_, line, what));
  }

  // Blocks and expressions nest at most kMaxNesting deep: the parser and the renderer recurse
  // once per level, and a hostile template must not overflow the stack.
  static constexpr int kMaxNesting = 100;
  struct Nesting {
    Nesting(Parser& parser, int line) : parser_(parser) {
      if (++parser_.depth_ > kMaxNesting) parser_.refuse(line, fmt::format("nested deeper than {} levels", kMaxNesting));
    }
    ~Nesting() { --parser_.depth_; }
    Parser& parser_;
  };

  std::string current_tag() const { return index_ < pieces_.size() ? tag_name(pieces_[index_]) : ""; }

  static std::string tag_name(const Piece& piece) {
    return piece.tokens.empty() || piece.tokens[0].type != Token::Type::name ? "" : piece.tokens[0].text;
  }

  // Statements up to a block tag named in `ends` (left unread), or the template's end.
  Body statements(const std::vector<std::string>& ends) {
    const Nesting nesting(*this, index_ < pieces_.size() ? pieces_[index_].line : 1);
    Body body;
    while (index_ < pieces_.size()) {
      const Piece& piece = pieces_[index_];
      if (piece.type == Piece::Type::text) {
        body.push_back(std::make_shared<Node>(Node{Node::Kind::text, piece.line, piece.text, {}, {}, {}, {}, {}}));
        ++index_;
      } else if (piece.type == Piece::Type::output) {
        begin(piece);
        auto node = std::make_shared<Node>(Node{Node::Kind::output, piece.line, "", expression(), {}, {}, {}, {}});
        expect_end();
        body.push_back(std::move(node));
        ++index_;
      } else {
        const std::string tag = tag_name(piece);
        // The closing tag, or another block's: the caller says which block is left open.
        if (std::find(ends.begin(), ends.end(), tag) != ends.end()) return body;
        if (!ends.empty() && (tag.starts_with("end") || tag == "elif" || tag == "else")) return body;
        if (tag == "generation") {  // transformers' {% generation %}: marks assistant text, renders its body
          expect_bare_tag(piece);
          Body inner = statements({"endgeneration"});
          expect_closing("endgeneration", piece.line, "generation");
          body.insert(body.end(), inner.begin(), inner.end());
          continue;
        }
        body.push_back(statement(piece, tag));
      }
    }
    return body;  // the template's end: a tag left open is refused by expect_closing
  }

  std::shared_ptr<const Node> statement(const Piece& piece, const std::string& tag) {
    auto node = std::make_shared<Node>();
    node->line = piece.line;
    begin(piece);
    if (tag == "if") {
      node->kind = Node::Kind::if_chain;
      next();
      node->conditions.push_back(expression());
      expect_end();
      ++index_;
      node->bodies.push_back(statements({"elif", "else", "endif"}));
      while (current_tag() == "elif") {
        begin(pieces_[index_]);
        next();
        node->conditions.push_back(expression());
        expect_end();
        ++index_;
        node->bodies.push_back(statements({"elif", "else", "endif"}));
      }
      if (current_tag() == "else") {
        expect_bare_tag(pieces_[index_]);
        node->bodies.push_back(statements({"endif"}));
      }
      expect_closing("endif", piece.line, "if");
    } else if (tag == "for") {
      node->kind = Node::Kind::for_loop;
      next();
      do {
        node->targets.push_back(name("a loop variable"));
      } while (accept(","));
      if (!accept_name("in")) refuse(token().line, "expected 'in' in the for tag");
      node->expr = expression(false);
      if (accept_name("if")) node->condition = expression();
      if (accept_name("recursive")) refuse(piece.line, "unsupported construct: a recursive for loop");
      expect_end();
      ++index_;
      node->bodies.push_back(statements({"else", "endfor"}));
      if (current_tag() == "else") {
        expect_bare_tag(pieces_[index_]);
        node->bodies.push_back(statements({"endfor"}));
      }
      expect_closing("endfor", piece.line, "for");
    } else if (tag == "set") {
      node->kind = Node::Kind::set;
      next();
      node->targets.push_back(name("a variable"));
      if (accept(".")) node->targets.push_back(name("an attribute"));
      if (token().text == ",") refuse(piece.line, "unsupported construct: '{% set a, b = ... %}' (several targets)");
      if (token().type == Token::Type::end) refuse(piece.line, "unsupported construct: '{% set %}...{% endset %}' (a block set)");
      if (!accept("=")) refuse(token().line, "expected '=' in the set tag");
      node->expr = expression();
      expect_end();
      ++index_;
    } else if (tag == "break" || tag == "continue") {
      node->kind = tag == "break" ? Node::Kind::break_loop : Node::Kind::continue_loop;
      expect_bare_tag(piece);
    } else if (tag.starts_with("end") || tag == "elif" || tag == "else") {
      refuse(piece.line, fmt::format("'{{% {} %}}' without its opening tag", tag));
    } else {
      refuse(piece.line, fmt::format("unsupported construct '{{% {} %}}'", tag.empty() ? token().text : tag));
    }
    return node;
  }

  // ---- the tokens of the current tag ----
  void begin(const Piece& piece) {
    tokens_ = &piece.tokens;
    at_ = 0;
  }
  const Token& token() const { return (*tokens_)[at_]; }
  void next() {
    if (token().type != Token::Type::end) ++at_;
  }
  bool accept(const char* op) {
    if (token().type != Token::Type::op || token().text != op) return false;
    next();
    return true;
  }
  bool accept_name(const char* word) {
    if (token().type != Token::Type::name || token().text != word) return false;
    next();
    return true;
  }
  void expect(const char* op) {
    if (!accept(op)) refuse(token().line, fmt::format("expected '{}', found '{}'", op, describe(token())));
  }
  std::string name(const char* what) {
    if (token().type != Token::Type::name) refuse(token().line, fmt::format("expected {}, found '{}'", what, describe(token())));
    std::string word = token().text;
    next();
    return word;
  }
  static std::string describe(const Token& token) {
    return token.type == Token::Type::literal ? token.value.repr() : token.text;
  }
  void expect_end() {
    if (token().type != Token::Type::end) refuse(token().line, fmt::format("unexpected '{}'", describe(token())));
  }
  // A tag that is its name alone ({% else %}); reads past it.
  void expect_bare_tag(const Piece& piece) {
    begin(piece);
    next();
    expect_end();
    ++index_;
  }
  void expect_closing(const char* tag, int opened, const char* opener) {
    if (current_tag() != tag) {
      refuse(opened, fmt::format("'{{% {} %}}' is never closed with '{{% {} %}}'", opener, tag));
    }
    expect_bare_tag(pieces_[index_]);
  }

  // ---- expressions, by jinja2's precedence ----
  std::shared_ptr<Expr> make(Expr::Kind kind, int line, std::vector<ExprPtr> args, std::string name = "") {
    auto expr = std::make_shared<Expr>();
    expr->kind = kind;
    expr->line = line;
    expr->args = std::move(args);
    expr->name = std::move(name);
    return expr;
  }

  ExprPtr expression(bool with_conditional = true) {
    const Nesting nesting(*this, token().line);
    ExprPtr value = or_expression();
    if (with_conditional && token().type == Token::Type::name && token().text == "if") {
      const int line = token().line;
      next();
      ExprPtr condition = or_expression();
      ExprPtr otherwise = accept_name("else") ? expression() : nullptr;
      return make(Expr::Kind::conditional, line, {value, condition, otherwise});
    }
    return value;
  }

  ExprPtr or_expression() {
    ExprPtr left = and_expression();
    while (token().type == Token::Type::name && token().text == "or") {
      const int line = token().line;
      next();
      left = make(Expr::Kind::binary, line, {left, and_expression()}, "or");
    }
    return left;
  }

  ExprPtr and_expression() {
    ExprPtr left = not_expression();
    while (token().type == Token::Type::name && token().text == "and") {
      const int line = token().line;
      next();
      left = make(Expr::Kind::binary, line, {left, not_expression()}, "and");
    }
    return left;
  }

  ExprPtr not_expression() {
    const Nesting nesting(*this, token().line);
    if (token().type == Token::Type::name && token().text == "not") {
      const int line = token().line;
      next();
      return make(Expr::Kind::unary, line, {not_expression()}, "not");
    }
    return comparison();
  }

  ExprPtr comparison() {
    ExprPtr first = arithmetic();
    auto compare = std::make_shared<Expr>();
    compare->kind = Expr::Kind::compare;
    compare->line = first->line;
    compare->args.push_back(first);
    while (true) {
      std::string op;
      if (token().type == Token::Type::op &&
          (token().text == "==" || token().text == "!=" || token().text == "<" || token().text == "<=" ||
           token().text == ">" || token().text == ">=")) {
        op = token().text;
        next();
      } else if (accept_name("in")) {
        op = "in";
      } else if (token().type == Token::Type::name && token().text == "not" && at_ + 1 < tokens_->size() &&
                 (*tokens_)[at_ + 1].type == Token::Type::name && (*tokens_)[at_ + 1].text == "in") {
        next();
        next();
        op = "not in";
      } else {
        break;
      }
      compare->ops.push_back(op);
      compare->args.push_back(arithmetic());
    }
    return compare->ops.empty() ? first : compare;
  }

  // + and -, then ~, then * / // %, then **: jinja2's math1, concat, math2, pow.
  ExprPtr arithmetic() {
    ExprPtr left = concatenation();
    while (token().type == Token::Type::op && (token().text == "+" || token().text == "-")) {
      const std::string op = token().text;
      const int line = token().line;
      next();
      left = make(Expr::Kind::binary, line, {left, concatenation()}, op);
    }
    return left;
  }

  ExprPtr concatenation() {
    ExprPtr left = product();
    while (token().type == Token::Type::op && token().text == "~") {
      const int line = token().line;
      next();
      left = make(Expr::Kind::binary, line, {left, product()}, "~");
    }
    return left;
  }

  ExprPtr product() {
    ExprPtr left = power();
    while (token().type == Token::Type::op &&
           (token().text == "*" || token().text == "/" || token().text == "//" || token().text == "%")) {
      const std::string op = token().text;
      const int line = token().line;
      next();
      left = make(Expr::Kind::binary, line, {left, power()}, op);
    }
    return left;
  }

  ExprPtr power() {
    ExprPtr left = unary();
    while (token().type == Token::Type::op && token().text == "**") {
      const int line = token().line;
      next();
      left = make(Expr::Kind::binary, line, {left, unary()}, "**");
    }
    return left;
  }

  // jinja2's parse_unary: a sign applies to what follows it with its attributes, subscripts and
  // calls; filters and tests then apply to the signed value (-x|abs is abs(-x)).
  ExprPtr unary(bool with_filters = true) {
    const Nesting nesting(*this, token().line);
    ExprPtr expr;
    if (token().type == Token::Type::op && (token().text == "-" || token().text == "+")) {
      const std::string op = token().text;
      const int line = token().line;
      next();
      expr = make(Expr::Kind::unary, line, {unary(false)}, op);
    } else {
      expr = primary();
    }
    expr = postfix(expr);
    return with_filters ? filters(expr) : expr;
  }

  ExprPtr primary() {
    const Token& t = token();
    if (t.type == Token::Type::literal) {
      auto expr = make(Expr::Kind::literal, t.line, {});
      expr->value = t.value;
      next();
      // Adjacent string literals join, as in Python.
      while (token().type == Token::Type::literal && token().value.is_string() && expr->value.is_string()) {
        expr->value = Value::string(expr->value.as_string() + token().value.as_string());
        next();
      }
      return expr;
    }
    if (t.type == Token::Type::name) {
      auto expr = make(Expr::Kind::name, t.line, {}, t.text);
      next();
      return expr;
    }
    if (accept("(")) {
      ExprPtr inner = expression();
      if (token().text == ",") refuse(t.line, "unsupported construct: a tuple literal");
      expect(")");
      return inner;
    }
    if (accept("[")) {
      std::vector<ExprPtr> items;
      while (!accept("]")) {
        if (!items.empty()) expect(",");
        if (accept("]")) break;
        items.push_back(expression());
      }
      return make(Expr::Kind::list, t.line, std::move(items));
    }
    if (accept("{")) {
      std::vector<ExprPtr> items;
      while (!accept("}")) {
        if (!items.empty()) expect(",");
        if (accept("}")) break;
        items.push_back(expression());
        expect(":");
        items.push_back(expression());
      }
      return make(Expr::Kind::dict, t.line, std::move(items));
    }
    refuse(t.line, fmt::format("unexpected '{}'", t.type == Token::Type::end ? "end of tag" : describe(t)));
  }

  // Attribute access, subscripts and calls bind tighter than any operator.
  ExprPtr postfix(ExprPtr expr) {
    while (true) {
      const int line = token().line;
      if (accept(".")) {
        const std::string attribute = name("an attribute name");
        if (token().type == Token::Type::op && token().text == "(") {
          if (!is_method(attribute)) refuse(line, fmt::format("unsupported construct: the method '.{}()'", attribute));
          auto call = make(Expr::Kind::call, line, {expr}, attribute);
          call->method = true;
          next();
          arguments(*call);
          expr = call;
        } else {
          expr = make(Expr::Kind::attribute, line, {expr}, attribute);
        }
      } else if (accept("[")) {
        expr = subscript(expr, line);
      } else if (token().type == Token::Type::op && token().text == "(") {
        if (expr->kind != Expr::Kind::name || !is_function(expr->name)) {
          refuse(line, fmt::format("unsupported construct: calling '{}'", expr->kind == Expr::Kind::name ? expr->name : "an expression"));
        }
        auto call = make(Expr::Kind::call, line, {}, expr->name);
        next();
        arguments(*call);
        expr = call;
      } else {
        return expr;
      }
    }
  }

  // Filters (x | f(...)) and tests (x is [not] t ...), after the postfix operators.
  ExprPtr filters(ExprPtr expr) {
    while (true) {
      const int line = token().line;
      if (accept("|")) {
        const std::string filter = name("a filter name");
        if (!is_filter(filter)) refuse(line, fmt::format("unsupported construct: the filter '{}'", filter));
        auto call = make(Expr::Kind::filter, line, {expr}, filter);
        if (accept("(")) arguments(*call);
        expr = call;
      } else if (token().type == Token::Type::name && token().text == "is") {
        next();
        auto test = make(Expr::Kind::test, line, {expr});
        test->negated = accept_name("not");
        // `is none`, `is true`, `is false`: tests named like the literals.
        if (token().type == Token::Type::literal && !token().value.is_string()) {
          test->name = token().value.is_none() ? "none" : token().value.as_bool() ? "true" : "false";
          next();
        } else {
          test->name = name("a test name");
        }
        if (!is_test(test->name)) refuse(line, fmt::format("unsupported construct: the test '{}'", test->name));
        if (accept("(")) {
          arguments(*test);
        } else if (starts_test_argument()) {
          test->args.push_back(postfix(primary()));
        }
        expr = test;
      } else {
        return expr;
      }
    }
  }

  // jinja2's `x is divisibleby 3`: a test takes one bare argument when one follows.
  bool starts_test_argument() const {
    const Token& t = token();
    if (t.type == Token::Type::literal) return true;
    if (t.type == Token::Type::name) return t.text != "else" && t.text != "or" && t.text != "and" && t.text != "if" && t.text != "not" && t.text != "in" && t.text != "is";
    return t.type == Token::Type::op && (t.text == "[" || t.text == "{");
  }

  ExprPtr subscript(ExprPtr object, int line) {
    std::vector<ExprPtr> parts{object};
    bool slice = false;
    for (int part = 0; part < 3; ++part) {
      if (token().type == Token::Type::op && (token().text == ":" || token().text == "]")) {
        parts.push_back(nullptr);
      } else {
        parts.push_back(expression());
      }
      if (!accept(":")) break;
      slice = true;
    }
    expect("]");
    if (!slice) return make(Expr::Kind::subscript, line, {object, parts[1]});
    parts.resize(4);
    return make(Expr::Kind::slice, line, std::move(parts));
  }

  // After '(': positional then keyword arguments, up to ')'.
  void arguments(Expr& call) {
    bool first = true;
    while (!accept(")")) {
      if (!first) expect(",");
      first = false;
      if (accept(")")) break;
      if (token().type == Token::Type::name && at_ + 1 < tokens_->size() && (*tokens_)[at_ + 1].text == "=" &&
          (*tokens_)[at_ + 1].type == Token::Type::op) {
        std::string key = token().text;
        next();
        next();
        call.kwargs.emplace_back(std::move(key), expression());
      } else {
        if (!call.kwargs.empty()) refuse(token().line, "a positional argument follows a keyword argument");
        call.args.push_back(expression());
      }
    }
  }

  std::vector<Piece> pieces_;
  const std::string& name_;
  size_t index_ = 0;
  const std::vector<Token>* tokens_ = nullptr;
  size_t at_ = 0;
  int depth_ = 0;
};

}  // namespace

Body parse_template(std::string_view source, const std::string& name) {
  return Parser(Lexer(source, name).pieces(), name).parse();
}

}  // namespace paraflow::infer::jinja
