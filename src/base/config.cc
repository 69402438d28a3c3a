#include "base/config.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "base/file_io.h"

namespace paraflow {

namespace {

std::vector<std::string> split_key(const std::string& key) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    size_t dot = key.find('.', start);
    parts.push_back(key.substr(start, dot - start));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return parts;
}

const char* type_label(ConfigType type) {
  switch (type) {
    case ConfigType::integer: return "integer";
    case ConfigType::number: return "number";
    case ConfigType::boolean: return "bool";
    case ConfigType::text: return "string";
  }
  return "?";
}

std::string format_bound(double value) { return fmt::format("{:g}", value); }

std::string join(const std::vector<std::string>& items, const char* separator) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : separator) + item;
  return out;
}

}  // namespace

bool Range::contains(double value) const {
  if (std::isnan(value)) return false;
  const bool low_ok = low_open ? value > low : value >= low;
  const bool high_ok = high_open ? value < high : value <= high;
  return low_ok && high_ok;
}

std::string Range::describe() const {
  const bool bounded_low = std::isfinite(low), bounded_high = std::isfinite(high);
  if (bounded_low && bounded_high) {
    return fmt::format("in {}{}, {}{}", low_open ? "(" : "[", format_bound(low), format_bound(high), high_open ? ")" : "]");
  }
  if (bounded_low) return fmt::format("{} {}", low_open ? ">" : ">=", format_bound(low));
  if (bounded_high) return fmt::format("{} {}", high_open ? "<" : "<=", format_bound(high));
  return "any";
}

std::string schema_markdown(const ConfigSchema& schema) {
  std::string out = "| key | type | default | valid | meaning |\n|---|---|---|---|---|\n";
  for (const ConfigKey& spec : schema) {
    std::string valid = spec.type == ConfigType::integer || spec.type == ConfigType::number ? spec.range.describe()
                        : spec.choices.empty()                                             ? "any"
                                                                                           : join(spec.choices, " \\| ");
    std::string fallback = spec.default_value ? (spec.default_value->empty() ? "(empty)" : "`" + *spec.default_value + "`")
                           : spec.optional    ? "(see meaning)"
                                              : "required";
    out += fmt::format("| `{}` | {} | {} | {} | {} |\n", spec.key, type_label(spec.type), fallback, valid, spec.help);
  }
  return out;
}

Config Config::from_string(const std::string& yaml_text, const std::string& origin, const ConfigSchema& schema,
                           std::filesystem::path base_dir) {
  Config config(origin, schema);
  config.base_dir_ = std::move(base_dir);
  try {
    config.root_ = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    fail("{}: invalid YAML at line {}, column {}: {}", origin, e.mark.line + 1, e.mark.column + 1, e.msg);
  }
  if (config.root_.IsNull()) config.root_ = YAML::Node(YAML::NodeType::Map);
  check(config.root_.IsMap(), "{}: the top level must be a mapping of sections", origin);
  return config;
}

Config Config::from_file(const std::string& path, const ConfigSchema& schema) {
  // The folder with its links resolved, so that a "../" in a value may be folded away (printed
  // paths read /repo/runs/x, not configs/../runs/x) and still names the folder's real parent.
  const std::filesystem::path folder = std::filesystem::path(path).parent_path();
  return from_string(read_file(path), path, schema, folder.empty() ? folder : std::filesystem::weakly_canonical(folder));
}

void Config::set(const std::string& assignment) {
  size_t equals = assignment.find('=');
  check(equals != std::string::npos && equals > 0, "--set '{}': expected key=value", assignment);
  std::string key = assignment.substr(0, equals);
  YAML::Node value;
  try {
    value = YAML::Load(assignment.substr(equals + 1));
  } catch (const YAML::Exception& e) {
    fail("--set '{}': the value is not valid YAML: {}", assignment, e.msg);
  }
  overridden_.push_back(key);
  std::vector<std::string> parts = split_key(key);
  // yaml-cpp nodes are handles: walking with operator[] on copies would rebind, so recurse.
  std::function<void(YAML::Node, size_t)> assign = [&](YAML::Node node, size_t depth) {
    if (depth + 1 == parts.size()) {
      node[parts[depth]] = value;
      return;
    }
    if (!node[parts[depth]] || !node[parts[depth]].IsMap()) node[parts[depth]] = YAML::Node(YAML::NodeType::Map);
    assign(node[parts[depth]], depth + 1);
  };
  assign(root_, 0);
}

YAML::Node Config::find(const std::string& key) const {
  // Const access so a missing key is not created; reset() rebinds (operator= would assign).
  YAML::Node node = YAML::Clone(root_);
  for (const std::string& part : split_key(key)) {
    if (!node.IsMap()) return YAML::Node(YAML::NodeType::Undefined);
    const YAML::Node& map = node;
    YAML::Node child = map[part];
    if (!child.IsDefined()) return YAML::Node(YAML::NodeType::Undefined);
    node.reset(child);
  }
  return node;
}

std::filesystem::path Config::path(const std::string& key) const {
  if (!key_spec(key).path) throw Error(fmt::format("config key '{}' is read as a path but not declared one", key));
  const std::filesystem::path value = get<std::string>(key);
  // A key set with --set, or a section holding it (--set 'data={train: x}').
  const bool overridden = std::any_of(overridden_.begin(), overridden_.end(), [&](const std::string& set) {
    return key == set || key.rfind(set + ".", 0) == 0;
  });
  if (value.empty() || value.is_absolute() || overridden || !has(key)) return value;
  return (base_dir_ / value).lexically_normal();
}

std::string Config::describe_path(const std::string& key) const {
  const std::string written = get<std::string>(key), resolved = path(key).string();
  return written == resolved ? fmt::format("{} '{}'", key, written)
                             : fmt::format("{} '{}' ({})", key, written, resolved);
}

const ConfigKey& Config::key_spec(const std::string& key) const {
  for (const ConfigKey& spec : *schema_) {
    if (spec.key == key) return spec;
  }
  throw Error(fmt::format("config key '{}' is read but not declared in the schema", key));
}

void Config::validate_value(const ConfigKey& spec, const YAML::Node& node) const {
  check(node.IsScalar(), "{}: key '{}' must be a single {}, got '{}'", origin_, spec.key, type_label(spec.type),
        YAML::Dump(node));
  switch (spec.type) {
    case ConfigType::integer: {
      const auto value = convert<int64_t>(node, spec.key);
      check(spec.range.contains(static_cast<double>(value)), "{}: key '{}' is {}, must be {}", origin_, spec.key,
            value, spec.range.describe());
      break;
    }
    case ConfigType::number: {
      const auto value = convert<double>(node, spec.key);
      check(spec.range.contains(value), "{}: key '{}' is {}, must be {}", origin_, spec.key, node.Scalar(),
            spec.range.describe());
      break;
    }
    case ConfigType::boolean: convert<bool>(node, spec.key); break;
    case ConfigType::text: {
      const auto value = convert<std::string>(node, spec.key);
      check(spec.choices.empty() || std::find(spec.choices.begin(), spec.choices.end(), value) != spec.choices.end(),
            "{}: key '{}' is '{}', must be one of {}", origin_, spec.key, value, join(spec.choices, ", "));
      break;
    }
  }
}

void Config::validate() const {
  std::vector<std::string> unknown;
  std::function<void(const YAML::Node&, const std::string&)> walk = [&](const YAML::Node& node,
                                                                         const std::string& prefix) {
    if (node.IsMap()) {
      for (const auto& entry : node) {
        std::string key = prefix.empty() ? entry.first.as<std::string>() : prefix + "." + entry.first.as<std::string>();
        walk(entry.second, key);
      }
      return;
    }
    const auto spec = std::find_if(schema_->begin(), schema_->end(), [&](const ConfigKey& s) { return s.key == prefix; });
    if (spec == schema_->end()) {
      unknown.push_back(prefix);
    } else {
      validate_value(*spec, node);
    }
  };
  walk(root_, "");
  check(unknown.empty(), "{}: unknown config key(s): {} (`paraflow config keys` lists them all)", origin_,
        join(unknown, ", "));
  for (const ConfigKey& spec : *schema_) {
    check(spec.default_value || spec.optional || has(spec.key), "{}: missing required key '{}' ({})", origin_, spec.key,
          spec.help);
  }
}

}  // namespace paraflow
