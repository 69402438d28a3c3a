// TensorFlow's TensorProto, read and written the way TensorFlow does (Tensor::FromProto):
// the values come from `tensor_content` (raw little-endian bytes, row-major) when it is set,
// otherwise from the dtype's typed field (int_val, int64_val, float_val, double_val), where fewer
// values than elements repeat the last one and none means zeros. Every error names the tensor
// (`name`, the signature's input) and throws InputError.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "tensorflow/core/framework/tensor.pb.h"

namespace paraflow::serve {

// A decoded tensor holds at most this many elements (the 16 MiB a gRPC message may carry, in
// int32s): a small message cannot ask for a huge tensor through the repeat-the-last-value rule.
constexpr int64_t max_tensor_elements = int64_t{1} << 22;

// The dims, outermost first; refuses an unknown rank, negative dims and too many elements.
std::vector<int64_t> tensor_dims(const tensorflow::TensorProto& tensor, std::string_view name);

// The values of a DT_INT32 or DT_INT64 tensor.
std::vector<int64_t> integer_values(const tensorflow::TensorProto& tensor, std::string_view name);
// The values of a DT_FLOAT or DT_DOUBLE tensor.
std::vector<double> float_values(const tensorflow::TensorProto& tensor, std::string_view name);

// The one value of a scalar (shape [], or dims of 1 only).
int64_t integer_scalar(const tensorflow::TensorProto& tensor, std::string_view name);
double float_scalar(const tensorflow::TensorProto& tensor, std::string_view name);

// A DT_INT32 tensor of shape [rows, columns] (the rows are of equal length), values in int_val
// as TF Serving writes them.
tensorflow::TensorProto int32_matrix(const std::vector<std::vector<int32_t>>& rows);

}  // namespace paraflow::serve
