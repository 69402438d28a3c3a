#include "serve/tf_serving_grpc.h"

#include <fmt/format.h>
#include <grpc/support/log.h>
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <mutex>
#include <thread>
#include <vector>

#include "base/error.h"
#include "base/file_io.h"
#include "serve/auth.h"
#include "serve/model_registry.h"
#include "serve/text_proto.h"
#include "serve/tf_serving_api.h"
#include "tensorflow_serving/apis/model_service.grpc.pb.h"
#include "tensorflow_serving/apis/prediction_service.grpc.pb.h"
#include "tensorflow_serving/config/ssl_config.pb.h"

namespace paraflow::serve {

namespace {

namespace tfs = tensorflow::serving;

constexpr int max_message_bytes = 16 << 20;

// What the services read.
struct Model {
  ModelRegistry& registry;
  std::string api_key;
  bool allow_unavailable_labels = false;
  std::atomic<bool> draining{false};
};

// Calls `lookup(name, version, label)` with what a ModelSpec names (a version, a label, or
// neither); a ModelNotFound it throws is said again naming the ModelSpec's field at fault.
template <typename Lookup>
auto look_up(const tfs::ModelSpec& spec, const ModelRegistry& registry, Lookup lookup) {
  std::optional<int64_t> version;
  if (spec.has_version()) version = spec.version().value();
  const std::string label = spec.version_choice_case() == tfs::ModelSpec::kVersionLabel ? spec.version_label() : "";
  try {
    return lookup(spec.name(), version, label);
  } catch (const UnknownLabel& error) {
    throw UnknownLabel(fmt::format("model_spec.version_label: {}", error.what()));
  } catch (const ModelNotFound& error) {
    const std::vector<std::string> names = registry.model_names();
    const bool known = std::find(names.begin(), names.end(), spec.name()) != names.end();
    throw ModelNotFound(fmt::format("model_spec.{}: {}", known ? "version" : "name", error.what()));
  }
}

// The version a ModelSpec names (neither version nor label: the newest available). Throws
// ModelNotFound or ModelUnavailable.
std::shared_ptr<ServedVersion> find_version(const tfs::ModelSpec& spec, const ModelRegistry& registry) {
  return look_up(spec, registry, [&](const std::string& name, std::optional<int64_t> version, const std::string& label) {
    return registry.find(name, version, label);
  });
}

// The status of the exception being handled: the project's errors by their meaning.
grpc::Status current_error_status() {
  try {
    throw;
  } catch (const UnknownLabel& error) {  // TF Serving's codes for these two
    return {grpc::StatusCode::INVALID_ARGUMENT, error.what()};
  } catch (const UnknownSignature& error) {
    return {grpc::StatusCode::FAILED_PRECONDITION, error.what()};
  } catch (const ModelNotFound& error) {
    return {grpc::StatusCode::NOT_FOUND, error.what()};
  } catch (const ModelUnavailable& error) {
    return {grpc::StatusCode::UNAVAILABLE, error.what()};
  } catch (const InputError& error) {
    return {grpc::StatusCode::INVALID_ARGUMENT, error.what()};
  } catch (const infer::QueueFull& error) {
    return {grpc::StatusCode::RESOURCE_EXHAUSTED, error.what()};
  } catch (const infer::Draining& error) {
    return {grpc::StatusCode::UNAVAILABLE, error.what()};
  } catch (const BatchQueueFull& error) {
    return {grpc::StatusCode::UNAVAILABLE, error.what()};
  } catch (const std::exception& error) {
    return {grpc::StatusCode::INTERNAL, error.what()};
  }
}

// The status as TF Serving's StatusProto (a reload's answer carries it).
tfs::StatusProto status_proto(const grpc::Status& status) {
  tfs::StatusProto proto;
  proto.set_error_code(static_cast<tensorflow::error::Code>(status.error_code()));
  proto.set_error_message(status.error_message());
  return proto;
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
// check, and finishes the call through `reactor` with the status of whatever it throws.
template <typename Answer>
grpc::ServerUnaryReactor* unary(grpc::ServerUnaryReactor* reactor, const grpc::CallbackServerContext& context,
                                const Model& model, Answer answer) {
  if (grpc::Status key = check_api_key(context, model.api_key); !key.ok()) {
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

// A Predict call's reactor: a client that cancels, passes its deadline or drops the connection
// marks the call abandoned, so its rows stop at their next token instead of running to the end
// for no one (the engine's thread still finishes the call, as gRPC requires).
class PredictReactor final : public grpc::ServerUnaryReactor {
 public:
  std::shared_ptr<const std::atomic<bool>> abandoned() const { return abandoned_; }
  void OnCancel() override { abandoned_->store(true); }
  void OnDone() override { delete this; }

 private:
  std::shared_ptr<std::atomic<bool>> abandoned_ = std::make_shared<std::atomic<bool>>(false);
};

class PredictionService final : public tfs::PredictionService::CallbackService {
 public:
  explicit PredictionService(const Model& model) : model_(model) {}

  grpc::ServerUnaryReactor* Predict(grpc::CallbackServerContext* context, const tfs::PredictRequest* request,
                                    tfs::PredictResponse* response) override {
    auto* call = new PredictReactor;
    return unary(call, *context, model_, [&](grpc::ServerUnaryReactor* reactor) {
      PredictInputs inputs = predict_inputs(*request);
      inputs.abandoned = call->abandoned();
      if (model_.draining) {
        reactor->Finish({grpc::StatusCode::UNAVAILABLE, "the server is shutting down"});
        return true;
      }
      std::shared_ptr<ServedVersion> version = find_version(request->model_spec(), model_.registry);
      ServedVersion& served = *version;
      // The request and response live until the call is finished; the version until its callback has run.
      served.predict(std::move(inputs), [version = std::move(version), reactor, response](PredictOutcome outcome) {
        if (!outcome.error.empty()) {  // refused by a full queue or a drain, cancelled by a drain, or failed
          const grpc::StatusCode code = outcome.failure == PredictFailure::queue_full    ? grpc::StatusCode::RESOURCE_EXHAUSTED
                                        : outcome.failure == PredictFailure::unavailable ? grpc::StatusCode::UNAVAILABLE
                                                                                         : grpc::StatusCode::INTERNAL;
          reactor->Finish({code, outcome.error});
          return;
        }
        *response = predict_response(std::move(outcome.output_ids), {version->model, version->version});
        reactor->Finish(grpc::Status::OK);
      });
      return true;
    });
  }

  grpc::ServerUnaryReactor* GetModelMetadata(grpc::CallbackServerContext* context,
                                             const tfs::GetModelMetadataRequest* request,
                                             tfs::GetModelMetadataResponse* response) override {
    return unary(context->DefaultReactor(), *context, model_, [&](grpc::ServerUnaryReactor*) {
      const std::shared_ptr<ServedVersion> version = find_version(request->model_spec(), model_.registry);
      *response = model_metadata(*request, {version->model, version->version});
      return false;
    });
  }

 private:
  const Model& model_;
};

// TF Serving's state and status of a version; a failed load is UNKNOWN with its message.
void add_status(const VersionStatus& status, tfs::ModelVersionStatus& answer) {
  answer.set_version(status.version);
  switch (status.state) {
    case VersionState::loading: answer.set_state(tfs::ModelVersionStatus::LOADING); break;
    case VersionState::available: answer.set_state(tfs::ModelVersionStatus::AVAILABLE); break;
    case VersionState::unloading: answer.set_state(tfs::ModelVersionStatus::UNLOADING); break;
    case VersionState::end: answer.set_state(tfs::ModelVersionStatus::END); break;
  }
  answer.mutable_status()->set_error_code(status.error.empty() ? tensorflow::error::OK : tensorflow::error::UNKNOWN);
  answer.mutable_status()->set_error_message(status.error);
}

class ModelService final : public tfs::ModelService::CallbackService {
 public:
  explicit ModelService(const Model& model) : model_(model) {}
  ~ModelService() override { finish_reloads(); }

  // Waits for the reloads under way to answer (before the server stops: they finish their calls).
  void finish_reloads() {
    std::lock_guard lock(mutex_);
    for (std::thread& reload : reloads_) reload.join();
    reloads_.clear();
  }

  grpc::ServerUnaryReactor* GetModelStatus(grpc::CallbackServerContext* context,
                                           const tfs::GetModelStatusRequest* request,
                                           tfs::GetModelStatusResponse* response) override {
    return unary(context->DefaultReactor(), *context, model_, [&](grpc::ServerUnaryReactor*) {
      const ModelRegistry& registry = model_.registry;
      const std::vector<VersionStatus> statuses = look_up(
          request->model_spec(), registry,
          [&](const std::string& name, std::optional<int64_t> version, const std::string& label) {
            return registry.status(name, version, label);
          });
      for (const VersionStatus& status : statuses) add_status(status, *response->add_model_version_status());
      return false;
    });
  }

  // Serves the request's ModelServerConfig from now on (ModelRegistry::reload); answers once the
  // new versions are loaded, with the outcome as both the call's status and the response's. The
  // loading runs on a thread of its own: gRPC's callback threads must not wait on it.
  grpc::ServerUnaryReactor* HandleReloadConfigRequest(grpc::CallbackServerContext* context,
                                                      const tfs::ReloadConfigRequest* request,
                                                      tfs::ReloadConfigResponse* response) override {
    return unary(context->DefaultReactor(), *context, model_, [&](grpc::ServerUnaryReactor* reactor) {
      std::lock_guard lock(mutex_);
      reloads_.emplace_back([this, request, reactor, response] {
        grpc::Status status;
        try {
          model_.registry.reload(model_sources(request->config(), "ReloadConfigRequest.config"),
                                 model_.allow_unavailable_labels);
        } catch (...) {
          status = current_error_status();
        }
        *response->mutable_status() = status_proto(status);
        reactor->Finish(status);
      });
      return true;
    });
  }

 private:
  const Model& model_;
  std::mutex mutex_;
  std::vector<std::thread> reloads_;
};

// Every method the services above do not have: PredictionService's Classify, Regress and
// MultiInference are told that the model has only the Predict signature (INVALID_ARGUMENT, as TF
// Serving answers for a model without theirs); anything else is UNIMPLEMENTED, naming the method.
class OtherMethods final : public grpc::CallbackGenericService {
 public:
  explicit OtherMethods(const Model& model) : model_(model) {}

  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* context) override {
    class Refusal final : public grpc::ServerGenericBidiReactor {
     public:
      explicit Refusal(const grpc::Status& status) { Finish(status); }
      void OnDone() override { delete this; }
    };
    grpc::Status status = check_api_key(*context, model_.api_key);
    if (!status.ok()) return new Refusal(status);
    const std::string& method = context->method();
    const std::string prediction = "/tensorflow.serving.PredictionService/";
    const std::string name = method.substr(method.rfind('/') + 1);
    if (method.starts_with(prediction) && (name == "Classify" || name == "Regress" || name == "MultiInference")) {
      return new Refusal({grpc::StatusCode::INVALID_ARGUMENT, only_predict_signature(name)});
    }
    return new Refusal({grpc::StatusCode::UNIMPLEMENTED,
                        fmt::format("no method {} (served: tensorflow.serving.PredictionService/Predict and "
                                    "GetModelMetadata, tensorflow.serving.ModelService/GetModelStatus and "
                                    "HandleReloadConfigRequest)", method)});
  }

 private:
  const Model& model_;
};

// gRPC's own log, except while a port is bound: a port in use is our error to say (naming the
// flag), not gRPC's internal trace of it.
std::atomic<bool> quiet_grpc{false};
void grpc_log(gpr_log_func_args* args) {
  if (quiet_grpc.load()) return;
  std::fprintf(stderr, "grpc %s %s:%d: %s\n", gpr_log_severity_string(args->severity), args->file, args->line,
               args->message);
}

}  // namespace

struct TfServingGrpc::Impl {
  Impl(ModelRegistry& registry, std::string api_key, bool allow_unavailable_labels)
      : model{registry, std::move(api_key), allow_unavailable_labels} {}
  Model model;
  PredictionService prediction{model};
  ModelService model_service{model};
  OtherMethods other_methods{model};
  std::unique_ptr<grpc::Server> server;
};

TfServingGrpc::TfServingGrpc(ModelRegistry& registry, std::string api_key, bool allow_unavailable_labels)
    : impl_(std::make_unique<Impl>(registry, std::move(api_key), allow_unavailable_labels)) {}

TfServingGrpc::~TfServingGrpc() {
  if (impl_->server) stop(std::chrono::milliseconds(0));
}

namespace {

// TF Serving's BuildServerCredentialsFromSSLConfigFile: the key and certificate served, and with
// client_verify, clients must present a certificate custom_ca signed.
std::shared_ptr<grpc::ServerCredentials> server_credentials(const std::string& ssl_config_file) {
  if (ssl_config_file.empty()) return grpc::InsecureServerCredentials();
  const std::string source = "--ssl_config_file " + ssl_config_file;
  tensorflow::serving::SSLConfig config;
  parse_text_proto(read_file(ssl_config_file), config, source);
  check(!config.server_key().empty() && !config.server_cert().empty(),
        "{}: server_key and server_cert (PEM texts) are required", source);
  check(!config.client_verify() || !config.custom_ca().empty(),
        "{}: client_verify needs custom_ca, the CA that signs the clients' certificates", source);
  grpc::SslServerCredentialsOptions options(config.client_verify()
                                                ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                                                : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  options.force_client_auth = config.client_verify();
  options.pem_root_certs = config.custom_ca();
  options.pem_key_cert_pairs.push_back({config.server_key(), config.server_cert()});
  return grpc::SslServerCredentials(options);
}

}  // namespace

int TfServingGrpc::listen(const std::string& host, int port, const std::string& ssl_config_file) {
  const bool ipv6 = host.find(':') != std::string::npos;
  const std::string address = ipv6 ? fmt::format("[{}]:{}", host, port) : fmt::format("{}:{}", host, port);
  int bound = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(address, server_credentials(ssl_config_file), &bound);
  builder.SetMaxReceiveMessageSize(max_message_bytes);
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);  // a port in use is an error, not shared
  builder.RegisterService(&impl_->prediction);
  builder.RegisterService(&impl_->model_service);
  builder.RegisterCallbackGenericService(&impl_->other_methods);
  gpr_set_log_function(grpc_log);
  quiet_grpc = true;
  impl_->server = builder.BuildAndStart();
  quiet_grpc = false;
  if (!impl_->server || bound == 0) {
    // gRPC checks the PEM texts only here: say which file may be at fault.
    throw IoError(fmt::format("gRPC cannot listen on {}: the port is in use, or the address is not this machine's{}", address,
                              ssl_config_file.empty() ? "" : fmt::format(", or --ssl_config_file {} holds a key and "
                                                                         "certificate gRPC cannot use", ssl_config_file)));
  }
  return bound;
}

void TfServingGrpc::draining() { impl_->model.draining = true; }

void TfServingGrpc::stop(std::chrono::milliseconds grace) {
  impl_->model_service.finish_reloads();
  impl_->server->Shutdown(std::chrono::system_clock::now() + grace);
  impl_->server->Wait();
  impl_->server.reset();
}

}  // namespace paraflow::serve
