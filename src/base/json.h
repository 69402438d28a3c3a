// JSON text parsed with a paraflow error: "origin: invalid JSON at byte N (what was expected)",
// instead of the JSON library's raw exception text.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>

namespace paraflow {

// How deep parsed JSON may nest. nlohmann's parser and destructor do not recurse, but dump() and
// copies do: a text of a few hundred thousand brackets would overflow a thread's stack after it
// was parsed. No file or request of ours needs more than a few levels (a TF Serving tensor of
// rank n, n + 2).
constexpr int kMaxJsonDepth = 64;

// A parser callback that refuses JSON nested deeper than kMaxJsonDepth: InputError, "origin:
// JSON nested deeper than 64 levels".
nlohmann::json::parser_callback_t json_depth_limit(const std::string& origin);

// Refuses JSON nested deeper than kMaxJsonDepth too.
nlohmann::json parse_json(std::string_view text, const std::string& origin);

}  // namespace paraflow
