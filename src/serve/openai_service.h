// The API: routes each HTTP request to its endpoint and answers it.
//   GET  / (or /index.html)    the web page (serve/web_page.h), which calls the endpoints below
//   GET  /health               200 when the model is ready, 503 while it loads or the server drains
//   GET  /metrics              Prometheus text: the engine's metrics and the server's own
//   GET  /v1/models            the one model served
//   POST /v1/completions       OpenAI's completions (legacy), streaming or not
//   POST /v1/chat/completions  OpenAI's chat completions, through chat_prompt()'s template
//   /v1/models/{name}...       TF Serving's REST API (serve/tf_serving_rest.h), its own errors
// With an API key, every endpoint but /health and the page asks for `Authorization: Bearer <key>` (401).
// Errors are OpenAI's error object.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "base/metrics.h"
#include "infer/engine.h"
#include "infer/text_codec.h"
#include "serve/http_server.h"
#include "serve/openai_request.h"
#include "serve/router.h"
#include "serve/tf_serving_rest.h"

namespace paraflow::serve {

struct ServiceOptions {
  std::string model_name;  // the model's id in the API
  std::string api_key;     // empty: no authentication
};

class OpenAiService {
 public:
  explicit OpenAiService(ServiceOptions options);

  void handle(HttpRequest request, std::shared_ptr<Exchange> exchange);  // an HttpHandler
  void count(const std::string& target, int status);                     // a StatusObserver

  // The model is loaded: the API endpoints answer from now on. Both must outlive the service's use.
  void ready(infer::Engine& engine, const infer::TextCodec& codec);
  void draining();  // /health answers 503 from now on

  MetricsRegistry& metrics() { return metrics_; }  // the server's own metrics

 private:
  void answer(Endpoint endpoint, const HttpRequest& request, const std::shared_ptr<Exchange>& exchange);
  void complete(const CompletionRequest& request, const std::shared_ptr<Exchange>& exchange);
  void chat(const ChatRequest& request, const std::shared_ptr<Exchange>& exchange);
  // The engine requests of a completion, its prompt checked against the model.
  void start(bool chat, const GenerationParams& params, std::vector<int32_t> prompt,
             const std::shared_ptr<Exchange>& exchange);
  std::string render_metrics() const;

  enum class State { loading, ready, draining };
  ServiceOptions options_;
  std::atomic<State> state_{State::loading};
  infer::Engine* engine_ = nullptr;  // set before state_ turns ready
  const infer::TextCodec* codec_ = nullptr;
  int64_t started_at_ = 0;  // Unix seconds: the model's `created`
  MetricsRegistry metrics_;
  TfServingRest tf_serving_;
};

}  // namespace paraflow::serve
