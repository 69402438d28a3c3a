// A YAML config with dotted-key access and command-line overrides (`--set train.lr=3e-4`),
// checked against a schema: one table of every key with its type, default, valid range and
// meaning. validate() refuses unknown keys, wrong types and out-of-range values with messages
// naming the key and the value; docs/training.md's list of keys is printed from the same table.
#pragma once

#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "base/error.h"

namespace paraflow {

enum class ConfigType { integer, number, boolean, text };

// An interval of valid numbers; each end open or closed.
struct Range {
  double low = -std::numeric_limits<double>::infinity();
  double high = std::numeric_limits<double>::infinity();
  bool low_open = false, high_open = false;

  bool contains(double value) const;
  std::string describe() const;  // "> 0", ">= 1", "in [0, 1)", "any"
};
inline Range at_least(double low) { return {.low = low}; }
inline Range above(double low) { return {.low = low, .low_open = true}; }
inline Range between(double low, double high) { return {.low = low, .high = high}; }

struct ConfigKey {
  std::string key;  // dotted: section.name
  ConfigType type = ConfigType::text;
  std::optional<std::string> default_value;  // as YAML; none: required, unless `optional`
  Range range;                               // integer and number keys
  std::vector<std::string> choices;          // text keys: the allowed values (empty: any)
  std::string help;
  bool optional = false;  // may be absent without a default (the reader derives it; see help)
  bool path = false;      // a file or directory: read with Config::path
};
using ConfigSchema = std::vector<ConfigKey>;

// The schema as a Markdown table (key, type, default, valid values, meaning).
std::string schema_markdown(const ConfigSchema& schema);

class Config {
 public:
  // A relative path written in the file is relative to the file's folder (Config::path).
  static Config from_file(const std::string& path, const ConfigSchema& schema);
  // `base_dir`: what relative paths in the text are relative to (empty: the current directory).
  static Config from_string(const std::string& yaml_text, const std::string& origin, const ConfigSchema& schema,
                            std::filesystem::path base_dir = {});

  // `assignment` is `dotted.key=value`; the value is parsed as YAML (numbers, bools, lists).
  void set(const std::string& assignment);

  // Throws InputError naming the key and value for every unknown key (all of them in one
  // message), missing required key, value of the wrong type or out of range.
  void validate() const;

  bool has(const std::string& key) const { return find(key).IsDefined(); }

  // The value, or the schema's default when absent. `key` must be in the schema.
  template <typename T>
  T get(const std::string& key) const {
    const ConfigKey& spec = key_spec(key);
    YAML::Node node = find(key);
    if (!node.IsDefined()) {
      check(spec.default_value.has_value(), "{}: missing required key '{}' ({})", origin_, key, spec.help);
      // YAML reads "" as null; an empty default means the empty string.
      node = spec.default_value->empty() ? YAML::Node(std::string()) : YAML::Load(*spec.default_value);
    }
    return convert<T>(node, key);
  }

  // The value of a path key, resolved: written in the config file and relative, against the
  // file's folder (the config moves with its data, whatever the current directory); given with
  // --set, or the default, as it stands (against the current directory). Empty stays empty.
  std::filesystem::path path(const std::string& key) const;
  // "key 'value'" for messages, with the resolved path when it differs: "data.train 'corpus'
  // (configs/corpus)".
  std::string describe_path(const std::string& key) const;

  const std::string& origin() const { return origin_; }

 private:
  Config(std::string origin, const ConfigSchema& schema) : origin_(std::move(origin)), schema_(&schema) {}
  YAML::Node find(const std::string& key) const;
  const ConfigKey& key_spec(const std::string& key) const;  // Error when not in the schema
  void validate_value(const ConfigKey& spec, const YAML::Node& node) const;

  template <typename T>
  T convert(const YAML::Node& node, const std::string& key) const {
    try {
      return node.as<T>();
    } catch (const YAML::Exception&) {
      fail("{}: key '{}' has value '{}', which is not a valid {}", origin_, key, YAML::Dump(node), type_name<T>());
    }
  }

  template <typename T>
  static const char* type_name() {
    if constexpr (std::is_same_v<T, bool>) return "bool";
    else if constexpr (std::is_integral_v<T>) return "integer";
    else if constexpr (std::is_floating_point_v<T>) return "number";
    else return "string";
  }

  std::string origin_;
  std::filesystem::path base_dir_;
  std::vector<std::string> overridden_;  // the dotted keys of set()
  const ConfigSchema* schema_;
  YAML::Node root_{YAML::NodeType::Map};
};

}  // namespace paraflow
