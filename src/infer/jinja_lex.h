// Jinja's lexer for the chat-template subset: the template cut into runs of text and tags, each
// tag's expression cut into tokens. The whitespace rules are jinja2's with transformers' settings
// (trim_blocks, lstrip_blocks): a block or comment tag eats the newline after it and the
// indentation before it on its line; `-` beside a delimiter strips all whitespace on that side,
// `+` keeps it; one trailing newline of the template is dropped.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "infer/jinja_value.h"

namespace paraflow::infer::jinja {

// One token of a tag's expression; a tag's tokens end with an `end` token (its closing delimiter).
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

// Throws TemplateSyntaxError "<name> line N: ..." (jinja_syntax.h).
std::vector<Piece> lex_template(std::string_view source, const std::string& name);

}  // namespace paraflow::infer::jinja
