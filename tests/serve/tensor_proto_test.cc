// TensorProto decoding from each of its encodings, TensorFlow's fill rule, and the errors naming
// the input; encoding the output.
#include "serve/tensor_proto.h"

#include <google/protobuf/text_format.h>
#include <gtest/gtest.h>

#include <cstring>

#include "base/error.h"
#include "expect_error.h"

namespace paraflow::serve {
namespace {

tensorflow::TensorProto tensor(const std::string& text) {
  tensorflow::TensorProto proto;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &proto)) << text;
  return proto;
}

template <typename T>
std::string bytes_of(const std::vector<T>& values) {
  std::string bytes(values.size() * sizeof(T), '\0');
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

TEST(TensorProto, IntegersFromEachEncoding) {
  EXPECT_EQ(integer_values(tensor("dtype: DT_INT32 tensor_shape { dim { size: 2 } dim { size: 2 } } int_val: [1, -2, 3, 4]"), "x"),
            (std::vector<int64_t>{1, -2, 3, 4}));
  EXPECT_EQ(integer_values(tensor("dtype: DT_INT64 tensor_shape { dim { size: 2 } } int64_val: [5000000000, 7]"), "x"),
            (std::vector<int64_t>{5000000000, 7}));

  tensorflow::TensorProto content = tensor("dtype: DT_INT32 tensor_shape { dim { size: 3 } }");
  content.set_tensor_content(bytes_of(std::vector<int32_t>{10, -1, 65536}));
  EXPECT_EQ(integer_values(content, "x"), (std::vector<int64_t>{10, -1, 65536}));
  content.set_dtype(tensorflow::DT_INT64);
  content.set_tensor_content(bytes_of(std::vector<int64_t>{1, int64_t{1} << 40, -3}));
  EXPECT_EQ(integer_values(content, "x"), (std::vector<int64_t>{1, int64_t{1} << 40, -3}));
}

TEST(TensorProto, FewerValuesRepeatTheLastAndNoneAreZeros) {
  EXPECT_EQ(integer_values(tensor("dtype: DT_INT32 tensor_shape { dim { size: 4 } } int_val: [1, 7]"), "x"),
            (std::vector<int64_t>{1, 7, 7, 7}));
  EXPECT_EQ(integer_values(tensor("dtype: DT_INT64 tensor_shape { dim { size: 2 } }"), "x"), (std::vector<int64_t>{0, 0}));
  EXPECT_EQ(float_values(tensor("dtype: DT_FLOAT tensor_shape { dim { size: 3 } } float_val: 0.5"), "x"),
            (std::vector<double>{0.5, 0.5, 0.5}));
}

TEST(TensorProto, FloatsFromEachEncoding) {
  EXPECT_EQ(float_values(tensor("dtype: DT_DOUBLE tensor_shape { dim { size: 2 } } double_val: [0.25, -1.5]"), "x"),
            (std::vector<double>{0.25, -1.5}));
  tensorflow::TensorProto content = tensor("dtype: DT_FLOAT tensor_shape { dim { size: 2 } }");
  content.set_tensor_content(bytes_of(std::vector<float>{0.75f, 2.0f}));
  EXPECT_EQ(float_values(content, "x"), (std::vector<double>{0.75, 2.0}));
}

TEST(TensorProto, ScalarsAreShapeEmptyOrAllOnes) {
  EXPECT_EQ(integer_scalar(tensor("dtype: DT_INT32 int_val: 32"), "max_new_tokens"), 32);
  EXPECT_EQ(integer_scalar(tensor("dtype: DT_INT64 tensor_shape { dim { size: 1 } dim { size: 1 } } int64_val: 9"), "seed"), 9);
  EXPECT_DOUBLE_EQ(float_scalar(tensor("dtype: DT_FLOAT float_val: 0.5"), "temperature"), 0.5);
  testing::expect_error<InputError>([] { integer_scalar(tensor("dtype: DT_INT32 tensor_shape { dim { size: 2 } } int_val: [1, 2]"), "max_new_tokens"); },
                 {"max_new_tokens", "a scalar (shape []) is expected, got shape [2]"});
}

TEST(TensorProto, ErrorsNameTheInput) {
  testing::expect_error<InputError>([] { integer_values(tensor("dtype: DT_FLOAT tensor_shape { dim { size: 1 } } float_val: 1"), "input_ids"); },
                 {"input_ids", "dtype is DT_FLOAT, expected DT_INT32 or DT_INT64"});
  testing::expect_error<InputError>([] { float_values(tensor("dtype: DT_INT32 int_val: 1"), "temperature"); },
                 {"temperature", "dtype is DT_INT32, expected DT_FLOAT or DT_DOUBLE"});
  testing::expect_error<InputError>(
      [] {
        tensorflow::TensorProto unknown = tensor("int_val: 1");
        unknown.set_dtype(static_cast<tensorflow::DataType>(99));  // a dtype newer than our types.proto
        integer_values(unknown, "input_ids");
      },
      {"input_ids", "dtype 99"});
  testing::expect_error<InputError>([] { integer_values(tensor("dtype: DT_INT32 tensor_shape { dim { size: 2 } } tensor_content: 'abc'"), "input_ids"); },
                 {"input_ids", "tensor_content holds 3 bytes, the shape needs 8"});
  testing::expect_error<InputError>([] { integer_values(tensor("dtype: DT_INT32 tensor_shape { dim { size: 2 } } int_val: [1, 2, 3]"), "input_ids"); },
                 {"input_ids", "3 values for 2 elements"});
  testing::expect_error<InputError>([] { tensor_dims(tensor("dtype: DT_INT32 tensor_shape { dim { size: 2 } dim { size: -1 } }"), "input_ids"); },
                 {"input_ids", "dimension 1 is -1"});
  testing::expect_error<InputError>([] { tensor_dims(tensor("dtype: DT_INT32 tensor_shape { unknown_rank: true }"), "input_ids"); },
                 {"input_ids", "unknown rank"});
  // A few bytes may not ask for a huge tensor (the fill rule would allocate it).
  testing::expect_error<InputError>([] { integer_values(tensor("dtype: DT_INT32 tensor_shape { dim { size: 100000 } dim { size: 100000 } } int_val: 1"), "input_ids"); },
                 {"input_ids", "more than the 4194304 elements"});
  testing::expect_error<InputError>([] { tensor_dims(tensor("tensor_shape { dim { size: 4611686018427387904 } dim { size: 4 } }"), "input_ids"); },
                 {"input_ids", "more than"});
  // A zero dimension makes an empty tensor whatever the others.
  EXPECT_TRUE(integer_values(tensor("dtype: DT_INT32 tensor_shape { dim { size: 0 } dim { size: 9000000 } }"), "x").empty());
}

TEST(TensorProto, Int32MatrixAsTfServingWritesIt) {
  const tensorflow::TensorProto matrix = int32_matrix({{1, 2, 3}, {4, 5, 6}});
  EXPECT_EQ(matrix.dtype(), tensorflow::DT_INT32);
  EXPECT_EQ(tensor_dims(matrix, "output_ids"), (std::vector<int64_t>{2, 3}));
  EXPECT_TRUE(matrix.tensor_content().empty());
  EXPECT_EQ(std::vector<int32_t>(matrix.int_val().begin(), matrix.int_val().end()), (std::vector<int32_t>{1, 2, 3, 4, 5, 6}));
}

}  // namespace
}  // namespace paraflow::serve
