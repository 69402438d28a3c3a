#include "base/json.h"

#include "base/error.h"

namespace paraflow {

nlohmann::json parse_json(std::string_view text, const std::string& origin) {
  try {
    return nlohmann::json::parse(text);
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
