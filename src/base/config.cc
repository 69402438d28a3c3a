#include "base/config.h"

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

}  // namespace

Config Config::from_string(const std::string& yaml_text, const std::string& origin) {
  Config config;
  config.origin_ = origin;
  try {
    config.root_ = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    fail("{}: invalid YAML at line {}, column {}: {}", origin, e.mark.line + 1, e.mark.column + 1, e.msg);
  }
  if (config.root_.IsNull()) config.root_ = YAML::Node(YAML::NodeType::Map);
  check(config.root_.IsMap(), "{}: the top level must be a mapping of sections", origin);
  return config;
}

Config Config::from_file(const std::string& path) {
  try {
    return from_string(read_file(path), path);
  } catch (const YAML::Exception& e) {
    fail("{}: {}", path, e.what());
  }
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

void Config::check_all_used() const {
  std::vector<std::string> unknown;
  std::function<void(const YAML::Node&, const std::string&)> walk = [&](const YAML::Node& node,
                                                                         const std::string& prefix) {
    if (node.IsMap()) {
      for (const auto& entry : node) {
        std::string key = prefix.empty() ? entry.first.as<std::string>() : prefix + "." + entry.first.as<std::string>();
        walk(entry.second, key);
      }
    } else if (!used_.count(prefix)) {
      unknown.push_back(prefix);
    }
  };
  walk(root_, "");
  if (!unknown.empty()) {
    std::string list;
    for (const auto& key : unknown) list += (list.empty() ? "" : ", ") + key;
    fail("{}: unknown config key(s): {}", origin_, list);
  }
}

}  // namespace paraflow
