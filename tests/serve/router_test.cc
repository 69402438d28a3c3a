#include "serve/router.h"

#include <gtest/gtest.h>

#include "serve/api_error.h"

namespace paraflow::serve {
namespace {

HttpRequest request(const std::string& method, const std::string& target, const std::string& key = "Bearer key") {
  return {method, target, key, ""};
}

int refusal(const HttpRequest& request) {
  try {
    route(request, "key");
  } catch (const ApiError& error) {
    return error.status();
  }
  return 0;
}

TEST(Router, EndpointsByPathAndMethod) {
  // The endpoints without the key: /health, and the page (which asks for the key itself).
  EXPECT_EQ(route(request("GET", "/health", ""), "key"), Endpoint::health);
  EXPECT_EQ(route(request("GET", "/", ""), "key"), Endpoint::web_page);
  EXPECT_EQ(route(request("GET", "/index.html?x=1", "Bearer wrong"), "key"), Endpoint::web_page);
  EXPECT_EQ(route(request("GET", "/v1/models?limit=1"), "key"), Endpoint::models);
  EXPECT_EQ(route(request("POST", "/v1/chat/completions"), "key"), Endpoint::chat_completions);
  // TF Serving's paths, whatever the method: it answers wrong ones in its own error form.
  EXPECT_EQ(route(request("POST", "/v1/models/tiny:predict"), "key"), Endpoint::tf_serving);
  EXPECT_EQ(route(request("DELETE", "/v1/models/tiny"), "key"), Endpoint::tf_serving);
  EXPECT_EQ(route(request("GET", "/metrics", ""), ""), Endpoint::metrics);  // no key configured
}

TEST(Router, RefusalsCheckTheKeyFirst) {
  EXPECT_EQ(refusal(request("GET", "/nothing", "")), 401);
  EXPECT_EQ(refusal(request("GET", "/v1/models/tiny", "Bearer wrong")), 401);
  EXPECT_EQ(refusal(request("GET", "/nothing")), 404);
  EXPECT_EQ(refusal(request("GET", "/v1/completions")), 405);
  EXPECT_EQ(refusal(request("HEAD", "/v1/completions")), 405);
}

std::vector<std::pair<std::string, std::string>> refusal_headers(const HttpRequest& request) {
  try {
    route(request, "key");
  } catch (const ApiError& error) {
    return error.headers();
  }
  return {};
}

TEST(Router, RefusalsCarryTheHeadersTheirStatusAsksFor) {
  using Headers = std::vector<std::pair<std::string, std::string>>;
  EXPECT_EQ(refusal_headers(request("GET", "/v1/completions")), (Headers{{"Allow", "POST"}}));
  EXPECT_EQ(refusal_headers(request("POST", "/health")), (Headers{{"Allow", "GET, HEAD"}}));
  EXPECT_EQ(refusal_headers(request("GET", "/v1/models", "")), (Headers{{"WWW-Authenticate", "Bearer"}}));
}

TEST(Router, HeadGoesWhereGetDoes) {
  EXPECT_EQ(route(request("HEAD", "/", ""), "key"), Endpoint::web_page);
  EXPECT_EQ(route(request("HEAD", "/health", ""), "key"), Endpoint::health);
}

TEST(Router, MetricsLabels) {
  EXPECT_EQ(endpoint_label("/v1/completions?x=1"), "/v1/completions");
  EXPECT_EQ(endpoint_label("/v1/models/tiny/metadata"), "/v1/models/{model}");
  EXPECT_EQ(endpoint_label("/v1/models"), "/v1/models");
  EXPECT_EQ(endpoint_label("/favicon.ico"), "other");
  EXPECT_EQ(endpoint_label(""), "other");
}

}  // namespace
}  // namespace paraflow::serve
