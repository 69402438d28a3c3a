// CORS as vLLM answers it (Starlette's CORSMiddleware with every method and header allowed):
// a preflight from a listed origin names that origin back with the methods, the headers asked
// for and a max-age; other origins get no CORS header; "*" allows any origin.
#include <gtest/gtest.h>

#include <algorithm>

#include "base/error.h"
#include "serve/cors.h"

namespace paraflow::serve {
namespace {

HttpRequest preflight(const std::string& origin, const std::string& method = "POST",
                      const std::string& headers = "authorization,content-type") {
  return {.method = "OPTIONS", .target = "/v1/completions", .origin = origin,
          .access_control_request_method = method, .access_control_request_headers = headers};
}

std::string header(const HttpHeaders& headers, const std::string& name) {
  const auto found = std::find_if(headers.begin(), headers.end(), [&](const auto& pair) { return pair.first == name; });
  return found == headers.end() ? "(none)" : found->second;
}

TEST(Cors, AListedOriginIsAnsweredAsStarlettesMiddlewareDoes) {
  const CorsPolicy policy = CorsPolicy::parse("http://localhost:3000,https://ui.example");
  const HttpRequest request = preflight("https://ui.example");
  ASSERT_TRUE(CorsPolicy::is_preflight(request));
  const CorsPolicy::Answer answer = policy.preflight(request);
  EXPECT_EQ(answer.status, 200);
  EXPECT_EQ(answer.body, "OK");
  EXPECT_EQ(header(answer.headers, "Access-Control-Allow-Origin"), "https://ui.example");
  EXPECT_EQ(header(answer.headers, "Vary"), "Origin");
  EXPECT_EQ(header(answer.headers, "Access-Control-Allow-Methods"), "GET, HEAD, OPTIONS, POST");
  EXPECT_EQ(header(answer.headers, "Access-Control-Allow-Headers"), "authorization,content-type");
  EXPECT_EQ(header(answer.headers, "Access-Control-Max-Age"), "600");
  // The answer itself names the origin back too, and lets the page read which version answered.
  HttpRequest call{.method = "POST", .target = "/v1/completions", .origin = "http://localhost:3000"};
  const HttpHeaders headers = policy.headers(call);
  EXPECT_EQ(header(headers, "Access-Control-Allow-Origin"), "http://localhost:3000");
  EXPECT_EQ(header(headers, "Access-Control-Expose-Headers"), "Paraflow-Model-Version");

  // A method the server does not answer: refused, as Starlette refuses a method not allowed.
  EXPECT_EQ(policy.preflight(preflight("https://ui.example", "DELETE")).status, 400);
  EXPECT_EQ(policy.preflight(preflight("https://ui.example", "DELETE")).body, "Disallowed CORS method");
}

TEST(Cors, OtherOriginsGetNoCorsHeaders) {
  for (const CorsPolicy& policy : {CorsPolicy(), CorsPolicy::parse(R"(["http://localhost:3000"])")}) {
    const CorsPolicy::Answer answer = policy.preflight(preflight("http://localhost:3001"));
    EXPECT_EQ(answer.status, 400);
    EXPECT_EQ(answer.body, "Disallowed CORS origin");
    EXPECT_TRUE(answer.headers.empty());
    EXPECT_TRUE(policy.headers({.method = "GET", .target = "/v1/models", .origin = "http://evil.example"}).empty());
  }
  // Not a preflight: no Origin, or no Access-Control-Request-Method (the router's 405 answers it).
  EXPECT_FALSE(CorsPolicy::is_preflight(preflight("")));
  EXPECT_FALSE(CorsPolicy::is_preflight(preflight("http://a", "")));
  // A same-origin request (no Origin) gets nothing either.
  EXPECT_TRUE(CorsPolicy::parse("*").headers({.method = "GET", .target = "/"}).empty());
}

TEST(Cors, AnyOriginWithAStar) {
  const CorsPolicy policy = CorsPolicy::parse(R"(["*"])");
  const CorsPolicy::Answer answer = policy.preflight(preflight("http://anywhere:8000", "GET", ""));
  EXPECT_EQ(answer.status, 200);
  EXPECT_EQ(header(answer.headers, "Access-Control-Allow-Origin"), "*");
  EXPECT_EQ(header(answer.headers, "Vary"), "(none)");
  EXPECT_EQ(header(answer.headers, "Access-Control-Allow-Headers"), "(none)");  // none asked for
}

TEST(Cors, TheFlagIsCheckedNamingIt) {
  for (const std::string bad : {"localhost:3000", "http://a/path", R"(["http://a", 3])", "[oops"}) {
    SCOPED_TRACE(bad);
    try {
      CorsPolicy::parse(bad);
      ADD_FAILURE() << "accepted";
    } catch (const InputError& error) {
      EXPECT_NE(std::string(error.what()).find("--allowed-origins"), std::string::npos) << error.what();
    }
  }
}

}  // namespace
}  // namespace paraflow::serve
