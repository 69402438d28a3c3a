// TF Serving's messages on our model: a PredictRequest checked against the signature (every
// refusal names the field or input), the response and the metadata. Which version a ModelSpec
// names: model_registry_test.cc and the gRPC interop check (tf_serving_grpc_check.py).
#include "serve/tf_serving_api.h"

#include <google/protobuf/text_format.h>
#include <gtest/gtest.h>

#include "expect_error.h"

namespace paraflow::serve {
namespace {

namespace tfs = tensorflow::serving;

const ServedModel model{.name = "tiny-gpt"};

template <typename Message>
Message parse(const std::string& text) {
  Message message;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &message)) << text;
  return message;
}

// A request for "tiny-gpt" with input_ids [[1, 2, 3], [4, 5, 6]], `changes` (text format) merged in.
tfs::PredictRequest request(const std::string& changes = "") {
  tfs::PredictRequest message = parse<tfs::PredictRequest>(R"pb(
    model_spec { name: "tiny-gpt" }
    inputs {
      key: "input_ids"
      value { dtype: DT_INT32 tensor_shape { dim { size: 2 } dim { size: 3 } } int_val: [ 1, 2, 3, 4, 5, 6 ] }
    })pb");
  EXPECT_TRUE(google::protobuf::TextFormat::MergeFromString(changes, &message)) << changes;
  return message;
}

tfs::PredictRequest with_input(const std::string& name, const std::string& tensor) {
  return request("inputs { key: \"" + name + "\" value { " + tensor + " } }");
}

void predict_refused(const tfs::PredictRequest& bad, const std::vector<std::string>& says) {
  testing::expect_error<InputError>([&] { predict_inputs(bad); }, says);
}

TEST(TfServingPredict, ReadsEveryInput) {
  const PredictInputs defaults = predict_inputs(request());
  EXPECT_EQ(defaults.input_ids, (std::vector<std::vector<int32_t>>{{1, 2, 3}, {4, 5, 6}}));
  EXPECT_EQ(defaults.max_new_tokens, 16);
  EXPECT_EQ(defaults.temperature, 0);

  const PredictInputs inputs = predict_inputs(request(R"pb(
    model_spec { version { value: 1 } signature_name: "serving_default" }
    inputs { key: "max_new_tokens" value { dtype: DT_INT64 int64_val: 5 } }
    inputs { key: "temperature" value { dtype: DT_FLOAT float_val: 0.5 } }
    inputs { key: "seed" value { dtype: DT_INT32 int_val: 42 } }
    output_filter: "output_ids")pb"));
  EXPECT_EQ(inputs.max_new_tokens, 5);
  EXPECT_DOUBLE_EQ(inputs.temperature, 0.5);
  EXPECT_EQ(inputs.seed, 42u);
}

TEST(TfServingPredict, RefusalsNameTheField) {
  predict_refused(request("model_spec { signature_name: 'classify' }"), {"model_spec.signature_name", "\"classify\""});
  predict_refused(with_input("prompt", "dtype: DT_INT32 int_val: 1"), {"inputs", "no input \"prompt\"", "input_ids, max_new_tokens"});
  predict_refused(parse<tfs::PredictRequest>("model_spec { name: 'tiny-gpt' }"), {"inputs: input_ids is missing"});
  predict_refused(request("output_filter: 'logits'"), {"output_filter", "\"logits\""});
  predict_refused(parse<tfs::PredictRequest>(R"pb(
                    model_spec { name: "tiny-gpt" }
                    inputs { key: "input_ids" value { dtype: DT_INT32 tensor_shape { dim { size: 3 } } int_val: [ 1, 2, 3 ] } })pb"),
                  {"input_ids: shape [3] is not [batch, length]"});
  predict_refused(parse<tfs::PredictRequest>(R"pb(
                    model_spec { name: "tiny-gpt" }
                    inputs { key: "input_ids" value { dtype: DT_INT32 tensor_shape { dim { size: 4194304 } dim { size: 0 } } } })pb"),
                  {"input_ids: shape [4194304, 0] has rows of no ids"});
  predict_refused(parse<tfs::PredictRequest>(R"pb(
                    model_spec { name: "tiny-gpt" }
                    inputs { key: "input_ids" value { dtype: DT_FLOAT tensor_shape { dim { size: 1 } dim { size: 1 } } float_val: 1 } })pb"),
                  {"input_ids: dtype is DT_FLOAT"});
  predict_refused(parse<tfs::PredictRequest>(R"pb(
                    model_spec { name: "tiny-gpt" }
                    inputs { key: "input_ids" value { dtype: DT_INT64 tensor_shape { dim { size: 1 } dim { size: 2 } } int64_val: [ 1, 5000000000 ] } })pb"),
                  {"input_ids: id 5000000000 at [0, 1] is not a token id"});
  predict_refused(parse<tfs::PredictRequest>(R"pb(
                    model_spec { name: "tiny-gpt" }
                    inputs { key: "input_ids" value { dtype: DT_INT32 tensor_shape { dim { size: 2 } dim { size: 1 } } int_val: [ 1, -4 ] } })pb"),
                  {"input_ids: id -4 at [1, 0]"});
  predict_refused(with_input("max_new_tokens", "dtype: DT_FLOAT float_val: 3"), {"max_new_tokens: dtype is DT_FLOAT"});
  predict_refused(with_input("temperature", "dtype: DT_FLOAT tensor_shape { dim { size: 2 } } float_val: [ 1, 2 ]"),
                  {"temperature: a scalar"});
  predict_refused(with_input("seed", "dtype: DT_INT64 int64_val: -1"), {"seed: must be >= 0"});
}

TEST(TfServingPredict, ResponseNamesTheModelThatAnswered) {
  const tfs::PredictResponse response = predict_response({{7, 8}, {9, 10}}, model);
  EXPECT_EQ(response.model_spec().name(), "tiny-gpt");
  EXPECT_EQ(response.model_spec().version().value(), 1);
  EXPECT_EQ(response.model_spec().signature_name(), "serving_default");
  ASSERT_EQ(response.outputs().size(), 1u);
  const tensorflow::TensorProto& output = response.outputs().at("output_ids");
  EXPECT_EQ(output.dtype(), tensorflow::DT_INT32);
  EXPECT_EQ(output.tensor_shape().dim_size(), 2);
  EXPECT_EQ(output.int_val_size(), 4);
}

TEST(TfServingMetadata, TheSignatureInAnAny) {
  const auto response = model_metadata(
      parse<tfs::GetModelMetadataRequest>("model_spec { name: 'tiny-gpt' } metadata_field: 'signature_def'"), model);
  EXPECT_EQ(response.model_spec().version().value(), 1);
  const google::protobuf::Any& any = response.metadata().at("signature_def");
  EXPECT_EQ(any.type_url(), "type.googleapis.com/tensorflow.serving.SignatureDefMap");
  tfs::SignatureDefMap signatures;
  ASSERT_TRUE(any.UnpackTo(&signatures));
  const tensorflow::SignatureDef& signature = signatures.signature_def().at("serving_default");
  EXPECT_EQ(signature.method_name(), "tensorflow/serving/predict");
  EXPECT_EQ(signature.inputs().at("input_ids").dtype(), tensorflow::DT_INT32);
  EXPECT_EQ(signature.inputs().at("input_ids").tensor_shape().dim_size(), 2);
  EXPECT_EQ(signature.inputs().at("max_new_tokens").tensor_shape().dim_size(), 0);  // a scalar
  EXPECT_EQ(signature.inputs().at("temperature").dtype(), tensorflow::DT_FLOAT);
  EXPECT_EQ(signature.inputs().at("seed").dtype(), tensorflow::DT_INT64);
  EXPECT_EQ(signature.outputs().at("output_ids").dtype(), tensorflow::DT_INT32);

  testing::expect_error<InputError>([] { model_metadata(parse<tfs::GetModelMetadataRequest>("model_spec { name: 'tiny-gpt' }"), model); },
                             {"metadata_field: must name"});
  testing::expect_error<InputError>(
      [] { model_metadata(parse<tfs::GetModelMetadataRequest>("model_spec { name: 'tiny-gpt' } metadata_field: 'graph'"), model); },
      {"metadata_field", "\"graph\""});
}

}  // namespace
}  // namespace paraflow::serve
