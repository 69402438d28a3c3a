// JSON text parsed with a paraflow error: "origin: invalid JSON at byte N (what was expected)",
// instead of the JSON library's raw exception text.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>

namespace paraflow {

nlohmann::json parse_json(std::string_view text, const std::string& origin);

}  // namespace paraflow
