// TF Serving's gRPC messages on the models we serve: which version a ModelSpec names, a
// PredictRequest as the Predict signature's inputs (serve/predict.h), the outcome as a
// PredictResponse, and the signature as GetModelMetadata describes it. No gRPC here: these are
// the parts a fuzzer and the unit tests drive with plain messages.
//
// Signatures: "serving_default" ("" names it too).
#pragma once

#include <cstdint>
#include <string>

#include "serve/predict.h"
#include "tensorflow_serving/apis/get_model_metadata.pb.h"
#include "tensorflow_serving/apis/model.pb.h"
#include "tensorflow_serving/apis/predict.pb.h"

namespace paraflow::serve {

// The model version an answer comes from.
struct ServedModel {
  std::string name;
  int64_t version = 1;
};

// A request names a signature the model does not have: TF Serving's FAILED_PRECONDITION (HTTP 400).
class UnknownSignature : public InputError {
 public:
  using InputError::InputError;
};

// The request's inputs, checked against the signature: signature name (UnknownSignature), input
// names, dtypes and shapes, output_filter. Throws InputError naming the input.
PredictInputs predict_inputs(const tensorflow::serving::PredictRequest& request);

// The generated tokens as the `output_ids` output (DT_INT32 [batch, max_new_tokens]).
tensorflow::serving::PredictResponse predict_response(std::vector<std::vector<int32_t>> output_ids,
                                                      const ServedModel& model);

// metadata["signature_def"]: the Predict signature in a SignatureDefMap packed in an Any.
// Throws InputError for no or another metadata_field.
tensorflow::serving::GetModelMetadataResponse model_metadata(const tensorflow::serving::GetModelMetadataRequest& request,
                                                             const ServedModel& model);

// What Classify, Regress and MultiInference (`method`: REST's :classify, :regress) are told: the
// model has the Predict signature only. TF Serving answers INVALID_ARGUMENT (HTTP 400).
std::string only_predict_signature(const std::string& method);

}  // namespace paraflow::serve
