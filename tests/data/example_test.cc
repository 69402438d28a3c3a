// tf.train.Example helpers: round trip, errors, and the wire-format fast path against protobuf.
#include "data/example.h"

#include <gtest/gtest.h>

#include <random>

#include "base/error.h"

namespace paraflow::data {
namespace {

std::string error_of(const std::function<void()>& body) {
  try {
    body();
  } catch (const InputError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no InputError";
  return "";
}

TEST(Example, InputIdsRoundTrip) {
  const std::vector<int64_t> ids = {0, 1, 50256, -1, INT64_MAX, INT64_MIN, 127, 128, 16383, 16384};
  std::string bytes = make_input_ids_example(ids);
  tf::Example example = parse_example(bytes);
  auto got = int64_feature(example, "input_ids");
  EXPECT_EQ(std::vector<int64_t>(got.begin(), got.end()), ids);
  std::vector<int64_t> fast;
  decode_int64_feature(bytes, "input_ids", fast);
  EXPECT_EQ(fast, ids);
  // Packed: one length-delimited run of varints, as TensorFlow writes it.
  tf::Int64List list;
  list.mutable_value()->Add(ids.begin(), ids.end());
  EXPECT_NE(bytes.find(list.SerializeAsString()), std::string::npos);
}

TEST(Example, MissingAndMistypedFeaturesNameRecordAndKey) {
  tf::Example example;
  auto& map = *example.mutable_features()->mutable_feature();
  map["text"].mutable_bytes_list()->add_value("hi");
  map["input_ids"].mutable_float_list()->add_value(1.0f);
  map["empty"];  // no kind: reads as an empty list of any kind
  const std::string bytes = example.SerializeAsString();
  const RecordSource source{"shard-00003.tfrecord", 4096};

  std::string missing = error_of([&] { int64_feature(parse_example(bytes, source), "tokens", source); });
  EXPECT_NE(missing.find("shard-00003.tfrecord: record at byte offset 4096"), std::string::npos) << missing;
  EXPECT_NE(missing.find("no feature 'tokens' (it has: empty, input_ids, text)"), std::string::npos) << missing;

  std::string mistyped = error_of([&] { int64_feature(parse_example(bytes, source), "input_ids", source); });
  EXPECT_NE(mistyped.find("feature 'input_ids' is a float_list, expected a int64_list"), std::string::npos)
      << mistyped;
  std::vector<int64_t> out;
  EXPECT_EQ(error_of([&] { decode_int64_feature(bytes, "input_ids", out, source); }), mistyped);
  EXPECT_EQ(error_of([&] { decode_int64_feature(bytes, "tokens", out, source); }), missing);

  EXPECT_TRUE(int64_feature(parse_example(bytes), "empty").empty());
  decode_int64_feature(bytes, "empty", out);
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(bytes_feature(parse_example(bytes), "text")[0], "hi");
  EXPECT_EQ(float_feature(parse_example(bytes), "input_ids")[0], 1.0f);

  std::string garbage = error_of([&] { parse_example("\xff\xff\xff", source); });
  EXPECT_NE(garbage.find("record at byte offset 4096: not a tf.train.Example"), std::string::npos) << garbage;
  EXPECT_EQ(error_of([&] { decode_int64_feature("\xff\xff\xff", "input_ids", out, source); }), garbage);
}

// Concatenated messages merge: map entries with the same key replace, lists inside one Feature
// concatenate, and a oneof switch clears. The fast path must agree with protobuf on all of it.
TEST(Example, FastPathFollowsProtobufMergeSemantics) {
  auto ids = [](std::vector<int64_t> v) { return make_input_ids_example(v); };
  std::vector<int64_t> out;
  decode_int64_feature(ids({1, 2}) + ids({3}), "input_ids", out);
  EXPECT_EQ(out, std::vector<int64_t>{3});

  tf::Feature a, b, c;
  a.mutable_int64_list()->add_value(1);
  b.mutable_int64_list()->add_value(2);
  c.mutable_float_list()->add_value(1.0f);
  auto entry_with = [](const std::string& feature_bytes) {
    // Features{feature: {key: "k", value: <bytes>}} written by hand, then wrapped in an Example.
    std::string entry = std::string("\x0a\x01k", 3) + "\x12" + char(feature_bytes.size()) + feature_bytes;
    std::string features = "\x0a" + std::string(1, char(entry.size())) + entry;
    return "\x0a" + std::string(1, char(features.size())) + features;
  };
  for (const std::string& feature : {a.SerializeAsString() + b.SerializeAsString(),
                                     a.SerializeAsString() + c.SerializeAsString() + b.SerializeAsString(),
                                     a.SerializeAsString() + c.SerializeAsString()}) {
    std::string bytes = entry_with(feature);
    tf::Example example;
    ASSERT_TRUE(example.ParseFromString(bytes));
    const tf::Feature& parsed = example.features().feature().at("k");
    if (parsed.kind_case() == tf::Feature::kFloatList) {
      EXPECT_THROW(decode_int64_feature(bytes, "k", out), InputError);
      continue;
    }
    decode_int64_feature(bytes, "k", out);
    EXPECT_EQ(out, std::vector<int64_t>(parsed.int64_list().value().begin(), parsed.int64_list().value().end()));
  }
}

// Random mutations of an Example: wherever protobuf yields the int64 feature, the fast path
// yields the same values, and whenever the fast path throws, protobuf fails too. (The fast path
// may accept what protobuf rejects elsewhere in the record, e.g. a key that is not UTF-8.)
TEST(Example, FastPathAgreesWithProtobufOnMutations) {
  std::mt19937_64 rng(99);
  tf::Example base;
  auto& map = *base.mutable_features()->mutable_feature();
  for (int i = 0; i < 50; ++i) map["input_ids"].mutable_int64_list()->add_value(static_cast<int64_t>(rng()) >> (rng() % 64));
  map["other"].mutable_bytes_list()->add_value("abc");
  map["f"].mutable_float_list()->add_value(2.5f);
  const std::string good = base.SerializeAsString();
  int agreed = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    std::string bytes = good;
    for (int f = 0; f < 1 + static_cast<int>(rng() % 3); ++f) bytes[rng() % bytes.size()] = static_cast<char>(rng());
    if (rng() % 4 == 0) bytes.resize(rng() % bytes.size());
    tf::Example example;
    bool parsed = example.ParseFromString(bytes);
    const tf::Feature* feature = nullptr;
    if (parsed) {
      auto it = example.features().feature().find("input_ids");
      if (it != example.features().feature().end()) feature = &it->second;
    }
    std::vector<int64_t> out;
    if (feature && (feature->has_int64_list() || feature->kind_case() == tf::Feature::KIND_NOT_SET)) {
      decode_int64_feature(bytes, "input_ids", out);
      ASSERT_EQ(out, std::vector<int64_t>(feature->int64_list().value().begin(), feature->int64_list().value().end()))
          << "trial " << trial;
      ++agreed;
    } else {
      try {
        decode_int64_feature(bytes, "input_ids", out);
      } catch (const InputError&) {
      }
    }
  }
  EXPECT_GT(agreed, 100);
}

}  // namespace
}  // namespace paraflow::data
