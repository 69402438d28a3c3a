// TF Serving's REST API (its paths, JSON shapes and status codes) on the serving engine:
//   GET  /v1/models/{name}[/versions/{v}|/labels/{l}]           the version's status
//   GET  /v1/models/{name}[/versions/{v}|/labels/{l}]/metadata  the signature (serve/predict.h)
//   POST /v1/models/{name}[/versions/{v}|/labels/{l}]:predict   row ({"instances": [...]}) or
//                                                              columnar ({"inputs": ...}) form,
//                                                              answered in the same form
// Errors are TF Serving's {"error": "..."}: 400 invalid argument, 404 not found, 429 resource
// exhausted (the engine's queue is full), 503 unavailable (loading or draining). The model and
// its signature are the gRPC API's (serve/tf_serving_api.h): one version, no version labels yet.
#pragma once

#include <memory>
#include <string>

#include "infer/engine.h"
#include "serve/http_server.h"
#include "serve/tf_serving_api.h"

namespace paraflow::serve {

class TfServingRest {
 public:
  explicit TfServingRest(ServedModel model) : model_(std::move(model)) {}

  // `engine` is null while the model loads. Answers every request itself, errors included.
  void handle(const HttpRequest& request, const std::string& path, infer::Engine* engine,
              const std::shared_ptr<Exchange>& exchange) const;

 private:
  ServedModel model_;
};

}  // namespace paraflow::serve
