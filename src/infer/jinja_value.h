// The values a Jinja template computes with, behaving as the Python objects jinja2 would hold:
// None, bool, int, float, str, list, dict (insertion-ordered), a namespace(), a global function
// (raise_exception, strftime_now, ...: a name a template may test with `is defined`), and Undefined (a
// missing variable, key or index: empty when printed, false when tested, an error when used in
// arithmetic or dotted into). Lists and dicts are shared, never mutated once built, except a
// namespace's attributes, which `{% set ns.x = ... %}` changes for every holder (as in jinja2).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/error.h"

namespace paraflow::infer::jinja {

// A template failed while rendering (a type error, an undefined value used): jinja2's
// TypeError / UndefinedError. The message says what and where.
class RenderError : public Error {
 public:
  using Error::Error;
};

class Value;
using List = std::vector<Value>;
using Dict = std::vector<std::pair<std::string, Value>>;

class Value {
 public:
  enum class Kind { undefined, none, boolean, integer, real, string, list, dict, ns, function };

  Value() = default;  // Undefined
  static Value none() { return Value(Kind::none); }
  static Value boolean(bool b);
  static Value integer(int64_t i);
  static Value real(double d);
  static Value string(std::string s);
  static Value list(List items);
  static Value dict(Dict items);
  static Value ns(Dict attributes);  // namespace(...)
  static Value function(std::string name);
  static Value from_json(const nlohmann::ordered_json& json);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::undefined; }
  bool is_none() const { return kind_ == Kind::none; }
  bool is_number() const { return kind_ == Kind::boolean || kind_ == Kind::integer || kind_ == Kind::real; }
  bool is_string() const { return kind_ == Kind::string; }
  bool is_list() const { return kind_ == Kind::list; }
  bool is_mapping() const { return kind_ == Kind::dict || kind_ == Kind::ns; }

  bool as_bool() const { return b_; }
  int64_t as_int() const { return i_; }  // bool and int
  double as_double() const;              // bool, int and float
  const std::string& as_string() const { return s_; }
  const List& as_list() const { return *list_; }
  const Dict& as_dict() const { return *dict_; }

  // The key's value, or Undefined.
  Value get(const std::string& key) const;
  bool has(const std::string& key) const;
  // A namespace's attribute (set ns.key = value).
  void set_attribute(const std::string& key, Value value) const;

  // Python's truth value.
  bool truthy() const;
  // Python's str(): what {{ value }} prints ("None", "True", "[1, 'a']", float repr).
  std::string str() const;
  // Python's repr() (str() but strings quoted, as inside a list).
  std::string repr() const;
  // A type name for messages ("str", "int", "undefined", ...).
  const char* type_name() const;

 private:
  explicit Value(Kind kind) : kind_(kind) {}
  Kind kind_ = Kind::undefined;
  bool b_ = false;
  int64_t i_ = 0;
  double d_ = 0;
  std::string s_;
  std::shared_ptr<List> list_;
  std::shared_ptr<Dict> dict_;
};

// Python's ==.
bool equal(const Value& a, const Value& b);
// Python's <, for numbers and strings (other kinds: RenderError).
bool less(const Value& a, const Value& b);

// Python's json.dumps(value, ensure_ascii, indent, separators, sort_keys) as transformers' tojson
// filter calls it: indent < 0 means None; item/key separators default as json.dumps does.
struct JsonStyle {
  bool ensure_ascii = false;
  int indent = -1;
  std::string item_separator;  // empty: ", " (or "," when indented)
  std::string key_separator = ": ";
  bool sort_keys = false;
};
std::string to_json(const Value& value, const JsonStyle& style);

// Python's repr() of a float ("1.0", "1e-05", "inf").
std::string float_repr(double d);

// UTF-8 <-> code points, for Python's code-point string indexing, slicing and length.
std::u32string decode_utf8(const std::string& text);
std::string encode_utf8(const std::u32string& text);
// Python's str.isspace() for one code point (what strip() and split() remove).
bool is_python_space(char32_t c);

}  // namespace paraflow::infer::jinja
