// tf.train.Example records: building them, and reading features back with errors that say which
// record of which file lacks which feature or holds the wrong type.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "data/example.pb.h"

namespace paraflow::data {

// Where a record came from, for error messages: "file.tfrecord: record at byte offset 1234".
struct RecordSource {
  std::string_view file = "<memory>";
  uint64_t offset = 0;
  std::string describe() const;
};

// Serialized Example{features: {key: int64_list(values)}}: what `data prepare` writes per record.
std::string make_int64_example(std::string_view key, std::span<const int64_t> values);
inline std::string make_input_ids_example(std::span<const int64_t> ids) { return make_int64_example("input_ids", ids); }

// Parses a serialized Example; InputError naming `source` if the bytes are not one.
tf::Example parse_example(std::string_view record, const RecordSource& source = {});

// The feature's values; InputError if the feature is missing or of another kind.
std::span<const int64_t> int64_feature(const tf::Example& example, std::string_view key,
                                       const RecordSource& source = {});
std::span<const float> float_feature(const tf::Example& example, std::string_view key,
                                     const RecordSource& source = {});
const google::protobuf::RepeatedPtrField<std::string>& bytes_feature(const tf::Example& example, std::string_view key,
                                                                     const RecordSource& source = {});

// Reads one int64 feature straight from the serialized bytes, without building the Example
// (no per-feature map nodes or strings): the input pipeline's hot path. Same values as
// parse_example + int64_feature, protobuf merge semantics included (a repeated key: the last
// entry wins; a Feature that repeats its int64_list: the lists concatenate), and on a missing or
// mistyped feature the same error, since it then asks protobuf. Like TensorFlow's fast parser
// it does not validate what it skips (other features' bytes, UTF-8 of keys).
void decode_int64_feature(std::string_view record, std::string_view key, std::vector<int64_t>& out,
                          const RecordSource& source = {});

}  // namespace paraflow::data
