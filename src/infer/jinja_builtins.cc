#include "infer/jinja_builtins.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <clocale>
#include <cwctype>
#include <locale.h>
#include <ctime>
#include <functional>
#include <map>
#include <optional>

namespace paraflow::infer::jinja {

namespace {

// A keyword-only argument (map's attribute=), or nullopt.
std::optional<Value> keyword(const Arguments& arguments, const char* name) {
  for (const auto& [key, value] : arguments.keyword) {
    if (key == name) return value;
  }
  return std::nullopt;
}

// The argument at `index` or named `name`, or nullopt.
std::optional<Value> argument(const Arguments& arguments, size_t index, const char* name) {
  if (index < arguments.positional.size()) return arguments.positional[index];
  return keyword(arguments, name);
}

std::string string_argument(const Arguments& arguments, size_t index, const char* name, const char* caller) {
  const std::optional<Value> value = argument(arguments, index, name);
  if (!value || !value->is_string()) {
    throw RenderError(fmt::format("{}: the argument '{}' must be a string{}", caller, name, value ? fmt::format(", not {}", value->type_name()) : ""));
  }
  return value->as_string();
}

const std::string& string_of(const Value& value, const char* caller) {
  if (!value.is_string()) throw RenderError(fmt::format("{}: expected a string, not {}", caller, value.type_name()));
  return value.as_string();
}

// Python's str.strip / lstrip / rstrip: whitespace, or the characters given.
std::string strip(const std::string& text, const std::optional<Value>& characters, bool left, bool right) {
  const std::u32string chars = characters && characters->is_string() ? decode_utf8(characters->as_string()) : U"";
  const bool whitespace = !characters || characters->is_none();
  const auto strippable = [&](char32_t c) { return whitespace ? is_python_space(c) : chars.find(c) != std::u32string::npos; };
  const std::u32string s = decode_utf8(text);
  size_t begin = 0, end = s.size();
  while (left && begin < end && strippable(s[begin])) ++begin;
  while (right && end > begin && strippable(s[end - 1])) --end;
  return encode_utf8(s.substr(begin, end - begin));
}

// Python's str.split(sep=None, maxsplit=-1).
Value split(const std::string& text, const std::optional<Value>& separator, int64_t max_split) {
  List parts;
  if (!separator || separator->is_none()) {
    const std::u32string s = decode_utf8(text);
    size_t i = 0;
    while (true) {
      while (i < s.size() && is_python_space(s[i])) ++i;
      if (i >= s.size()) break;
      if (max_split >= 0 && static_cast<int64_t>(parts.size()) == max_split) {
        size_t end = s.size();
        while (end > i && is_python_space(s[end - 1])) --end;
        parts.push_back(Value::string(encode_utf8(s.substr(i, end - i))));
        break;
      }
      size_t j = i;
      while (j < s.size() && !is_python_space(s[j])) ++j;
      parts.push_back(Value::string(encode_utf8(s.substr(i, j - i))));
      i = j;
    }
    return Value::list(std::move(parts));
  }
  const std::string& sep = string_of(*separator, "split");
  if (sep.empty()) throw RenderError("split: empty separator");
  size_t start = 0;
  while (max_split < 0 || static_cast<int64_t>(parts.size()) < max_split) {
    const size_t at = text.find(sep, start);
    if (at == std::string::npos) break;
    parts.push_back(Value::string(text.substr(start, at - start)));
    start = at + sep.size();
  }
  parts.push_back(Value::string(text.substr(start)));
  return Value::list(std::move(parts));
}

std::string replace(const std::string& text, const std::string& old, const std::string& with, int64_t count) {
  std::string out;
  size_t start = 0;
  for (int64_t done = 0; count < 0 || done < count; ++done) {
    if (old.empty()) {  // Python inserts between every character
      if (start > text.size()) break;
      out += with;
      if (start == text.size()) {
        start = text.size() + 1;
        break;
      }
      const auto c = static_cast<unsigned char>(text[start]);
      const size_t length = c < 0x80 ? 1 : c >> 5 == 0x6 ? 2 : c >> 4 == 0xe ? 3 : 4;
      out += text.substr(start, length);
      start += length;
      continue;
    }
    const size_t at = text.find(old, start);
    if (at == std::string::npos) break;
    out += text.substr(start, at - start) + with;
    start = at + old.size();
  }
  return start <= text.size() ? out + text.substr(start) : out;
}

// Python's str.lower() / str.upper(), by Unicode's simple case mapping (glibc's C.UTF-8 tables),
// plus the one full mapping chat text meets often: upper("ß") is "SS". Other full mappings
// (ligatures, a dotted capital I) differ from Python's.
std::string map_case(const std::string& text, bool upper) {
  static const locale_t utf8 = newlocale(LC_CTYPE_MASK, "C.UTF-8", nullptr);
  std::u32string out;
  for (char32_t c : decode_utf8(text)) {
    if (upper && c == U'\u00df') {
      out += U"SS";
    } else if (utf8 != nullptr) {
      out += static_cast<char32_t>(upper ? towupper_l(static_cast<wint_t>(c), utf8) : towlower_l(static_cast<wint_t>(c), utf8));
    } else {
      out += c < 0x80 ? static_cast<char32_t>(upper ? std::toupper(static_cast<int>(c)) : std::tolower(static_cast<int>(c))) : c;
    }
  }
  return encode_utf8(out);
}

std::string capitalize(const std::string& text) {
  const std::u32string lower = decode_utf8(map_case(text, false));
  if (lower.empty()) return "";
  return map_case(encode_utf8(lower.substr(0, 1)), true) + encode_utf8(lower.substr(1));
}

List items_of(const Value& value, const char* caller) {
  if (value.is_undefined()) return {};
  if (!value.is_mapping()) throw RenderError(fmt::format("{}: expected a mapping, not {}", caller, value.type_name()));
  List items;
  for (const auto& [key, item] : value.as_dict()) items.push_back(Value::list({Value::string(key), item}));
  return items;
}

List sequence_of(const Value& value, const char* caller) {
  if (value.is_undefined()) return {};
  if (value.is_list()) return value.as_list();
  if (value.kind() == Value::Kind::dict) {
    List keys;
    for (const auto& [key, item] : value.as_dict()) keys.push_back(Value::string(key));
    return keys;
  }
  if (value.is_string()) {
    List characters;
    for (char32_t c : decode_utf8(value.as_string())) characters.push_back(Value::string(encode_utf8(std::u32string(1, c))));
    return characters;
  }
  throw RenderError(fmt::format("{}: '{}' object is not iterable", caller, value.type_name()));
}

// jinja2's environment.getattr for a dotted attribute path ("function.name").
Value attribute_path(const Value& value, const std::string& path) {
  Value current = value;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    current = current.get(path.substr(start, dot - start));
    if (dot == std::string::npos) return current;
    start = dot + 1;
  }
}

// select / reject / selectattr / rejectattr: the items whose value (or attribute) passes the test.
Value select(const Value& value, const Arguments& arguments, bool by_attribute, bool keep, const char* caller) {
  size_t next = 0;
  std::string attribute;
  if (by_attribute) attribute = string_argument(arguments, next++, "attribute", caller);
  std::optional<std::string> test;
  if (next < arguments.positional.size()) test = string_of(arguments.positional[next++], caller);
  if (test && !is_test(*test)) throw RenderError(fmt::format("{}: no test named '{}'", caller, *test));
  Arguments test_arguments;
  test_arguments.positional.assign(arguments.positional.begin() + static_cast<std::ptrdiff_t>(std::min(next, arguments.positional.size())),
                                   arguments.positional.end());
  List kept;
  for (const Value& item : sequence_of(value, caller)) {
    const Value subject = by_attribute ? attribute_path(item, attribute) : item;
    const bool passes = test ? apply_test(*test, subject, test_arguments) : subject.truthy();
    if (passes == keep) kept.push_back(item);
  }
  return Value::list(std::move(kept));
}

using Filter = std::function<Value(const Value&, const Arguments&)>;

const std::map<std::string, Filter>& filters() {
  static const std::map<std::string, Filter> table = [] {
    std::map<std::string, Filter> f;
    f["trim"] = [](const Value& v, const Arguments& a) { return Value::string(strip(v.str(), argument(a, 0, "chars"), true, true)); };
    f["length"] = [](const Value& v, const Arguments&) {
      if (v.is_string()) return Value::integer(static_cast<int64_t>(decode_utf8(v.as_string()).size()));
      if (v.is_list()) return Value::integer(static_cast<int64_t>(v.as_list().size()));
      if (v.kind() == Value::Kind::dict) return Value::integer(static_cast<int64_t>(v.as_dict().size()));
      if (v.is_undefined()) return Value::integer(0);
      throw RenderError(fmt::format("length: object of type '{}' has no len()", v.type_name()));
    };
    f["count"] = f["length"];
    // transformers' tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False).
    f["tojson"] = [](const Value& v, const Arguments& a) {
      JsonStyle style;
      if (auto ascii = argument(a, 0, "ensure_ascii")) style.ensure_ascii = ascii->truthy();
      if (auto indent = argument(a, 1, "indent"); indent && !indent->is_none()) {
        if (indent->kind() != Value::Kind::integer) throw RenderError("tojson: indent must be an integer");
        style.indent = static_cast<int>(indent->as_int());
      }
      if (auto separators = argument(a, 2, "separators"); separators && !separators->is_none()) {
        if (!separators->is_list() || separators->as_list().size() != 2) throw RenderError("tojson: separators must be a pair of strings");
        style.item_separator = string_of(separators->as_list()[0], "tojson");
        style.key_separator = string_of(separators->as_list()[1], "tojson");
      }
      if (auto sort = argument(a, 3, "sort_keys")) style.sort_keys = sort->truthy();
      return Value::string(to_json(v, style));
    };
    f["string"] = [](const Value& v, const Arguments&) { return Value::string(v.str()); };
    f["lower"] = [](const Value& v, const Arguments&) { return Value::string(map_case(v.str(), false)); };
    f["upper"] = [](const Value& v, const Arguments&) { return Value::string(map_case(v.str(), true)); };
    f["capitalize"] = [](const Value& v, const Arguments&) { return Value::string(capitalize(v.str())); };
    f["first"] = [](const Value& v, const Arguments&) {
      const List items = sequence_of(v, "first");
      return items.empty() ? Value() : items.front();
    };
    f["last"] = [](const Value& v, const Arguments&) {
      const List items = sequence_of(v, "last");
      return items.empty() ? Value() : items.back();
    };
    f["join"] = [](const Value& v, const Arguments& a) {
      const std::optional<Value> separator = argument(a, 0, "d");
      const std::optional<Value> attribute = argument(a, 1, "attribute");
      std::string out;
      bool first = true;
      for (const Value& item : sequence_of(v, "join")) {
        if (!first) out += separator ? separator->str() : "";
        first = false;
        out += (attribute ? attribute_path(item, attribute->str()) : item).str();
      }
      return Value::string(std::move(out));
    };
    f["list"] = [](const Value& v, const Arguments&) { return Value::list(sequence_of(v, "list")); };
    f["default"] = [](const Value& v, const Arguments& a) {
      const bool boolean = argument(a, 1, "boolean").value_or(Value::boolean(false)).truthy();
      if (v.is_undefined() || (boolean && !v.truthy())) return argument(a, 0, "default_value").value_or(Value::string(""));
      return v;
    };
    f["d"] = f["default"];
    f["items"] = [](const Value& v, const Arguments&) { return Value::list(items_of(v, "items")); };
    f["select"] = [](const Value& v, const Arguments& a) { return select(v, a, false, true, "select"); };
    f["reject"] = [](const Value& v, const Arguments& a) { return select(v, a, false, false, "reject"); };
    f["selectattr"] = [](const Value& v, const Arguments& a) { return select(v, a, true, true, "selectattr"); };
    f["rejectattr"] = [](const Value& v, const Arguments& a) { return select(v, a, true, false, "rejectattr"); };
    f["map"] = [](const Value& v, const Arguments& a) {
      List mapped;
      const std::optional<Value> attribute = keyword(a, "attribute");
      for (const Value& item : sequence_of(v, "map")) {
        if (attribute) {
          Value found = attribute_path(item, attribute->str());
          if (found.is_undefined()) found = keyword(a, "default").value_or(Value());
          mapped.push_back(found);
        } else {
          if (a.positional.empty()) throw RenderError("map: give a filter name or attribute=");
          const std::string filter = string_of(a.positional[0], "map");
          if (!is_filter(filter)) throw RenderError(fmt::format("map: no filter named '{}'", filter));
          Arguments rest;
          rest.positional.assign(a.positional.begin() + 1, a.positional.end());
          rest.keyword = a.keyword;
          mapped.push_back(apply_filter(filter, item, rest));
        }
      }
      return Value::list(std::move(mapped));
    };
    f["replace"] = [](const Value& v, const Arguments& a) {
      const int64_t count = argument(a, 2, "count").value_or(Value::integer(-1)).as_int();
      return Value::string(replace(v.str(), string_argument(a, 0, "old", "replace"), string_argument(a, 1, "new", "replace"), count));
    };
    // jinja2's int: int(value), else int(float(value)), else the default.
    f["int"] = [](const Value& v, const Arguments& a) {
      if (v.kind() == Value::Kind::real) return Value::integer(static_cast<int64_t>(v.as_double()));
      if (v.is_number()) return Value::integer(v.as_int());
      if (v.is_string()) {
        const std::string text = strip(v.as_string(), std::nullopt, true, true);
        const char* end = text.data() + text.size();
        int64_t whole = 0;
        if (auto [at, error] = std::from_chars(text.data(), end, whole); error == std::errc() && at == end) return Value::integer(whole);
        double real = 0;
        if (auto [at, error] = std::from_chars(text.data(), end, real); error == std::errc() && at == end && std::isfinite(real)) {
          return Value::integer(static_cast<int64_t>(real));
        }
      }
      return argument(a, 0, "default").value_or(Value::integer(0));
    };
    f["abs"] = [](const Value& v, const Arguments&) {
      if (v.kind() == Value::Kind::real) return Value::real(std::abs(v.as_double()));
      if (v.is_number()) return Value::integer(std::abs(v.as_int()));
      throw RenderError(fmt::format("abs: bad operand type '{}'", v.type_name()));
    };
    return f;
  }();
  return table;
}

using Test = std::function<bool(const Value&, const Arguments&)>;

const Value& test_argument(const Arguments& a, const char* test) {
  if (a.positional.empty()) throw RenderError(fmt::format("the test '{}' needs an argument", test));
  return a.positional[0];
}

const std::map<std::string, Test>& tests() {
  static const std::map<std::string, Test> table = [] {
    std::map<std::string, Test> t;
    t["defined"] = [](const Value& v, const Arguments&) { return !v.is_undefined(); };
    t["undefined"] = [](const Value& v, const Arguments&) { return v.is_undefined(); };
    t["none"] = [](const Value& v, const Arguments&) { return v.is_none(); };
    t["string"] = [](const Value& v, const Arguments&) { return v.is_string(); };
    t["number"] = [](const Value& v, const Arguments&) { return v.is_number(); };
    t["integer"] = [](const Value& v, const Arguments&) { return v.kind() == Value::Kind::integer; };
    t["float"] = [](const Value& v, const Arguments&) { return v.kind() == Value::Kind::real; };
    t["boolean"] = [](const Value& v, const Arguments&) { return v.kind() == Value::Kind::boolean; };
    t["true"] = [](const Value& v, const Arguments&) { return v.kind() == Value::Kind::boolean && v.as_bool(); };
    t["false"] = [](const Value& v, const Arguments&) { return v.kind() == Value::Kind::boolean && !v.as_bool(); };
    t["mapping"] = [](const Value& v, const Arguments&) { return v.kind() == Value::Kind::dict; };
    // Undefined iterates (as nothing) in jinja2; a namespace does not.
    t["iterable"] = [](const Value& v, const Arguments&) {
      return v.is_undefined() || v.is_string() || v.is_list() || v.kind() == Value::Kind::dict;
    };
    t["sequence"] = [](const Value& v, const Arguments&) { return v.is_string() || v.is_list() || v.kind() == Value::Kind::dict; };
    t["equalto"] = [](const Value& v, const Arguments& a) { return equal(v, test_argument(a, "equalto")); };
    t["eq"] = t["equalto"];
    t["sameas"] = [](const Value& v, const Arguments& a) {
      const Value& other = test_argument(a, "sameas");  // identity: of the singletons None, True and False
      return v.kind() == other.kind() && (v.is_none() || (v.kind() == Value::Kind::boolean && v.as_bool() == other.as_bool()));
    };
    t["ne"] = [](const Value& v, const Arguments& a) { return !equal(v, test_argument(a, "ne")); };
    t["in"] = [](const Value& v, const Arguments& a) {
      const Value& container = test_argument(a, "in");
      if (container.is_string()) return v.is_string() && container.as_string().find(v.as_string()) != std::string::npos;
      if (container.kind() == Value::Kind::dict) return v.is_string() && container.has(v.as_string());
      if (!container.is_list()) return false;
      return std::any_of(container.as_list().begin(), container.as_list().end(), [&](const Value& item) { return equal(item, v); });
    };
    t["odd"] = [](const Value& v, const Arguments&) { return v.is_number() && v.as_int() % 2 != 0; };
    t["even"] = [](const Value& v, const Arguments&) { return v.is_number() && v.as_int() % 2 == 0; };
    t["divisibleby"] = [](const Value& v, const Arguments& a) {
      const int64_t by = test_argument(a, "divisibleby").as_int();
      if (by == 0) throw RenderError("divisibleby: division by zero");
      return v.as_int() % by == 0;
    };
    return t;
  }();
  return table;
}

const char* const kFunctions[] = {"raise_exception", "strftime_now", "range", "namespace"};
const char* const kMethods[] = {"strip", "lstrip", "rstrip", "split", "startswith", "endswith", "upper", "lower",
                                "replace", "capitalize", "get", "items", "keys", "values"};

}  // namespace

bool is_filter(const std::string& name) { return filters().count(name) > 0; }
bool is_test(const std::string& name) { return tests().count(name) > 0; }
bool is_function(const std::string& name) { return std::find(std::begin(kFunctions), std::end(kFunctions), name) != std::end(kFunctions); }
bool is_method(const std::string& name) { return std::find(std::begin(kMethods), std::end(kMethods), name) != std::end(kMethods); }

Value apply_filter(const std::string& name, const Value& value, const Arguments& arguments) {
  return filters().at(name)(value, arguments);
}

bool apply_test(const std::string& name, const Value& value, const Arguments& arguments) {
  return tests().at(name)(value, arguments);
}

Value call_function(const std::string& name, const Arguments& arguments) {
  if (name == "raise_exception") throw TemplateRaised(argument(arguments, 0, "message").value_or(Value()).str());
  if (name == "strftime_now") {
    const std::string format = string_argument(arguments, 0, "format", "strftime_now");
    const std::time_t now = std::time(nullptr);
    std::tm local{};
    localtime_r(&now, &local);
    char buffer[256];
    const size_t length = std::strftime(buffer, sizeof buffer, format.c_str(), &local);
    return Value::string(std::string(buffer, length));
  }
  if (name == "range") {
    std::vector<int64_t> bounds;
    for (const Value& v : arguments.positional) {
      if (v.kind() != Value::Kind::integer && v.kind() != Value::Kind::boolean) throw RenderError("range: arguments must be integers");
      bounds.push_back(v.as_int());
    }
    if (bounds.empty() || bounds.size() > 3) throw RenderError("range: expected 1 to 3 integers");
    const int64_t start = bounds.size() > 1 ? bounds[0] : 0;
    const int64_t stop = bounds.size() > 1 ? bounds[1] : bounds[0];
    const int64_t step = bounds.size() > 2 ? bounds[2] : 1;
    if (step == 0) throw RenderError("range: step must not be zero");
    // jinja2's sandbox refuses ranges of more than 100000 items (MAX_RANGE).
    const int64_t count = step > 0 ? (stop - start + step - 1) / step : (start - stop - step - 1) / -step;
    if (count > 100000) throw RenderError(fmt::format("range: {} items; the sandbox allows at most 100000", count));
    List items;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) items.push_back(Value::integer(i));
    return Value::list(std::move(items));
  }
  // namespace(key=value, ...), or namespace(a_dict).
  Dict attributes;
  for (const Value& v : arguments.positional) {
    if (v.kind() != Value::Kind::dict) throw RenderError("namespace: a positional argument must be a dict");
    attributes.insert(attributes.end(), v.as_dict().begin(), v.as_dict().end());
  }
  for (const auto& [key, v] : arguments.keyword) attributes.emplace_back(key, v);
  return Value::ns(std::move(attributes));
}

Value call_method(const Value& object, const std::string& name, const Arguments& arguments) {
  if (object.is_string()) {
    const std::string& text = object.as_string();
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
      return Value::string(strip(text, argument(arguments, 0, "chars"), name != "rstrip", name != "lstrip"));
    }
    if (name == "split") {
      return split(text, argument(arguments, 0, "sep"), argument(arguments, 1, "maxsplit").value_or(Value::integer(-1)).as_int());
    }
    if (name == "startswith" || name == "endswith") {
      const std::string affix = string_argument(arguments, 0, "prefix", name.c_str());
      const bool fits = affix.size() <= text.size() &&
                        (name == "startswith" ? text.compare(0, affix.size(), affix) == 0
                                              : text.compare(text.size() - affix.size(), affix.size(), affix) == 0);
      return Value::boolean(fits);
    }
    if (name == "upper") return apply_filter("upper", object, {});
    if (name == "lower") return apply_filter("lower", object, {});
    if (name == "capitalize") return apply_filter("capitalize", object, {});
    if (name == "replace") return apply_filter("replace", object, arguments);
  }
  if (object.kind() == Value::Kind::dict) {
    if (name == "get") {
      const std::string key = string_argument(arguments, 0, "key", "get");
      return object.has(key) ? object.get(key) : argument(arguments, 1, "default").value_or(Value::none());
    }
    if (name == "items") return Value::list(items_of(object, "items"));
    if (name == "keys" || name == "values") {
      List out;
      for (const auto& [key, item] : object.as_dict()) out.push_back(name == "keys" ? Value::string(key) : item);
      return Value::list(std::move(out));
    }
  }
  if (object.is_undefined()) throw RenderError(fmt::format("an undefined value has no method '{}'", name));
  throw RenderError(fmt::format("'{}' object has no method '{}'", object.type_name(), name));
}

}  // namespace paraflow::infer::jinja
