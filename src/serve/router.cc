#include "serve/router.h"

#include <fmt/format.h>

#include <algorithm>
#include <iterator>
#include <string_view>

#include "serve/api_error.h"
#include "serve/auth.h"

namespace paraflow::serve {

namespace {

struct Route {
  const char* path;
  const char* method;
  Endpoint endpoint;
  bool open = false;  // answered without the API key
};

constexpr Route routes[] = {
    // The page asks its user for the key and sends it with its own API calls.
    {"/", "GET", Endpoint::web_page, true},
    {"/index.html", "GET", Endpoint::web_page, true},
    {"/health", "GET", Endpoint::health, true},
    {"/metrics", "GET", Endpoint::metrics},
    {"/v1/models", "GET", Endpoint::models},
    {"/v1/completions", "POST", Endpoint::completions},
    {"/v1/chat/completions", "POST", Endpoint::chat_completions},
};

const Route* find_route(const std::string& path) {
  const auto* found =
      std::find_if(std::begin(routes), std::end(routes), [&](const Route& candidate) { return path == candidate.path; });
  return found == std::end(routes) ? nullptr : found;
}

}  // namespace

Endpoint route(const HttpRequest& request, const std::string& api_key, const std::string& metrics_path) {
  const std::string path = target_path(request.target);
  const Route* found = find_route(!metrics_path.empty() && path == metrics_path ? "/metrics" : path);
  if (!(found && found->open) && !api_key.empty() && !bearer_token_matches(request.authorization, api_key)) {
    throw ApiError(401, "invalid_request_error",
                   request.authorization.empty() ? "no API key: send the header Authorization: Bearer <key>"
                                                 : "incorrect API key",
                   "", "invalid_api_key")
        .with_header("WWW-Authenticate", "Bearer");
  }
  if (path.starts_with(tf_serving_prefix)) return Endpoint::tf_serving;
  if (!found) {
    throw ApiError(404, "invalid_request_error",
                   fmt::format("no endpoint {} {} (there are /v1/completions, /v1/chat/completions, /v1/models, "
                               "/health, /metrics and the web page at /)",
                               request.method, path),
                   "", "unknown_url");
  }
  // HEAD wherever GET is (HTTP asks it of every server): answered as GET, sent without the body.
  const bool head_of_get = request.method == "HEAD" && std::string_view(found->method) == "GET";
  if (request.method != found->method && !head_of_get) {
    const std::string allowed = std::string_view(found->method) == "GET" ? "GET, HEAD" : found->method;
    throw ApiError(405, "invalid_request_error",
                   fmt::format("{} {} is not supported; use {}", request.method, path, found->method))
        .with_header("Allow", allowed);
  }
  return found->endpoint;
}

std::string target_path(const std::string& target) { return target.substr(0, target.find('?')); }

std::string endpoint_label(const std::string& target) {
  const std::string path = target_path(target);
  if (path.starts_with(tf_serving_prefix)) return "/v1/models/{model}";
  return find_route(path) ? path : "other";
}

}  // namespace paraflow::serve
