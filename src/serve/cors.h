// Cross-origin requests from browsers (--allowed-origins), answered as vLLM answers them
// (Starlette's CORSMiddleware, with vLLM's default of every method and header allowed). A
// preflight (OPTIONS with Origin and Access-Control-Request-Method, sent without the API key) from
// an allowed origin gets 200 with Access-Control-Allow-Origin, -Methods, -Headers (those it asked
// for) and -Max-Age; every other answer to an allowed origin carries Access-Control-Allow-Origin.
// An origin not listed gets no CORS header at all, and so the browser refuses the page the answer.
#pragma once

#include <string>
#include <vector>

#include "serve/http_server.h"

namespace paraflow::serve {

class CorsPolicy {
 public:
  CorsPolicy() = default;  // no origin allowed
  // Origins as browsers send them ("http://host:port"); "*" allows any.
  explicit CorsPolicy(std::vector<std::string> origins);
  // The --allowed-origins flag: vLLM's JSON list ('["http://a:3000"]') or a comma-separated list.
  // Throws InputError naming the flag.
  static CorsPolicy parse(const std::string& flag);

  static bool is_preflight(const HttpRequest& request);
  struct Answer {
    int status;
    std::string body;  // text/plain
    HttpHeaders headers;
  };
  Answer preflight(const HttpRequest& request) const;
  // What any other answer to `request` carries: none unless it comes from an allowed origin.
  HttpHeaders headers(const HttpRequest& request) const;

 private:
  bool allowed(const std::string& origin) const;
  HttpHeaders allow_origin(const std::string& origin) const;

  std::vector<std::string> origins_;
  bool any_ = false;
};

}  // namespace paraflow::serve
