#include "serve/api_error.h"

#include <nlohmann/json.hpp>

namespace paraflow::serve {

std::string ApiError::body() const {
  const auto or_null = [](const std::string& text) { return text.empty() ? nlohmann::json() : nlohmann::json(text); };
  nlohmann::json error = {{"message", what()}, {"type", type_}, {"param", or_null(param_)}, {"code", or_null(code_)}};
  // Messages may quote request bytes: never let them make the JSON invalid.
  return nlohmann::json{{"error", error}}.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace paraflow::serve
