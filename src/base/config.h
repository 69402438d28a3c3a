// A YAML config with dotted-key access and command-line overrides (`--set train.lr=3e-4`).
// Every key a program reads is recorded, so a typo in a config is reported instead of ignored.
#pragma once

#include <yaml-cpp/yaml.h>

#include <set>
#include <string>
#include <vector>

#include "base/error.h"

namespace paraflow {

class Config {
 public:
  Config() : root_(YAML::NodeType::Map) {}
  static Config from_file(const std::string& path);
  static Config from_string(const std::string& yaml_text, const std::string& origin = "<string>");

  // `assignment` is `dotted.key=value`; the value is parsed as YAML (numbers, bools, lists).
  void set(const std::string& assignment);

  template <typename T>
  T get(const std::string& key, const T& fallback) const {
    YAML::Node node = find(key);
    if (!node.IsDefined()) return fallback;
    return convert<T>(node, key);
  }

  template <typename T>
  T require(const std::string& key) const {
    YAML::Node node = find(key);
    if (!node.IsDefined()) fail("{}: missing required key '{}'", origin_, key);
    return convert<T>(node, key);
  }

  // Throws InputError naming every leaf key that no get/require call asked for.
  void check_all_used() const;

  const std::string& origin() const { return origin_; }

 private:
  YAML::Node find(const std::string& key) const;

  template <typename T>
  T convert(const YAML::Node& node, const std::string& key) const {
    used_.insert(key);
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

  YAML::Node root_;
  std::string origin_ = "<defaults>";
  mutable std::set<std::string> used_;
};

}  // namespace paraflow
