#include "serve/tf_serving_api.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <limits>

#include "serve/tensor_proto.h"

namespace paraflow::serve {

namespace {

constexpr const char* signature_name = "serving_default";
constexpr const char* output_name = "output_ids";

// The signature's inputs, in the order the errors list them.
struct InputInfo {
  const char* name;
  tensorflow::DataType dtype;  // what GetModelMetadata declares; the other width is accepted too
  bool matrix;                 // [batch, length]; otherwise a scalar
};
constexpr InputInfo signature_inputs[] = {
    {"input_ids", tensorflow::DT_INT32, true},
    {"max_new_tokens", tensorflow::DT_INT32, false},
    {"temperature", tensorflow::DT_FLOAT, false},
    {"seed", tensorflow::DT_INT64, false},
};

std::string input_names() {
  std::vector<std::string> names;
  for (const InputInfo& input : signature_inputs) names.emplace_back(input.name);
  return fmt::format("{}", fmt::join(names, ", "));
}

tensorflow::serving::ModelSpec answered_spec(const ServedModel& model) {
  tensorflow::serving::ModelSpec spec;
  spec.set_name(model.name);
  spec.mutable_version()->set_value(model.version);
  spec.set_signature_name(signature_name);
  return spec;
}

std::vector<std::vector<int32_t>> id_rows(const tensorflow::TensorProto& tensor) {
  const std::vector<int64_t> dims = tensor_dims(tensor, "input_ids");
  check(dims.size() == 2, "input_ids: shape [{}] is not [batch, length]", fmt::join(dims, ", "));
  // Refused here, before rows of nothing are allocated for a batch dimension of millions.
  check(dims[1] >= 1, "input_ids: shape [{}] has rows of no ids", fmt::join(dims, ", "));
  const std::vector<int64_t> values = integer_values(tensor, "input_ids");
  std::vector<std::vector<int32_t>> rows(static_cast<size_t>(dims[0]));
  for (size_t i = 0; i < values.size(); ++i) {
    check(values[i] >= 0 && values[i] <= std::numeric_limits<int32_t>::max(),
          "input_ids: id {} at [{}, {}] is not a token id", values[i], i / dims[1], i % dims[1]);
    rows[i / dims[1]].push_back(static_cast<int32_t>(values[i]));
  }
  return rows;
}

tensorflow::TensorInfo tensor_info(const char* name, tensorflow::DataType dtype, bool matrix) {
  tensorflow::TensorInfo info;
  info.set_name(name);
  info.set_dtype(dtype);
  info.mutable_tensor_shape();  // a scalar's shape: present, with no dims (as TF Serving writes it)
  if (matrix) {
    for (int i = 0; i < 2; ++i) info.mutable_tensor_shape()->add_dim()->set_size(-1);  // any batch, any length
  }
  return info;
}

}  // namespace

PredictInputs predict_inputs(const tensorflow::serving::PredictRequest& request) {
  const std::string& signature = request.model_spec().signature_name();
  if (!signature.empty() && signature != signature_name) {
    throw UnknownSignature(fmt::format("model_spec.signature_name: no signature \"{}\" (the model has \"{}\")",
                                       signature, signature_name));
  }
  for (const auto& [name, tensor] : request.inputs()) {
    bool known = false;
    for (const InputInfo& input : signature_inputs) known = known || name == input.name;
    check(known, "inputs: no input \"{}\" in the signature (its inputs: {})", name, input_names());
  }
  for (const std::string& output : request.output_filter()) {
    check(output == output_name, "output_filter: no output \"{}\" in the signature (its output: {})", output,
          output_name);
  }

  PredictInputs inputs;
  const auto& given = request.inputs();
  check(given.contains("input_ids"), "inputs: input_ids is missing (int32 or int64, [batch, length])");
  inputs.input_ids = id_rows(given.at("input_ids"));
  if (given.contains("max_new_tokens")) inputs.max_new_tokens = integer_scalar(given.at("max_new_tokens"), "max_new_tokens");
  if (given.contains("temperature")) inputs.temperature = float_scalar(given.at("temperature"), "temperature");
  if (given.contains("seed")) {
    const int64_t seed = integer_scalar(given.at("seed"), "seed");
    check(seed >= 0, "seed: must be >= 0 (got {})", seed);
    inputs.seed = static_cast<uint64_t>(seed);
  }
  return inputs;
}

tensorflow::serving::PredictResponse predict_response(std::vector<std::vector<int32_t>> output_ids,
                                                      const ServedModel& model) {
  tensorflow::serving::PredictResponse response;
  *response.mutable_model_spec() = answered_spec(model);
  (*response.mutable_outputs())[output_name] = int32_matrix(output_ids);
  return response;
}

tensorflow::serving::GetModelMetadataResponse model_metadata(const tensorflow::serving::GetModelMetadataRequest& request,
                                                             const ServedModel& model) {
  check(request.metadata_field_size() > 0, "metadata_field: must name at least one field (\"signature_def\")");
  for (const std::string& field : request.metadata_field()) {
    check(field == "signature_def", "metadata_field: \"{}\" is not supported (only \"signature_def\")", field);
  }
  tensorflow::SignatureDef signature;
  for (const InputInfo& input : signature_inputs) {
    (*signature.mutable_inputs())[input.name] = tensor_info(input.name, input.dtype, input.matrix);
  }
  (*signature.mutable_outputs())[output_name] = tensor_info(output_name, tensorflow::DT_INT32, true);
  signature.set_method_name("tensorflow/serving/predict");
  tensorflow::serving::SignatureDefMap signatures;
  (*signatures.mutable_signature_def())[signature_name] = std::move(signature);

  tensorflow::serving::GetModelMetadataResponse response;
  *response.mutable_model_spec() = answered_spec(model);
  (*response.mutable_metadata())["signature_def"].PackFrom(signatures);
  return response;
}

std::string only_predict_signature(const std::string& method) {
  return fmt::format("the models served have only the predict signature (\"{}\", method tensorflow/serving/predict): "
                     "{} needs a classification or regression signature; send a Predict (REST :predict)",
                     signature_name, method);
}

}  // namespace paraflow::serve
