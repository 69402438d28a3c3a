// The filters, tests, global functions and methods a template may call, as jinja2 (with
// transformers' chat-template settings) defines them. The parser refuses a name not listed here.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "infer/jinja_value.h"

namespace paraflow::infer::jinja {

// A template called raise_exception(message): transformers' TemplateError, which a server
// answers with the message as a bad request.
class TemplateRaised : public Error {
 public:
  using Error::Error;
};

// Arguments of a call: positional, then keyword.
struct Arguments {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

bool is_filter(const std::string& name);
bool is_test(const std::string& name);
bool is_function(const std::string& name);
bool is_method(const std::string& name);

Value apply_filter(const std::string& name, const Value& value, const Arguments& arguments);
bool apply_test(const std::string& name, const Value& value, const Arguments& arguments);
Value call_function(const std::string& name, const Arguments& arguments);
Value call_method(const Value& object, const std::string& name, const Arguments& arguments);

}  // namespace paraflow::infer::jinja
