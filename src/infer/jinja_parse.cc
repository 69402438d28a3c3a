// Jinja's parser for the chat-template subset: statements and expressions by jinja2's grammar
// and precedence, refusing what the subset does not hold (jinja_syntax.h).
#include <fmt/format.h>

#include <algorithm>

#include "infer/jinja_builtins.h"
#include "infer/jinja_lex.h"
#include "infer/jinja_syntax.h"

namespace paraflow::infer::jinja {

namespace {

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
    } else if (tag == "generation") {  // transformers' {% generation %}: marks assistant text, renders its body
      node->kind = Node::Kind::scope;
      expect_bare_tag(piece);
      node->bodies.push_back(statements({"endgeneration"}));
      expect_closing("endgeneration", piece.line, "generation");
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
  return Parser(lex_template(source, name), name).parse();
}

}  // namespace paraflow::infer::jinja
