#include "serve/tf_serving_grpc.h"

#include <fmt/format.h>
#include <grpcpp/grpcpp.h>

#include <atomic>

#include "serve/auth.h"
#include "tensorflow_serving/apis/model_service.grpc.pb.h"
#include "tensorflow_serving/apis/prediction_service.grpc.pb.h"

namespace paraflow::serve {

namespace {

namespace tfs = tensorflow::serving;

constexpr int max_message_bytes = 16 << 20;

enum class State { loading, ready, draining };

// What both services read; `engine` is set before `state` turns ready.
struct Model {
  ServedModel served;
  std::string api_key;
  std::atomic<State> state{State::loading};
  infer::Engine* engine = nullptr;
};

// The status of the exception being handled: the project's errors by their meaning.
grpc::Status current_error_status() {
  try {
    throw;
  } catch (const ModelNotFound& error) {
    return {grpc::StatusCode::NOT_FOUND, error.what()};
  } catch (const InputError& error) {
    return {grpc::StatusCode::INVALID_ARGUMENT, error.what()};
  } catch (const infer::QueueFull& error) {
    return {grpc::StatusCode::RESOURCE_EXHAUSTED, error.what()};
  } catch (const infer::Draining& error) {
    return {grpc::StatusCode::UNAVAILABLE, error.what()};
  } catch (const std::exception& error) {
    return {grpc::StatusCode::INTERNAL, error.what()};
  }
}

grpc::Status check_api_key(const grpc::CallbackServerContext& context, const std::string& api_key) {
  if (api_key.empty()) return grpc::Status::OK;
  const auto& metadata = context.client_metadata();
  const auto found = metadata.find("authorization");
  if (found == metadata.end() ||
      !bearer_token_matches(std::string_view(found->second.data(), found->second.size()), api_key)) {
    return {grpc::StatusCode::UNAUTHENTICATED, "this server needs the metadata `authorization: Bearer <api key>`"};
  }
  return grpc::Status::OK;
}

// Runs `answer` (which returns true once it has finished the call itself) after the API key
// check, and finishes the call with the status of whatever it throws.
template <typename Answer>
grpc::ServerUnaryReactor* unary(grpc::CallbackServerContext* context, const Model& model, Answer answer) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (grpc::Status key = check_api_key(*context, model.api_key); !key.ok()) {
    reactor->Finish(key);
    return reactor;
  }
  try {
    if (!answer(reactor)) reactor->Finish(grpc::Status::OK);
  } catch (...) {
    reactor->Finish(current_error_status());
  }
  return reactor;
}

class PredictionService final : public tfs::PredictionService::CallbackService {
 public:
  explicit PredictionService(const Model& model) : model_(model) {}

  grpc::ServerUnaryReactor* Predict(grpc::CallbackServerContext* context, const tfs::PredictRequest* request,
                                    tfs::PredictResponse* response) override {
    return unary(context, model_, [&](grpc::ServerUnaryReactor* reactor) {
      PredictInputs inputs = predict_inputs(*request, model_.served);
      if (model_.state != State::ready) {
        reactor->Finish({grpc::StatusCode::UNAVAILABLE, model_.state == State::loading
                                                           ? "the model is still loading"
                                                           : "the server is shutting down"});
        return true;
      }
      // The request and response live until the call is finished.
      start_predict(*model_.engine, std::move(inputs), [this, reactor, response](PredictOutcome outcome) {
        if (!outcome.error.empty()) {  // a row was cancelled (a drain ran out of time) or failed
          reactor->Finish({grpc::StatusCode::UNAVAILABLE, outcome.error});
          return;
        }
        *response = predict_response(std::move(outcome.output_ids), model_.served);
        reactor->Finish(grpc::Status::OK);
      });
      return true;
    });
  }

  grpc::ServerUnaryReactor* GetModelMetadata(grpc::CallbackServerContext* context,
                                             const tfs::GetModelMetadataRequest* request,
                                             tfs::GetModelMetadataResponse* response) override {
    return unary(context, model_, [&](grpc::ServerUnaryReactor*) {
      *response = model_metadata(*request, model_.served);
      return false;
    });
  }

 private:
  const Model& model_;
};

class ModelService final : public tfs::ModelService::CallbackService {
 public:
  explicit ModelService(const Model& model) : model_(model) {}

  grpc::ServerUnaryReactor* GetModelStatus(grpc::CallbackServerContext* context,
                                           const tfs::GetModelStatusRequest* request,
                                           tfs::GetModelStatusResponse* response) override {
    return unary(context, model_, [&](grpc::ServerUnaryReactor*) {
      check_model_spec(request->model_spec(), model_.served);
      tfs::ModelVersionStatus* status = response->add_model_version_status();
      status->set_version(model_.served.version);
      const State state = model_.state;
      status->set_state(state == State::loading ? tfs::ModelVersionStatus::LOADING
                        : state == State::ready ? tfs::ModelVersionStatus::AVAILABLE
                                                : tfs::ModelVersionStatus::UNLOADING);
      status->mutable_status()->set_error_code(tensorflow::error::OK);
      return false;
    });
  }

 private:
  const Model& model_;
};

}  // namespace

struct TfServingGrpc::Impl {
  Model model;
  PredictionService prediction{model};
  ModelService model_service{model};
  std::unique_ptr<grpc::Server> server;
};

TfServingGrpc::TfServingGrpc(ServedModel model, std::string api_key) : impl_(std::make_unique<Impl>()) {
  impl_->model.served = std::move(model);
  impl_->model.api_key = std::move(api_key);
}

TfServingGrpc::~TfServingGrpc() {
  if (impl_->server) stop(std::chrono::milliseconds(0));
}

int TfServingGrpc::listen(const std::string& host, int port) {
  const bool ipv6 = host.find(':') != std::string::npos;
  const std::string address = ipv6 ? fmt::format("[{}]:{}", host, port) : fmt::format("{}:{}", host, port);
  int bound = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &bound);
  builder.SetMaxReceiveMessageSize(max_message_bytes);
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);  // a port in use is an error, not shared
  builder.RegisterService(&impl_->prediction);
  builder.RegisterService(&impl_->model_service);
  impl_->server = builder.BuildAndStart();
  if (!impl_->server || bound == 0) throw IoError(fmt::format("grpc: cannot listen on {}", address));
  return bound;
}

void TfServingGrpc::ready(infer::Engine& engine) {
  impl_->model.engine = &engine;
  impl_->model.state = State::ready;
}

void TfServingGrpc::draining() { impl_->model.state = State::draining; }

void TfServingGrpc::stop(std::chrono::milliseconds grace) {
  impl_->server->Shutdown(std::chrono::system_clock::now() + grace);
  impl_->server->Wait();
  impl_->server.reset();
}

}  // namespace paraflow::serve
