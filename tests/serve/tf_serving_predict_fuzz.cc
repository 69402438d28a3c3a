// libFuzzer target for TF Serving's Predict and GetModelMetadata requests as gRPC hands them to
// us: any bytes must either not parse, or be read into the signature's inputs, or be refused with
// InputError; nothing else may escape, crash or read out of bounds.
//   scripts/fuzz.sh tf_serving_predict 60      # 60 seconds
#include <cstddef>
#include <cstdint>

#include "serve/tf_serving_api.h"

namespace tfs = tensorflow::serving;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tfs::PredictRequest request;
  if (request.ParseFromArray(data, static_cast<int>(size))) {
    const paraflow::serve::ServedModel model{.name = request.model_spec().name()};
    try {
      paraflow::serve::PredictInputs inputs = paraflow::serve::predict_inputs(request);
      for (const auto& row : inputs.input_ids) {
        if (row.size() != inputs.input_ids[0].size()) __builtin_trap();  // a tensor's rows are equal
      }
      // The inputs echoed as the output: the encoding must serialize.
      (void)paraflow::serve::predict_response(std::move(inputs.input_ids), model).SerializeAsString();
    } catch (const paraflow::InputError&) {
    }
  }
  tfs::GetModelMetadataRequest metadata;
  if (metadata.ParseFromArray(data, static_cast<int>(size))) {
    try {
      (void)paraflow::serve::model_metadata(metadata, {.name = "m"}).SerializeAsString();
    } catch (const paraflow::InputError&) {
    }
  }
  return 0;
}
