// Which endpoint a request is for (see openai_service.h for what each answers), with its API key
// and method checked: what the service does with a request before it needs the model.
#pragma once

#include <string>

#include "serve/http_server.h"

namespace paraflow::serve {

enum class Endpoint { health, metrics, models, completions, chat_completions };

// Throws ApiError: 401 without the API key (when there is one, every endpoint but /health asks for
// it), 404 for no such endpoint, 405 for the wrong method.
Endpoint route(const HttpRequest& request, const std::string& api_key);

// A target's endpoint for the metrics' labels: its path, or "other" when no endpoint has it.
std::string endpoint_label(const std::string& target);

}  // namespace paraflow::serve
