// Renders a parsed template with jinja2's semantics: Python's operators and truth, Undefined for
// what is missing, and jinja2's scoping (a `set` inside a for loop lasts for that iteration only
// and is invisible after the loop; a namespace's attributes are shared, so loops use them to carry
// state out).
#include <fmt/format.h>

#include <cmath>
#include <unordered_map>

#include "infer/jinja.h"

namespace paraflow::infer::jinja {

namespace {

Value arithmetic(const std::string& op, const Value& a, const Value& b) {
  const auto unsupported = [&]() -> Value {
    if (a.is_undefined() || b.is_undefined()) throw RenderError(fmt::format("an undefined value used with '{}'", op));
    throw RenderError(fmt::format("unsupported operand type(s) for {}: '{}' and '{}'", op, a.type_name(), b.type_name()));
  };
  if (op == "~") return Value::string(a.str() + b.str());
  if (a.is_number() && b.is_number()) {
    if ((op == "/" || op == "//" || op == "%") && b.as_double() == 0) {
      throw RenderError(op == "%" ? "modulo by zero" : "division by zero");
    }
    if (op == "/") return Value::real(a.as_double() / b.as_double());  // true division, as Python 3's
    if (a.kind() == Value::Kind::real || b.kind() == Value::Kind::real) {
      const double x = a.as_double(), y = b.as_double();
      if (op == "+") return Value::real(x + y);
      if (op == "-") return Value::real(x - y);
      if (op == "*") return Value::real(x * y);
      if (op == "//") return Value::real(std::floor(x / y));
      if (op == "%") return Value::real(x - y * std::floor(x / y));
      if (op == "**") return Value::real(std::pow(x, y));
    } else {
      const int64_t x = a.as_int(), y = b.as_int();
      if (op == "+") return Value::integer(x + y);
      if (op == "-") return Value::integer(x - y);
      if (op == "*") return Value::integer(x * y);
      if (op == "//" || op == "%") {
        // Python's floor division and modulo round toward negative infinity.
        const int64_t quotient = x / y - (x % y != 0 && (x < 0) != (y < 0) ? 1 : 0);
        return Value::integer(op == "//" ? quotient : x - y * quotient);
      }
      if (op == "**") return y >= 0 ? Value::integer(static_cast<int64_t>(std::pow(x, y))) : Value::real(std::pow(x, y));
    }
  }
  if (op == "+" && a.is_string() && b.is_string()) return Value::string(a.as_string() + b.as_string());
  if (op == "+" && a.is_list() && b.is_list()) {
    List items = a.as_list();
    items.insert(items.end(), b.as_list().begin(), b.as_list().end());
    return Value::list(std::move(items));
  }
  if (op == "*" && (a.is_string() || a.is_list()) && b.kind() == Value::Kind::integer) return arithmetic(op, b, a);
  if (op == "*" && a.kind() == Value::Kind::integer && (b.is_string() || b.is_list())) {
    // A guard jinja2 lacks: a repetition that would need gigabytes fails instead of the server.
    const size_t size = b.is_string() ? b.as_string().size() : b.as_list().size();
    if (a.as_int() > 0 && size > 0 && static_cast<uint64_t>(a.as_int()) > (uint64_t{1} << 26) / size) {
      throw RenderError(fmt::format("'{}' * {}: more than 64 Mi items", b.type_name(), a.as_int()));
    }
    if (b.is_string()) {
      std::string text;
      for (int64_t i = 0; i < a.as_int(); ++i) text += b.as_string();
      return Value::string(std::move(text));
    }
    List items;
    for (int64_t i = 0; i < a.as_int(); ++i) items.insert(items.end(), b.as_list().begin(), b.as_list().end());
    return Value::list(std::move(items));
  }
  return unsupported();
}

bool contains(const Value& container, const Value& item) {
  if (container.is_string()) {
    if (!item.is_string()) {
      throw RenderError(fmt::format("'in <string>' requires string as left operand, not {}", item.type_name()));
    }
    return container.as_string().find(item.as_string()) != std::string::npos;
  }
  if (container.is_list()) {
    for (const Value& each : container.as_list()) {
      if (equal(each, item)) return true;
    }
    return false;
  }
  if (container.kind() == Value::Kind::dict) return item.is_string() && container.has(item.as_string());
  if (container.is_undefined()) return false;  // Undefined iterates as empty
  throw RenderError(fmt::format("argument of type '{}' is not iterable", container.type_name()));
}

bool compare(const std::string& op, const Value& a, const Value& b) {
  if (op == "==") return equal(a, b);
  if (op == "!=") return !equal(a, b);
  if (op == "<") return less(a, b);
  if (op == ">") return less(b, a);
  if (op == "<=") return !less(b, a);
  if (op == ">=") return !less(a, b);
  if (op == "in") return contains(b, a);
  return !contains(b, a);  // not in
}

// Python's seq[start:stop:step] indices.
std::vector<size_t> slice_indices(int64_t size, const Value& start, const Value& stop, const Value& step) {
  const auto bound = [](const Value& v, const char* what) -> std::optional<int64_t> {
    if (v.is_none() || v.is_undefined()) return std::nullopt;
    if (v.kind() != Value::Kind::integer && v.kind() != Value::Kind::boolean) {
      throw RenderError(fmt::format("slice {} must be an integer or None, not {}", what, v.type_name()));
    }
    return v.as_int();
  };
  const int64_t s = bound(step, "step").value_or(1);
  if (s == 0) throw RenderError("slice step cannot be zero");
  const auto clamp = [&](std::optional<int64_t> i, int64_t fallback) {
    if (!i) return fallback;
    int64_t v = *i < 0 ? *i + size : *i;
    if (s > 0) return std::clamp<int64_t>(v, 0, size);
    return std::clamp<int64_t>(v, -1, size - 1);
  };
  const int64_t first = clamp(bound(start, "start"), s > 0 ? 0 : size - 1);
  const int64_t last = clamp(bound(stop, "stop"), s > 0 ? size : -1);
  std::vector<size_t> indices;
  for (int64_t i = first; s > 0 ? i < last : i > last; i += s) indices.push_back(static_cast<size_t>(i));
  return indices;
}

class Renderer {
 public:
  Renderer(const std::string& name, const nlohmann::ordered_json& context) : name_(name) {
    scopes_.emplace_back();
    for (const auto& [key, value] : context.items()) scopes_.back()[key] = Value::from_json(value);
  }

  std::string render(const Body& body) {
    try {
      run(body);
    } catch (const RenderError& error) {
      throw RenderError(fmt::format("{} line {}: {}", name_, line_, error.what()));
    }
    return std::move(out_);
  }

 private:
  enum class Flow { normal, break_loop, continue_loop };

  Flow run(const Body& body) {
    for (const auto& node : body) {
      line_ = node->line;
      switch (node->kind) {
        case Node::Kind::text: out_ += node->text; break;
        case Node::Kind::output: out_ += eval(*node->expr).str(); break;
        case Node::Kind::if_chain: {
          size_t branch = 0;
          while (branch < node->conditions.size() && !eval(*node->conditions[branch]).truthy()) ++branch;
          if (branch < node->bodies.size()) {
            if (const Flow flow = run(node->bodies[branch]); flow != Flow::normal) return flow;
          }
          break;
        }
        case Node::Kind::for_loop: for_loop(*node); break;
        case Node::Kind::set: {
          Value value = eval(*node->expr);
          if (node->targets.size() == 1) {
            scopes_.back()[node->targets[0]] = std::move(value);
          } else {
            const Value holder = lookup(node->targets[0]);
            if (holder.kind() != Value::Kind::ns) {
              throw RenderError(fmt::format("cannot assign attribute on non-namespace object '{}'", node->targets[0]));
            }
            holder.set_attribute(node->targets[1], std::move(value));
          }
          break;
        }
        case Node::Kind::scope: {
          scopes_.emplace_back();
          const Flow flow = run(node->bodies[0]);
          scopes_.pop_back();
          if (flow != Flow::normal) return flow;
          break;
        }
        case Node::Kind::break_loop: return Flow::break_loop;
        case Node::Kind::continue_loop: return Flow::continue_loop;
      }
    }
    return Flow::normal;
  }

  static List iterate(const Value& value) {
    switch (value.kind()) {
      case Value::Kind::undefined: return {};
      case Value::Kind::list: return value.as_list();
      case Value::Kind::dict: {
        List keys;
        for (const auto& [key, item] : value.as_dict()) keys.push_back(Value::string(key));
        return keys;
      }
      case Value::Kind::string: {
        List characters;
        for (char32_t c : decode_utf8(value.as_string())) characters.push_back(Value::string(encode_utf8(std::u32string(1, c))));
        return characters;
      }
      default: throw RenderError(fmt::format("'{}' object is not iterable", value.type_name()));
    }
  }

  void bind(const std::vector<std::string>& targets, const Value& item) {
    if (targets.size() == 1) {
      scopes_.back()[targets[0]] = item;
      return;
    }
    const List parts = iterate(item);
    if (parts.size() != targets.size()) {
      throw RenderError(fmt::format("cannot unpack {} values into {} loop variables", parts.size(), targets.size()));
    }
    for (size_t i = 0; i < targets.size(); ++i) scopes_.back()[targets[i]] = parts[i];
  }

  void for_loop(const Node& node) {
    List items = iterate(eval(*node.expr));
    if (node.condition) {  // `for x in xs if cond`: loop.length counts the items kept
      List kept;
      for (const Value& item : items) {
        scopes_.emplace_back();
        bind(node.targets, item);
        const bool keep = eval(*node.condition).truthy();
        scopes_.pop_back();
        if (keep) kept.push_back(item);
      }
      items = std::move(kept);
    }
    const auto length = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < length; ++i) {
      scopes_.emplace_back();  // each iteration's own: what it sets ends with it
      bind(node.targets, items[static_cast<size_t>(i)]);
      scopes_.back()["loop"] = Value::dict({{"index", Value::integer(i + 1)},
                                            {"index0", Value::integer(i)},
                                            {"revindex", Value::integer(length - i)},
                                            {"revindex0", Value::integer(length - i - 1)},
                                            {"first", Value::boolean(i == 0)},
                                            {"last", Value::boolean(i == length - 1)},
                                            {"length", Value::integer(length)},
                                            {"depth", Value::integer(1)},
                                            {"depth0", Value::integer(0)},
                                            {"previtem", i > 0 ? items[static_cast<size_t>(i - 1)] : Value()},
                                            {"nextitem", i + 1 < length ? items[static_cast<size_t>(i + 1)] : Value()}});
      const Flow flow = run(node.bodies[0]);
      scopes_.pop_back();
      if (flow == Flow::break_loop) break;
    }
    if (length == 0 && node.bodies.size() > 1) run(node.bodies[1]);
  }

  Value lookup(const std::string& name) const {
    for (auto scope = scopes_.rbegin(); scope != scopes_.rend(); ++scope) {
      if (const auto found = scope->find(name); found != scope->end()) return found->second;
    }
    if (is_function(name)) return Value::function(name);  // `strftime_now is defined` is true
    return {};
  }

  Arguments arguments(const Expr& call, size_t first) {
    Arguments arguments;
    for (size_t i = first; i < call.args.size(); ++i) arguments.positional.push_back(eval(*call.args[i]));
    for (const auto& [key, value] : call.kwargs) arguments.keyword.emplace_back(key, eval(*value));
    return arguments;
  }

  Value eval(const Expr& expr) {
    line_ = expr.line;
    switch (expr.kind) {
      case Expr::Kind::literal: return expr.value;
      case Expr::Kind::name: return lookup(expr.name);
      case Expr::Kind::list: {
        List items;
        for (const auto& item : expr.args) items.push_back(eval(*item));
        return Value::list(std::move(items));
      }
      case Expr::Kind::dict: {
        Dict items;
        for (size_t i = 0; i < expr.args.size(); i += 2) {
          const Value key = eval(*expr.args[i]);
          if (!key.is_string()) throw RenderError(fmt::format("a dict key must be a string here, not {}", key.type_name()));
          Value value = eval(*expr.args[i + 1]);
          const auto same = std::find_if(items.begin(), items.end(), [&](const auto& item) { return item.first == key.as_string(); });
          if (same != items.end()) same->second = std::move(value);
          else items.emplace_back(key.as_string(), std::move(value));
        }
        return Value::dict(std::move(items));
      }
      case Expr::Kind::attribute: {
        const Value object = eval(*expr.args[0]);
        if (object.is_undefined()) throw RenderError(fmt::format("an undefined value has no attribute '{}'", expr.name));
        return object.get(expr.name);
      }
      case Expr::Kind::subscript: return subscript(eval(*expr.args[0]), eval(*expr.args[1]));
      case Expr::Kind::slice: {
        const Value object = eval(*expr.args[0]);
        const auto part = [&](size_t i) { return expr.args[i] ? eval(*expr.args[i]) : Value::none(); };
        const Value start = part(1), stop = part(2), step = part(3);
        if (object.is_list()) {
          List items;
          for (size_t i : slice_indices(static_cast<int64_t>(object.as_list().size()), start, stop, step)) items.push_back(object.as_list()[i]);
          return Value::list(std::move(items));
        }
        if (object.is_string()) {
          const std::u32string text = decode_utf8(object.as_string());
          std::u32string sliced;
          for (size_t i : slice_indices(static_cast<int64_t>(text.size()), start, stop, step)) sliced += text[i];
          return Value::string(encode_utf8(sliced));
        }
        if (object.is_undefined()) throw RenderError("an undefined value cannot be sliced");
        return {};
      }
      case Expr::Kind::call: {
        if (!expr.method) return call_function(expr.name, arguments(expr, 0));
        const Value object = eval(*expr.args[0]);
        return call_method(object, expr.name, arguments(expr, 1));
      }
      case Expr::Kind::filter: {
        const Value value = eval(*expr.args[0]);
        return apply_filter(expr.name, value, arguments(expr, 1));
      }
      case Expr::Kind::test: {
        const Value value = eval(*expr.args[0]);
        return Value::boolean(apply_test(expr.name, value, arguments(expr, 1)) != expr.negated);
      }
      case Expr::Kind::unary: {
        const Value operand = eval(*expr.args[0]);
        if (expr.name == "not") return Value::boolean(!operand.truthy());
        if (!operand.is_number()) throw RenderError(fmt::format("bad operand type for unary {}: '{}'", expr.name, operand.type_name()));
        if (expr.name == "+") return operand.kind() == Value::Kind::real ? operand : Value::integer(operand.as_int());
        return operand.kind() == Value::Kind::real ? Value::real(-operand.as_double()) : Value::integer(-operand.as_int());
      }
      case Expr::Kind::binary: {
        Value left = eval(*expr.args[0]);
        // `and` / `or` give one of their operands, as in Python.
        if (expr.name == "and") return left.truthy() ? eval(*expr.args[1]) : left;
        if (expr.name == "or") return left.truthy() ? left : eval(*expr.args[1]);
        const Value right = eval(*expr.args[1]);
        line_ = expr.line;
        return arithmetic(expr.name, left, right);
      }
      case Expr::Kind::compare: {
        Value left = eval(*expr.args[0]);
        for (size_t i = 0; i < expr.ops.size(); ++i) {
          Value right = eval(*expr.args[i + 1]);
          line_ = expr.line;
          if (!compare(expr.ops[i], left, right)) return Value::boolean(false);
          left = std::move(right);
        }
        return Value::boolean(true);
      }
      case Expr::Kind::conditional:
        if (eval(*expr.args[1]).truthy()) return eval(*expr.args[0]);
        return expr.args[2] ? eval(*expr.args[2]) : Value();
    }
    return {};
  }

  static Value subscript(const Value& object, const Value& key) {
    if (object.is_undefined()) throw RenderError(fmt::format("an undefined value has no item {}", key.repr()));
    if (object.is_mapping()) return key.is_string() ? object.get(key.as_string()) : Value();
    if ((object.is_list() || object.is_string()) && (key.kind() == Value::Kind::integer || key.kind() == Value::Kind::boolean)) {
      if (object.is_list()) {
        const auto size = static_cast<int64_t>(object.as_list().size());
        const int64_t i = key.as_int() < 0 ? key.as_int() + size : key.as_int();
        return i >= 0 && i < size ? object.as_list()[static_cast<size_t>(i)] : Value();
      }
      const std::u32string text = decode_utf8(object.as_string());
      const auto size = static_cast<int64_t>(text.size());
      const int64_t i = key.as_int() < 0 ? key.as_int() + size : key.as_int();
      return i >= 0 && i < size ? Value::string(encode_utf8(text.substr(static_cast<size_t>(i), 1))) : Value();
    }
    return {};  // jinja2 answers Undefined for what has no such item
  }

  const std::string& name_;
  std::vector<std::unordered_map<std::string, Value>> scopes_;
  std::string out_;
  int line_ = 1;
};

}  // namespace

Template::Template(std::string_view source, std::string name) : name_(std::move(name)), body_(parse_template(source, name_)) {}

std::string Template::render(const nlohmann::ordered_json& context) const { return Renderer(name_, context).render(body_); }

}  // namespace paraflow::infer::jinja
