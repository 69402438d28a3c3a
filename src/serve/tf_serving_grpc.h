// TF Serving's gRPC services on the serving engine, so TF Serving's clients work unchanged:
//   tensorflow.serving.PredictionService/Predict           the Predict signature (serve/predict.h)
//   tensorflow.serving.PredictionService/GetModelMetadata  that signature, as "signature_def"
//   tensorflow.serving.ModelService/GetModelStatus         the versions' states (serve/model_registry.h)
//   tensorflow.serving.ModelService/HandleReloadConfigRequest  a new ModelServerConfig (ModelRegistry::reload)
// Classify, Regress and MultiInference are refused (INVALID_ARGUMENT): the models have only the
// Predict signature.
// gRPC's callback API: a Predict holds no thread while the engine works; the engine's thread
// finishes the call, and a client that cancels, passes its deadline or drops the connection
// stops the call's rows at their next token. Status codes: bad input or an unknown version label
// INVALID_ARGUMENT, an unknown signature FAILED_PRECONDITION, another model or version NOT_FOUND, a full queue RESOURCE_EXHAUSTED, no version loaded yet or shutting down UNAVAILABLE, a missing or
// wrong API key (metadata `authorization: Bearer <key>`) UNAUTHENTICATED. Messages over 16 MiB
// are refused by gRPC (RESOURCE_EXHAUSTED).
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "serve/model_registry.h"

namespace paraflow::serve {

class TfServingGrpc {
 public:
  // The registry must outlive stop(). An empty key: no authentication. A reload's labels may name
  // versions not available with `allow_unavailable_labels`.
  TfServingGrpc(ModelRegistry& registry, std::string api_key, bool allow_unavailable_labels = false);
  ~TfServingGrpc();

  // Starts serving on host:port; returns the port (the one the system picked, for 0). With
  // `ssl_config_file` (TF Serving's --ssl_config_file: an SSLConfig, protobuf text, holding the
  // PEM texts server_key, server_cert, custom_ca and client_verify), over TLS as TF Serving does.
  // Throws IoError when the address cannot be bound (gRPC's own log of it is kept quiet),
  // InputError for a bad SSL config.
  int listen(const std::string& host, int port, const std::string& ssl_config_file = "");
  void draining();  // Predict answers UNAVAILABLE
  // Stops serving: calls still in flight after `grace` are cancelled.
  void stop(std::chrono::milliseconds grace);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace paraflow::serve
