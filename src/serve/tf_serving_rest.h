// TF Serving's REST API (its paths, JSON shapes and status codes) on the serving engine:
//   GET  /v1/models/{name}[/versions/{v}|/labels/{l}]           the version's status (for the
//                                                              bare name also OpenAI's model
//                                                              object: id, object, created,
//                                                              owned_by; the two share the path)
//   GET  /v1/models/{name}[/versions/{v}|/labels/{l}]/metadata  the signature (serve/predict.h)
//   POST /v1/models/{name}[/versions/{v}|/labels/{l}]:predict   row ({"instances": [...]}) or
//                                                              columnar ({"inputs": ...}) form,
//                                                              answered in the same form
// :classify and :regress answer 400: the models have only the Predict signature.
// Errors are TF Serving's {"error": "..."}: 400 invalid argument (an unknown version label or
// signature too, as TF Serving answers), 404 not found, 429 resource
// exhausted (the engine's queue is full), 503 unavailable (no version loaded yet, or draining),
// 504 deadline exceeded (set_timeout).
// Models, versions and labels are the registry's (serve/model_registry.h), the signature the
// gRPC API's (serve/tf_serving_api.h).
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>

#include "serve/http_server.h"
#include "serve/model_registry.h"
#include "serve/tf_serving_api.h"

namespace paraflow::serve {

class TfServingRest {
 public:
  // `created`: the Unix time OpenAI's model objects give (the server's start).
  TfServingRest(const ModelRegistry& registry, int64_t created) : registry_(registry), created_(created) {}

  // Answers every request itself, errors included.
  void handle(const HttpRequest& request, const std::string& path, const std::shared_ptr<Exchange>& exchange) const;
  void draining();  // :predict answers 503 from now on (status and metadata still answer)
  // A :predict not answered within `timeout` of its arrival stops and answers 504 (TF Serving's
  // --rest_api_timeout_in_ms); 0: no limit. Before serving.
  void set_timeout(std::chrono::milliseconds timeout) { timeout_ = timeout; }

 private:
  const ModelRegistry& registry_;
  int64_t created_;
  std::chrono::milliseconds timeout_{0};
  std::atomic<bool> draining_{false};
};

}  // namespace paraflow::serve
