#include "base/json.h"

#include "base/error.h"

namespace paraflow {

nlohmann::json::parser_callback_t json_depth_limit(const std::string& origin) {
  return [origin](int depth, nlohmann::json::parse_event_t event, nlohmann::json&) {
    const bool opens = event == nlohmann::json::parse_event_t::object_start ||
                       event == nlohmann::json::parse_event_t::array_start;
    if (opens && depth >= kMaxJsonDepth) fail("{}: JSON nested deeper than {} levels", origin, kMaxJsonDepth);
    return true;
  };
}

nlohmann::json parse_json(std::string_view text, const std::string& origin) {
  try {
    return nlohmann::json::parse(text, json_depth_limit(origin));
  } catch (const nlohmann::json::parse_error& e) {
    // The library's message reads "[json.exception.parse_error.101] parse error at line 1, column
    // 6: syntax error while parsing ... - <the reason>"; keep the reason.
    const std::string message = e.what();
    const size_t reason = message.rfind(" - ");
    fail("{}: invalid JSON at byte {}{}", origin, e.byte,
         reason == std::string::npos ? "" : " (" + message.substr(reason + 3) + ")");
  }
}

}  // namespace paraflow
