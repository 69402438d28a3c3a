#include "serve/tf_serving_rest.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <optional>

#include <google/protobuf/util/json_util.h>

#include "base/json.h"
#include "serve/predict.h"
#include "serve/router.h"

namespace paraflow::serve {

namespace {

using nlohmann::json;

// A refusal with TF Serving's status code; the message is the body's "error".
class RestError : public Error {
 public:
  RestError(int status, const std::string& message) : Error(message), status_(status) {}
  int status() const { return status_; }

 private:
  int status_;
};

template <typename... Args>
[[noreturn]] void fail(int status, fmt::format_string<Args...> format, Args&&... args) {
  throw RestError(status, fmt::format(format, std::forward<Args>(args)...));
}

// /v1/models/{name}[/versions/{v}|/labels/{l}][/metadata|:{verb}]
struct Target {
  std::string name;
  std::optional<int64_t> version;
  std::optional<std::string> label;
  enum class Kind { status, metadata, predict, other_signature } kind = Kind::status;
  std::string verb;  // other_signature's: classify or regress
};

Target parse_target(const std::string& path) {
  std::string rest = path.substr(tf_serving_prefix.size());
  Target target;
  // A model's name has no ':' (serve/model_registry.h): one starts the verb.
  if (const size_t colon = rest.find(':'); colon != std::string::npos) {
    target.verb = rest.substr(colon + 1);
    rest.resize(colon);
    if (target.verb == "predict") {
      target.kind = Target::Kind::predict;
    } else if (target.verb == "classify" || target.verb == "regress") {
      target.kind = Target::Kind::other_signature;
    } else {
      fail(404, "Malformed request: {}: no verb ':{}' (a model answers :predict; :classify and :regress need "
                "signatures these models do not have)", path, target.verb);
    }
  } else if (rest.size() > 9 && rest.compare(rest.size() - 9, 9, "/metadata") == 0) {
    target.kind = Target::Kind::metadata;
    rest.resize(rest.size() - 9);
  }
  std::vector<std::string> parts;
  for (size_t start = 0;;) {
    const size_t slash = rest.find('/', start);
    parts.push_back(rest.substr(start, slash - start));
    if (slash == std::string::npos) break;
    start = slash + 1;
  }
  if (parts[0].empty() || (parts.size() != 1 && parts.size() != 3)) fail(404, "Malformed request: {}", path);
  target.name = parts[0];
  if (parts.size() == 3) {
    if (parts[1] == "versions") {
      try {
        size_t used = 0;
        target.version = std::stoll(parts[2], &used);
        if (used != parts[2].size()) throw std::invalid_argument(parts[2]);
      } catch (const std::exception&) {
        fail(400, "Malformed request: version '{}' is not a number", parts[2]);
      }
    } else if (parts[1] == "labels") {
      target.label = parts[2];
    } else {
      fail(404, "Malformed request: {}", path);
    }
  }
  return target;
}

// GetModelMetadata's answer as TF Serving's REST API writes it: the gRPC API's SignatureDefMap
// in protobuf's JSON mapping, field names as in the .proto, defaults printed.
json metadata_json(const ServedModel& model) {
  tensorflow::serving::GetModelMetadataRequest request;
  request.mutable_model_spec()->set_name(model.name);
  request.add_metadata_field("signature_def");
  tensorflow::serving::SignatureDefMap signatures;
  model_metadata(request, model).metadata().at("signature_def").UnpackTo(&signatures);
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  std::string text;
  check(google::protobuf::util::MessageToJsonString(signatures, &text, options).ok(), "signature_def: not printable as JSON");
  return json{{"model_spec", {{"name", model.name}, {"signature_name", ""}, {"version", std::to_string(model.version)}}},
              {"metadata", {{"signature_def", json::parse(text)}}}};
}

std::vector<int32_t> id_row(const json& value, const std::string& where) {
  if (!value.is_array()) fail(400, "{}: expected a list of token ids", where);
  std::vector<int32_t> row;
  for (size_t i = 0; i < value.size(); ++i) {
    const json& id = value[i];
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX) {
      fail(400, "{}[{}]: expected a token id (a non-negative integer), got {}", where, i, id.dump());
    }
    row.push_back(id.get<int32_t>());
  }
  return row;
}

// A scalar input (max_new_tokens, temperature, seed) into `inputs`; `where` names it in errors.
void set_scalar(PredictInputs& inputs, const std::string& name, const json& value, const std::string& where) {
  if (name == "max_new_tokens" || name == "seed") {
    if (!value.is_number_integer()) fail(400, "{}: expected an integer, got {}", where, value.dump());
    if (name == "seed") {
      if (!value.is_number_unsigned()) fail(400, "{}: must be >= 0 (got {})", where, value.dump());
      inputs.seed = value.get<uint64_t>();
    } else {
      inputs.max_new_tokens = value.get<int64_t>();
    }
  } else if (name == "temperature") {
    if (!value.is_number()) fail(400, "{}: expected a number, got {}", where, value.dump());
    inputs.temperature = value.get<double>();
  } else {
    fail(400, "{}: the signature has no input '{}' (inputs: input_ids, max_new_tokens, temperature, seed)", where,
         name);
  }
}

// {"instances": [[ids...] | {"input_ids": [...], scalars...}, ...]}: scalars must agree.
PredictInputs decode_rows(const json& instances) {
  if (!instances.is_array() || instances.empty()) fail(400, "instances: expected a non-empty list");
  PredictInputs inputs;
  std::optional<json> scalars;
  for (size_t i = 0; i < instances.size(); ++i) {
    const json& instance = instances[i];
    const std::string where = fmt::format("instances[{}]", i);
    if (!instance.is_object()) {
      inputs.input_ids.push_back(id_row(instance, where));
      if (scalars && !scalars->empty()) fail(400, "{}: every instance must name the same inputs", where);
      scalars = json::object();
      continue;
    }
    json these = json::object();
    bool has_ids = false;
    for (const auto& [name, value] : instance.items()) {
      if (name == "input_ids") {
        inputs.input_ids.push_back(id_row(value, where + ".input_ids"));
        has_ids = true;
      } else {
        set_scalar(inputs, name, value, where + "." + name);
        these[name] = value;
      }
    }
    if (!has_ids) fail(400, "{}: missing input_ids", where);
    if (scalars && *scalars != these) fail(400, "{}: scalar inputs differ from instance 0's; a batch shares them", where);
    scalars = these;
  }
  return inputs;
}

// {"inputs": [[ids...], ...] | {"input_ids": [[...]], scalars...}}
PredictInputs decode_columns(const json& columns) {
  PredictInputs inputs;
  const json* ids = &columns;
  if (columns.is_object()) {
    if (!columns.contains("input_ids")) fail(400, "inputs: missing input_ids");
    ids = &columns.at("input_ids");
    for (const auto& [name, value] : columns.items()) {
      if (name != "input_ids") set_scalar(inputs, name, value, "inputs." + name);
    }
  }
  if (!ids->is_array() || ids->empty()) fail(400, "inputs.input_ids: expected a [batch, length] list of lists");
  for (size_t i = 0; i < ids->size(); ++i) inputs.input_ids.push_back(id_row((*ids)[i], fmt::format("inputs.input_ids[{}]", i)));
  return inputs;
}

void respond_error(const std::shared_ptr<Exchange>& exchange, int status, const std::string& message) {
  exchange->respond(status, "application/json", json{{"error", message}}.dump(-1, ' ', false, json::error_handler_t::replace));
}

}  // namespace

void TfServingRest::draining() { draining_.store(true); }

void TfServingRest::handle(const HttpRequest& request, const std::string& path,
                           const std::shared_ptr<Exchange>& exchange) const {
  try {
    const Target target = parse_target(path);
    const bool post = target.kind == Target::Kind::predict || target.kind == Target::Kind::other_signature;
    const char* method = post ? "POST" : "GET";
    const bool head_of_get = request.method == "HEAD" && !post;
    if (request.method != method && !head_of_get) fail(405, "{} {} is not supported; use {}", request.method, path, method);
    if (target.kind == Target::Kind::status) {
      const std::vector<VersionStatus> statuses =
          registry_.status(target.name, target.version, target.label.value_or(""));
      json answer = json::array();
      for (const VersionStatus& status : statuses) {
        answer.push_back({{"version", std::to_string(status.version)},
                          {"state", state_name(status.state)},
                          {"status", {{"error_code", status.error.empty() ? "OK" : "UNKNOWN"},
                                      {"error_message", status.error}}}});
      }
      json body{{"model_version_status", answer}};
      if (!target.version && !target.label) {  // OpenAI's GET /v1/models/{id} too (client.models.retrieve)
        body.update({{"id", target.name}, {"object", "model"}, {"created", created_}, {"owned_by", "paraflow"}});
      }
      exchange->respond(200, "application/json", body.dump());
      return;
    }
    std::shared_ptr<ServedVersion> version = registry_.find(target.name, target.version, target.label.value_or(""));
    if (target.kind == Target::Kind::metadata) {
      exchange->respond(200, "application/json", metadata_json({version->model, version->version}).dump());
      return;
    }
    if (target.kind == Target::Kind::other_signature) fail(400, "{}", only_predict_signature(":" + target.verb));
    if (draining_.load()) fail(503, "the server is shutting down and accepts no new requests");
    json body;
    try {
      body = json::parse(request.body, [](int depth, json::parse_event_t event, json&) {
        const bool opens = event == json::parse_event_t::object_start || event == json::parse_event_t::array_start;
        if (opens && depth >= kMaxJsonDepth) fail(400, "the request nests JSON deeper than {} levels", kMaxJsonDepth);
        return true;
      });
    } catch (const json::exception& error) {
      fail(400, "JSON Parse error: {}", error.what());
    }
    if (!body.is_object()) fail(400, "the request body must be a JSON object");
    for (const auto& [key, value] : body.items()) {
      if (key == "signature_name") {
        if (!value.is_string() || (value != "serving_default" && value != "")) {
          fail(400, "signature_name: serving signature name '{}' not found in signature def (there is serving_default)",
               value.is_string() ? value.get<std::string>() : value.dump());
        }
      } else if (key != "instances" && key != "inputs") {
        fail(400, "unknown field '{}': a predict request has signature_name and instances or inputs", key);
      }
    }
    if (body.contains("instances") == body.contains("inputs")) {
      fail(400, "the request must have exactly one of 'instances' (row format) or 'inputs' (columnar format)");
    }
    const bool rows = body.contains("instances");
    PredictInputs inputs = rows ? decode_rows(body["instances"]) : decode_columns(body["inputs"]);
    auto abandoned = std::make_shared<std::atomic<bool>>(false);
    exchange->on_disconnect([abandoned] { abandoned->store(true); });
    inputs.abandoned = abandoned;
    if (timeout_.count() > 0) inputs.deadline = std::chrono::steady_clock::now() + timeout_;
    ServedVersion& served = *version;
    served.predict(std::move(inputs), [exchange, rows, version = std::move(version)](PredictOutcome outcome) {
      if (!outcome.error.empty()) {
        const int status = outcome.failure == PredictFailure::queue_full          ? 429
                           : outcome.failure == PredictFailure::unavailable       ? 503
                           : outcome.failure == PredictFailure::deadline_exceeded ? 504
                                                                                  : 500;
        respond_error(exchange, status, outcome.error);
        return;
      }
      exchange->respond(200, "application/json", json{{rows ? "predictions" : "outputs", outcome.output_ids}}.dump());
    });
  } catch (const RestError& error) {
    respond_error(exchange, error.status(), error.what());
  } catch (const UnknownLabel& error) {
    respond_error(exchange, 400, error.what());
  } catch (const ModelNotFound& error) {
    respond_error(exchange, 404, error.what());
  } catch (const ModelUnavailable& error) {
    respond_error(exchange, 503, error.what());
  } catch (const InputError& error) {
    respond_error(exchange, 400, error.what());
  } catch (const infer::QueueFull& error) {
    respond_error(exchange, 429, error.what());
  } catch (const infer::Draining& error) {
    respond_error(exchange, 503, error.what());
  } catch (const BatchQueueFull& error) {
    respond_error(exchange, 503, error.what());
  } catch (const std::exception& error) {
    respond_error(exchange, 500, error.what());
  }
}

}  // namespace paraflow::serve
