// The parsed form of a Jinja template: statements holding expressions, each with the template
// line it came from. parse_template() reads the subset that chat templates use and refuses
// anything else (a macro, an unknown filter, test, function or method) naming the line and the
// construct, so that a template that loads is a template we render as jinja2 does.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "infer/jinja_value.h"

namespace paraflow::infer::jinja {

// A template refused when it is loaded: bad syntax or a construct outside the subset.
class TemplateSyntaxError : public InputError {
 public:
  using InputError::InputError;
};

struct Expr;
using ExprPtr = std::shared_ptr<const Expr>;

struct Expr {
  enum class Kind {
    literal,      // value
    name,         // name
    list,         // args: the items
    dict,         // args: key, value, key, value, ...
    attribute,    // args[0].name
    subscript,    // args[0][args[1]]
    slice,        // args[0][args[1]:args[2]:args[3]] (null: omitted)
    call,         // name(args, kwargs) for a global function, or args[0].name(args[1:], kwargs) for a method
    filter,       // args[0] | name(args[1:], kwargs)
    test,         // args[0] is [not] name(args[1:])
    unary,        // name ("not", "-", "+") args[0]
    binary,       // args[0] name args[1]: and or + - * / // % ** ~ in "not in"
    compare,      // args[0] ops[0] args[1] ops[1] args[2] ... (Python's chained comparison)
    conditional,  // args[0] if args[1] else args[2] (args[2] null: Undefined)
  };
  Kind kind;
  int line = 0;
  Value value;
  std::string name;
  bool method = false;   // call: args[0] is the object
  bool negated = false;  // test: `is not`
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;  // compare
};

struct Node;
using Body = std::vector<std::shared_ptr<const Node>>;

struct Node {
  enum class Kind {
    text,        // text
    output,      // {{ expr }}
    if_chain,    // {% if %}: conditions[i] -> bodies[i]; bodies[conditions.size()] is the else (may be absent)
    for_loop,    // {% for targets in expr [if condition] %} bodies[0] {% else %} bodies[1]
    set,         // {% set targets[0] = expr %}, or {% set targets[0].targets[1] = expr %} (a namespace's)
    break_loop,
    continue_loop,
    scope,       // bodies[0] with variables of its own: transformers' {% generation %} (a call block)
  };
  Kind kind;
  int line = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr condition;  // for_loop's filter
  std::vector<ExprPtr> conditions;
  std::vector<std::string> targets;
  std::vector<Body> bodies;
};

// Throws TemplateSyntaxError "<name> line N: ...".
Body parse_template(std::string_view source, const std::string& name);

}  // namespace paraflow::infer::jinja
