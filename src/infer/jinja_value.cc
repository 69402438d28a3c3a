#include "infer/jinja_value.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>

#include "base/utf8.h"

namespace paraflow::infer::jinja {

Value Value::boolean(bool b) {
  Value v(Kind::boolean);
  v.b_ = b;
  v.i_ = b ? 1 : 0;
  return v;
}

Value Value::integer(int64_t i) {
  Value v(Kind::integer);
  v.i_ = i;
  return v;
}

Value Value::real(double d) {
  Value v(Kind::real);
  v.d_ = d;
  return v;
}

Value Value::string(std::string s) {
  Value v(Kind::string);
  v.s_ = std::move(s);
  return v;
}

Value Value::list(List items) {
  Value v(Kind::list);
  v.list_ = std::make_shared<List>(std::move(items));
  return v;
}

Value Value::dict(Dict items) {
  Value v(Kind::dict);
  v.dict_ = std::make_shared<Dict>(std::move(items));
  return v;
}

Value Value::ns(Dict attributes) {
  Value v = dict(std::move(attributes));
  v.kind_ = Kind::ns;
  return v;
}

Value Value::function(std::string name) {
  Value v(Kind::function);
  v.s_ = std::move(name);
  return v;
}

Value Value::from_json(const nlohmann::ordered_json& json) {
  switch (json.type()) {
    case nlohmann::ordered_json::value_t::null: return none();
    case nlohmann::ordered_json::value_t::boolean: return boolean(json.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return integer(json.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: return integer(static_cast<int64_t>(json.get<uint64_t>()));
    case nlohmann::ordered_json::value_t::number_float: return real(json.get<double>());
    case nlohmann::ordered_json::value_t::string: return string(json.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List items;
      for (const auto& item : json) items.push_back(from_json(item));
      return list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict items;
      for (const auto& [key, item] : json.items()) items.emplace_back(key, from_json(item));
      return dict(std::move(items));
    }
    default: throw RenderError("a template variable holds binary data, which templates cannot use");
  }
}

double Value::as_double() const { return kind_ == Kind::real ? d_ : static_cast<double>(i_); }

Value Value::get(const std::string& key) const {
  if (!is_mapping()) return {};
  for (const auto& [name, value] : *dict_) {
    if (name == key) return value;
  }
  return {};
}

bool Value::has(const std::string& key) const {
  return is_mapping() && std::any_of(dict_->begin(), dict_->end(), [&](const auto& item) { return item.first == key; });
}

void Value::set_attribute(const std::string& key, Value value) const {
  for (auto& [name, held] : *dict_) {
    if (name == key) {
      held = std::move(value);
      return;
    }
  }
  dict_->emplace_back(key, std::move(value));
}

bool Value::truthy() const {
  switch (kind_) {
    case Kind::undefined:
    case Kind::none: return false;
    case Kind::boolean: return b_;
    case Kind::integer: return i_ != 0;
    case Kind::real: return d_ != 0;
    case Kind::string: return !s_.empty();
    case Kind::list: return !list_->empty();
    case Kind::dict: return !dict_->empty();
    case Kind::ns:
    case Kind::function: return true;
  }
  return false;
}

namespace {

// Python's str.isprintable() for the characters chat text holds: controls, the separators other
// than the space, and the zero-width format characters are not printable.
bool is_printable(char32_t c) {
  if (c < 0x20 || (c >= 0x7f && c <= 0xa0) || c == 0xad) return false;
  if (c == 0x1680 || (c >= 0x2000 && c <= 0x200f) || (c >= 0x2028 && c <= 0x202f) || (c >= 0x205f && c <= 0x2064)) {
    return false;
  }
  return c != 0x3000 && c != 0xfeff;
}

std::string string_repr(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (char32_t c : decode_utf8(s)) {
    if (c == '\\' || c == static_cast<char32_t>(quote)) {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (!is_printable(c)) {
      out += c <= 0xff ? fmt::format("\\x{:02x}", static_cast<uint32_t>(c)) : fmt::format("\\u{:04x}", static_cast<uint32_t>(c));
    } else {
      out += encode_utf8(std::u32string(1, c));
    }
  }
  return out + quote;
}

void json_string(const std::string& s, bool ensure_ascii, std::string& out) {
  out += '"';
  for (char32_t c : decode_utf8(s)) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20 || (ensure_ascii && c >= 0x7f)) {
          if (c > 0xffff) {  // a surrogate pair, as Python writes one
            const char32_t v = c - 0x10000;
            out += fmt::format("\\u{:04x}\\u{:04x}", 0xd800 + (v >> 10), 0xdc00 + (v & 0x3ff));
          } else {
            out += fmt::format("\\u{:04x}", static_cast<uint32_t>(c));
          }
        } else {
          out += encode_utf8(std::u32string(1, c));
        }
    }
  }
  out += '"';
}

void json_value(const Value& value, const JsonStyle& style, int depth, std::string& out) {
  const bool indented = style.indent >= 0;
  const std::string item_separator = !style.item_separator.empty() ? style.item_separator : indented ? "," : ", ";
  const auto newline = [&](int level) {
    if (indented) out += '\n' + std::string(static_cast<size_t>(style.indent * level), ' ');
  };
  switch (value.kind()) {
    case Value::Kind::none: out += "null"; return;
    case Value::Kind::boolean: out += value.as_bool() ? "true" : "false"; return;
    case Value::Kind::integer: out += std::to_string(value.as_int()); return;
    case Value::Kind::real: {
      const double d = value.as_double();
      out += std::isnan(d) ? "NaN" : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity") : float_repr(d);
      return;
    }
    case Value::Kind::string: json_string(value.as_string(), style.ensure_ascii, out); return;
    case Value::Kind::list: {
      if (value.as_list().empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < value.as_list().size(); ++i) {
        if (i > 0) out += item_separator;
        newline(depth + 1);
        json_value(value.as_list()[i], style, depth + 1, out);
      }
      newline(depth);
      out += ']';
      return;
    }
    case Value::Kind::dict: {
      if (value.as_dict().empty()) {
        out += "{}";
        return;
      }
      Dict items = value.as_dict();
      if (style.sort_keys) {
        std::stable_sort(items.begin(), items.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
      }
      out += '{';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out += item_separator;
        newline(depth + 1);
        json_string(items[i].first, style.ensure_ascii, out);
        out += style.key_separator;
        json_value(items[i].second, style, depth + 1, out);
      }
      newline(depth);
      out += '}';
      return;
    }
    case Value::Kind::undefined:
    case Value::Kind::ns:
    case Value::Kind::function:
      throw RenderError(fmt::format("tojson: Object of type {} is not JSON serializable", value.type_name()));
  }
}

}  // namespace

std::string Value::str() const {
  switch (kind_) {
    case Kind::undefined: return "";
    case Kind::none: return "None";
    case Kind::boolean: return b_ ? "True" : "False";
    case Kind::integer: return std::to_string(i_);
    case Kind::real: return float_repr(d_);
    case Kind::string: return s_;
    case Kind::list: {
      std::string out = "[";
      for (size_t i = 0; i < list_->size(); ++i) out += (i ? ", " : "") + (*list_)[i].repr();
      return out + "]";
    }
    case Kind::dict:
    case Kind::ns: {
      std::string out = kind_ == Kind::ns ? "<Namespace {" : "{";
      for (size_t i = 0; i < dict_->size(); ++i) {
        out += (i ? ", " : "") + string_repr((*dict_)[i].first) + ": " + (*dict_)[i].second.repr();
      }
      return out + (kind_ == Kind::ns ? "}>" : "}");
    }
    case Kind::function: return "<function " + s_ + ">";
  }
  return "";
}

std::string Value::repr() const {
  if (kind_ == Kind::string) return string_repr(s_);
  if (kind_ == Kind::undefined) return "Undefined";
  return str();
}

const char* Value::type_name() const {
  switch (kind_) {
    case Kind::undefined: return "Undefined";
    case Kind::none: return "NoneType";
    case Kind::boolean: return "bool";
    case Kind::integer: return "int";
    case Kind::real: return "float";
    case Kind::string: return "str";
    case Kind::list: return "list";
    case Kind::dict: return "dict";
    case Kind::ns: return "Namespace";
    case Kind::function: return "function";
  }
  return "?";
}

bool equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind() == Value::Kind::real || b.kind() == Value::Kind::real) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::undefined:
    case Value::Kind::none: return true;
    case Value::Kind::string: return a.as_string() == b.as_string();
    case Value::Kind::list:
      return std::equal(a.as_list().begin(), a.as_list().end(), b.as_list().begin(), b.as_list().end(), equal);
    case Value::Kind::dict:
      // Python's dict equality: the same keys with equal values, in any order.
      return a.as_dict().size() == b.as_dict().size() &&
             std::all_of(a.as_dict().begin(), a.as_dict().end(),
                         [&](const auto& item) { return b.has(item.first) && equal(item.second, b.get(item.first)); });
    case Value::Kind::ns: return &a.as_dict() == &b.as_dict();
    case Value::Kind::function: return a.as_string() == b.as_string();
    default: return false;
  }
}

bool less(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) return a.as_double() < b.as_double();
  if (a.is_string() && b.is_string()) return a.as_string() < b.as_string();  // UTF-8 bytes order as code points
  if (a.is_list() && b.is_list()) {
    return std::lexicographical_compare(a.as_list().begin(), a.as_list().end(), b.as_list().begin(), b.as_list().end(), less);
  }
  throw RenderError(fmt::format("'<' not supported between instances of '{}' and '{}'", a.type_name(), b.type_name()));
}

std::string to_json(const Value& value, const JsonStyle& style) {
  std::string out;
  json_value(value, style, 0, out);
  return out;
}

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  // The shortest digits that round-trip, then Python's layout: positional for exponents -4..15.
  char buffer[64];
  const auto result = std::to_chars(buffer, buffer + sizeof buffer, d, std::chars_format::scientific);
  const std::string scientific(buffer, result.ptr);
  const size_t e = scientific.find('e');
  std::string mantissa = scientific.substr(0, e);
  const int exponent = std::stoi(scientific.substr(e + 1));
  const bool negative = mantissa[0] == '-';
  if (negative) mantissa.erase(0, 1);
  std::string digits = mantissa.substr(0, 1);
  if (mantissa.size() > 2) digits.append(mantissa, 2);
  std::string out = negative ? "-" : "";
  if (exponent >= -4 && exponent < 16) {
    const auto point = static_cast<size_t>(exponent + 1);  // digits before the decimal point
    if (exponent < 0) {
      out.append("0.").append(static_cast<size_t>(-exponent - 1), '0').append(digits);
    } else if (digits.size() <= point) {
      out.append(digits).append(point - digits.size(), '0').append(".0");
    } else {
      out.append(digits, 0, point).append(".").append(digits, point);
    }
  } else {
    out.append(digits, 0, 1);
    if (digits.size() > 1) out.append(".").append(digits, 1);
    out.append(fmt::format("e{}{:02d}", exponent < 0 ? '-' : '+', std::abs(exponent)));
  }
  return out;
}

std::u32string decode_utf8(const std::string& text) {
  std::u32string out;
  out.reserve(text.size());
  const auto* bytes = reinterpret_cast<const unsigned char*>(text.data());
  for (size_t i = 0; i < text.size();) {
    const int length = utf8_sequence_length(bytes[i]);
    if (length == 0 || i + static_cast<size_t>(length) > text.size()) {
      throw RenderError(fmt::format("a template string is not valid UTF-8 (byte {} of {})", i, text.size()));
    }
    out += utf8_code_point(bytes + i, length);
    i += static_cast<size_t>(length);
  }
  return out;
}

std::string encode_utf8(const std::u32string& text) {
  std::string out;
  for (char32_t c : text) append_utf8(c, out);
  return out;
}

bool is_python_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

}  // namespace paraflow::infer::jinja
