// A Jinja template engine for the subset that models' chat templates use, rendering as jinja2
// does with the environment transformers' apply_chat_template builds (trim_blocks, lstrip_blocks,
// loop controls, the raise_exception and strftime_now globals, a tojson that does not escape
// HTML). What the subset holds: text, {{ }}, {# #}, if / elif / else, for (with a filter, else,
// tuple targets, `loop`), set (also a namespace's attribute), break / continue, {% generation %};
// Python literals, lists, dicts, arithmetic, comparisons, `in`, `~`, conditionals, slices, the
// filters, tests, functions and methods of jinja_builtins.cc. Anything else is refused when the
// template is parsed, naming its line.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "infer/jinja_builtins.h"
#include "infer/jinja_syntax.h"

namespace paraflow::infer::jinja {

class Template {
 public:
  // `name` prefixes error messages ("chat_template line 3: ..."). Throws TemplateSyntaxError.
  Template(std::string_view source, std::string name);

  // Renders with the context's members as the template's variables. Throws TemplateRaised (the
  // template called raise_exception) or RenderError.
  std::string render(const nlohmann::ordered_json& context) const;

 private:
  std::string name_;
  Body body_;
};

}  // namespace paraflow::infer::jinja
