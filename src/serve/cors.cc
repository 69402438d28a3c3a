#include "serve/cors.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "serve/completion_job.h"

namespace paraflow::serve {

namespace {

// The methods the server answers: a preflight for another is refused, as Starlette does.
constexpr const char* kMethods[] = {"GET", "HEAD", "OPTIONS", "POST"};
constexpr const char* kMaxAgeSeconds = "600";  // how long a browser may keep a preflight's answer

}  // namespace

CorsPolicy::CorsPolicy(std::vector<std::string> origins) : origins_(std::move(origins)) {
  any_ = std::find(origins_.begin(), origins_.end(), "*") != origins_.end();
}

CorsPolicy CorsPolicy::parse(const std::string& flag) {
  std::vector<std::string> origins;
  if (flag.starts_with("[")) {
    try {
      origins = nlohmann::json::parse(flag).get<std::vector<std::string>>();
    } catch (const nlohmann::json::exception& error) {
      throw InputError(fmt::format("--allowed-origins {}: not a JSON list of strings ({})", flag, error.what()));
    }
  } else {
    for (size_t start = 0; start <= flag.size();) {
      const size_t end = std::min(flag.find(',', start), flag.size());
      if (end > start) origins.push_back(flag.substr(start, end - start));
      start = end + 1;
    }
  }
  for (const std::string& origin : origins) {
    // An origin is scheme://host[:port], which browsers send without a path or a trailing slash.
    const size_t scheme = origin.find("://");
    if (origin != "*" && (scheme == std::string::npos || origin.find('/', scheme + 3) != std::string::npos)) {
      throw InputError(fmt::format("--allowed-origins: '{}' is not an origin such as http://localhost:3000 (or *)", origin));
    }
  }
  return CorsPolicy(std::move(origins));
}

bool CorsPolicy::is_preflight(const HttpRequest& request) {
  return request.method == "OPTIONS" && !request.origin.empty() && !request.access_control_request_method.empty();
}

bool CorsPolicy::allowed(const std::string& origin) const {
  return any_ || std::find(origins_.begin(), origins_.end(), origin) != origins_.end();
}

HttpHeaders CorsPolicy::allow_origin(const std::string& origin) const {
  // A listed origin is named back, and the answer varies with it (for caches); "*" says any.
  if (any_) return {{"Access-Control-Allow-Origin", "*"}};
  return {{"Access-Control-Allow-Origin", origin}, {"Vary", "Origin"}};
}

CorsPolicy::Answer CorsPolicy::preflight(const HttpRequest& request) const {
  if (!allowed(request.origin)) return {400, "Disallowed CORS origin", {}};
  HttpHeaders headers = allow_origin(request.origin);
  headers.emplace_back("Access-Control-Allow-Methods", fmt::format("{}", fmt::join(kMethods, ", ")));
  headers.emplace_back("Access-Control-Max-Age", kMaxAgeSeconds);
  if (!request.access_control_request_headers.empty()) {
    headers.emplace_back("Access-Control-Allow-Headers", request.access_control_request_headers);
  }
  const bool known_method = std::find(std::begin(kMethods), std::end(kMethods),
                                      request.access_control_request_method) != std::end(kMethods);
  if (!known_method) return {400, "Disallowed CORS method", headers};
  return {200, "OK", headers};
}

HttpHeaders CorsPolicy::headers(const HttpRequest& request) const {
  if (request.origin.empty() || !allowed(request.origin)) return {};
  HttpHeaders headers = allow_origin(request.origin);
  headers.emplace_back("Access-Control-Expose-Headers", kModelVersionHeader);  // a page may read which version answered
  return headers;
}

}  // namespace paraflow::serve
