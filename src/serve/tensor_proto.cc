#include "serve/tensor_proto.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstring>
#include <string>

#include "base/error.h"

namespace paraflow::serve {

namespace {

std::string dtype_name(tensorflow::DataType dtype) {
  const std::string name = tensorflow::DataType_Name(dtype);
  return name.empty() ? fmt::format("dtype {}", static_cast<int>(dtype)) : name;
}

int64_t element_count(const std::vector<int64_t>& dims) {
  int64_t count = 1;
  for (int64_t dim : dims) count *= dim;  // tensor_dims() bounded the product
  return count;
}

// `count` values of type T from raw bytes (little-endian, like every host we build for), or from
// the typed field by TensorFlow's rule: fewer values than elements repeat the last one.
template <typename T, typename Field>
std::vector<T> values_of(const tensorflow::TensorProto& tensor, const Field& field, int64_t count,
                         std::string_view name) {
  std::vector<T> values(static_cast<size_t>(count));
  if (!tensor.tensor_content().empty()) {
    const std::string& content = tensor.tensor_content();
    check(content.size() == values.size() * sizeof(T),
          "{}: tensor_content holds {} bytes, the shape needs {} ({} elements of {} bytes)", name, content.size(),
          values.size() * sizeof(T), count, sizeof(T));
    std::memcpy(values.data(), content.data(), content.size());
    return values;
  }
  check(field.size() <= count, "{}: {} values for {} elements", name, field.size(), count);
  for (int64_t i = 0; i < count; ++i) {
    values[static_cast<size_t>(i)] = field.empty() ? T{} : static_cast<T>(field[static_cast<int>(std::min<int64_t>(i, field.size() - 1))]);
  }
  return values;
}

void check_scalar(const tensorflow::TensorProto& tensor, std::string_view name) {
  const std::vector<int64_t> dims = tensor_dims(tensor, name);
  check(element_count(dims) == 1, "{}: a scalar (shape []) is expected, got shape [{}]", name,
        fmt::join(dims, ", "));
}

}  // namespace

std::vector<int64_t> tensor_dims(const tensorflow::TensorProto& tensor, std::string_view name) {
  check(!tensor.tensor_shape().unknown_rank(), "{}: tensor_shape has an unknown rank", name);
  std::vector<int64_t> dims;
  int64_t count = 1;
  for (const auto& dim : tensor.tensor_shape().dim()) {
    check(dim.size() >= 0, "{}: dimension {} is {}, a tensor's dimensions are known and >= 0", name, dims.size(),
          dim.size());
    dims.push_back(dim.size());
    check(dim.size() == 0 || count <= max_tensor_elements / dim.size(),
          "{}: shape [{}, ...] has more than the {} elements a tensor may hold", name, fmt::join(dims, ", "),
          max_tensor_elements);
    count *= dim.size();  // once 0, it stays 0
  }
  return dims;
}

std::vector<int64_t> integer_values(const tensorflow::TensorProto& tensor, std::string_view name) {
  const int64_t count = element_count(tensor_dims(tensor, name));
  switch (tensor.dtype()) {
    case tensorflow::DT_INT32: {
      const std::vector<int32_t> values = values_of<int32_t>(tensor, tensor.int_val(), count, name);
      return {values.begin(), values.end()};
    }
    case tensorflow::DT_INT64:
      return values_of<int64_t>(tensor, tensor.int64_val(), count, name);
    default:
      fail("{}: dtype is {}, expected DT_INT32 or DT_INT64", name, dtype_name(tensor.dtype()));
  }
}

std::vector<double> float_values(const tensorflow::TensorProto& tensor, std::string_view name) {
  const int64_t count = element_count(tensor_dims(tensor, name));
  switch (tensor.dtype()) {
    case tensorflow::DT_FLOAT: {
      const std::vector<float> values = values_of<float>(tensor, tensor.float_val(), count, name);
      return {values.begin(), values.end()};
    }
    case tensorflow::DT_DOUBLE:
      return values_of<double>(tensor, tensor.double_val(), count, name);
    default:
      fail("{}: dtype is {}, expected DT_FLOAT or DT_DOUBLE", name, dtype_name(tensor.dtype()));
  }
}

int64_t integer_scalar(const tensorflow::TensorProto& tensor, std::string_view name) {
  check_scalar(tensor, name);
  return integer_values(tensor, name)[0];
}

double float_scalar(const tensorflow::TensorProto& tensor, std::string_view name) {
  check_scalar(tensor, name);
  return float_values(tensor, name)[0];
}

tensorflow::TensorProto int32_matrix(const std::vector<std::vector<int32_t>>& rows) {
  tensorflow::TensorProto tensor;
  tensor.set_dtype(tensorflow::DT_INT32);
  tensor.mutable_tensor_shape()->add_dim()->set_size(static_cast<int64_t>(rows.size()));
  tensor.mutable_tensor_shape()->add_dim()->set_size(rows.empty() ? 0 : static_cast<int64_t>(rows[0].size()));
  for (const std::vector<int32_t>& row : rows) tensor.mutable_int_val()->Add(row.begin(), row.end());
  return tensor;
}

}  // namespace paraflow::serve
