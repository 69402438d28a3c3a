// Which endpoint a request is for (see openai_service.h for what each answers), with its API key
// and method checked: what the service does with a request before it needs the model.
#pragma once

#include <string>
#include <string_view>

#include "serve/http_server.h"

namespace paraflow::serve {

enum class Endpoint { web_page, health, metrics, models, completions, chat_completions, tf_serving };

// The paths of TF Serving's REST API (serve/tf_serving_rest.h), which checks their methods itself.
constexpr std::string_view tf_serving_prefix = "/v1/models/";

// Throws ApiError: 401 without the API key (when there is one, every endpoint but /health and the
// web page asks for it), 404 for no such endpoint, 405 for the wrong method. `metrics_path`, when
// given, is /metrics' too (TF Serving's --monitoring_config_file path).
Endpoint route(const HttpRequest& request, const std::string& api_key, const std::string& metrics_path = "");

// A target's path: what comes before its query.
std::string target_path(const std::string& target);

// A target's endpoint for the metrics' labels: its path, "/v1/models/{model}" for TF Serving's,
// or "other" when no endpoint has it.
std::string endpoint_label(const std::string& target);

}  // namespace paraflow::serve
