// The API: routes each HTTP request to its endpoint and answers it.
//   GET  / (or /index.html)    the web page (serve/web_page.h), which calls the endpoints below
//   GET  /health               200 when every model has a version available, 503 until then or
//                              while the server drains
//   GET  /metrics              Prometheus text: the engines' metrics (labelled model and version)
//                              and the server's own
//   GET  /v1/models            the models served
//   POST /v1/completions       OpenAI's completions (legacy), streaming or not; the answer's header
//                              Paraflow-Model-Version says which version answered (both endpoints)
//   POST /v1/chat/completions  OpenAI's chat completions, through the model's chat template when its
//                              export has one (infer/chat_template.h), else chat_prompt()'s
//   /v1/models/{name}...       TF Serving's REST API (serve/tf_serving_rest.h), its own errors
// With an API key, every endpoint but /health and the page asks for `Authorization: Bearer <key>` (401).
// A browser's CORS preflight (OPTIONS) is answered for the allowed origins (serve/cors.h).
// Errors are OpenAI's error object; on TF Serving's paths TF Serving's {"error": "..."}, a 401
// included. A request's `model` is a model's name (its newest available
// version), or "<name>:<version>" or "<name>:<label>" for a version (serve/model_registry.h); it
// may be left out when one model is served.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "base/metrics.h"
#include "serve/cors.h"
#include "serve/http_server.h"
#include "serve/model_registry.h"
#include "serve/openai_request.h"
#include "serve/router.h"
#include "serve/tf_serving_rest.h"

namespace paraflow::serve {

class OpenAiService {
 public:
  // The registry must outlive the service. An empty key: no authentication.
  // `cors`: the origins whose pages may call the API (none by default).
  OpenAiService(const ModelRegistry& registry, std::string api_key, CorsPolicy cors = {});

  void handle(HttpRequest request, std::shared_ptr<Exchange> exchange);  // an HttpHandler
  void count(const std::string& target, int status);                     // a StatusObserver

  void draining();  // /health answers 503 from now on
  void serve_metrics_at(std::string path) { metrics_path_ = std::move(path); }  // as well as /metrics; before serving
  TfServingRest& tf_serving() { return tf_serving_; }  // to set its options before serving

  MetricsRegistry& metrics() { return metrics_; }  // the server's own metrics

 private:
  void answer(Endpoint endpoint, const HttpRequest& request, const std::shared_ptr<Exchange>& exchange);
  void complete(const CompletionRequest& request, const std::shared_ptr<Exchange>& exchange);
  void chat(const ChatRequest& request, const std::shared_ptr<Exchange>& exchange);
  // Where generation stops: at these strings (left out of the text), or when one of these
  // tokens is generated.
  struct Stops {
    std::vector<std::string> strings;
    std::vector<int32_t> tokens;
  };
  // The engine requests of a completion, its prompt checked against the model.
  void start(bool chat, const GenerationParams& params, std::vector<std::vector<int32_t>> prompts, Stops stops,
             std::shared_ptr<ServedVersion> version, const std::shared_ptr<Exchange>& exchange, bool echo);
  // The version a request's `model` names. Throws ApiError (404, or 503 while it loads).
  std::shared_ptr<ServedVersion> find_version(const std::optional<std::string>& model) const;

  const ModelRegistry& registry_;
  std::string api_key_;
  CorsPolicy cors_;
  std::string metrics_path_;
  std::atomic<bool> draining_{false};
  int64_t started_at_ = 0;  // Unix seconds: the models' `created`
  MetricsRegistry metrics_;
  TfServingRest tf_serving_;
};

}  // namespace paraflow::serve
