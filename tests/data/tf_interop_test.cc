// Interop with the real thing: TensorFlow reads the TFRecord/Example files we write and we read
// the ones it writes (all three compressions); TensorBoard's event reader reads our event files.
// The oracles are tests/reference/tf_tfrecord.py and tf_events.py in .venv-data
// (scripts/setup_python_data.sh). Without them these tests FAIL: they never skip.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "reference_runner.h"
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <random>

#include "base/file_io.h"
#include "data/events.h"
#include "data/example.h"
#include "data/tfrecord.h"

namespace paraflow::data {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

using testing::source_dir;

fs::path temp_dir() {
  static fs::path dir = [] {
    fs::path d = fs::temp_directory_path() / fmt::format("paraflow_tf_interop.{}", ::getpid());
    fs::create_directories(d);
    return d;
  }();
  return dir;
}

// Runs an oracle; its stdout lands in `out`. Fails the test (with the oracle's stderr) on a
// missing interpreter or a non-zero exit.
bool run_oracle(const std::string& script, const std::string& args, const fs::path& out) {
  const char* env = std::getenv("PARAFLOW_DATA_PYTHON");
  fs::path python = env ? fs::path(env) : source_dir() / ".venv-data/bin/python";
  if (::access(python.c_str(), X_OK) != 0) {
    ADD_FAILURE() << "no oracle interpreter at " << python << ": run scripts/setup_python_data.sh";
    return false;
  }
  fs::path err = out.string() + ".stderr";
  std::string command = fmt::format("'{}' '{}' {} > '{}' 2> '{}'", python.string(),
                                    (source_dir() / "tests/reference" / script).string(), args, out.string(),
                                    err.string());
  int rc = std::system(command.c_str());
  if (rc != 0) {
    ADD_FAILURE() << command << "\nexit " << rc << "\n" << read_file(err);
    return false;
  }
  return true;
}

std::string hex(std::string_view bytes) {
  std::string out;
  for (unsigned char c : bytes) out += fmt::format("{:02x}", c);
  return out;
}

// An Example as the oracle's JSON describes one: {key: {"kind", "values"}}.
json to_json(const tf::Example& example) {
  json out = json::object();
  for (const auto& [key, feature] : example.features().feature()) {
    json values = json::array();
    std::string kind;
    switch (feature.kind_case()) {
      case tf::Feature::kInt64List:
        kind = "int64";
        for (int64_t v : feature.int64_list().value()) values.push_back(v);
        break;
      case tf::Feature::kFloatList:
        kind = "float";
        for (float v : feature.float_list().value()) values.push_back(static_cast<double>(v));
        break;
      case tf::Feature::kBytesList:
        kind = "bytes";
        for (const auto& v : feature.bytes_list().value()) values.push_back(hex(v));
        break;
      default: kind = "none";
    }
    out[key] = {{"kind", kind}, {"values", values}};
  }
  return out;
}

// Floats compare by bits (JSON numbers lose -0.0 vs 0.0 otherwise).
void expect_same(const json& ours, const json& theirs) {
  ASSERT_EQ(ours.size(), theirs.size());
  for (size_t r = 0; r < ours.size(); ++r) {
    ASSERT_EQ(ours[r].size(), theirs[r].size()) << "record " << r << "\nours: " << ours[r].dump().substr(0, 300)
                                                << "\ntheirs: " << theirs[r].dump().substr(0, 300);
    for (const auto& [key, feature] : ours[r].items()) {
      ASSERT_TRUE(theirs[r].contains(key)) << "record " << r << " key " << key;
      const json& other = theirs[r][key];
      ASSERT_EQ(feature["kind"], other["kind"]) << "record " << r << " key " << key;
      ASSERT_EQ(feature["values"].size(), other["values"].size()) << "record " << r << " key " << key;
      for (size_t i = 0; i < feature["values"].size(); ++i) {
        const json& a = feature["values"][i];
        const json& b = other["values"][i];
        if (feature["kind"] == "float") {
          float fa = a.get<float>(), fb = b.get<float>();
          ASSERT_EQ(std::memcmp(&fa, &fb, 4), 0) << "record " << r << " key " << key << " [" << i << "]";
        } else {
          ASSERT_EQ(a, b) << "record " << r << " key " << key << " [" << i << "]";
        }
      }
    }
  }
}

class TensorFlowInterop : public ::testing::TestWithParam<Compression> {};

TEST_P(TensorFlowInterop, WeReadWhatTensorFlowWrites) {
  const Compression compression = GetParam();
  const std::string name(compression_name(compression));
  const fs::path file = temp_dir() / ("tf_written." + name);
  const fs::path expect = temp_dir() / ("tf_written." + name + ".json");
  ASSERT_TRUE(run_oracle("tf_tfrecord.py",
                         fmt::format("write --compression {} --out '{}' --expect '{}'", name, file.string(),
                                     expect.string()),
                         temp_dir() / "write.out"));
  TFRecordReaderOptions options;
  options.compression = compression;
  TFRecordReader reader(file, options);
  json ours = json::array();
  std::vector<std::string> payloads;
  size_t over_1mb = 0;
  while (auto record = reader.next()) {
    RecordSource source{file.string(), reader.record_offset()};
    tf::Example example = parse_example(*record, source);
    ours.push_back(to_json(example));
    if (example.features().feature().contains("input_ids")) {
      std::vector<int64_t> ids;
      decode_int64_feature(*record, "input_ids", ids, source);
      auto slow = int64_feature(example, "input_ids", source);
      EXPECT_EQ(ids, std::vector<int64_t>(slow.begin(), slow.end()));
    }
    over_1mb += record->size() > (1 << 20);
    payloads.emplace_back(*record);
  }
  EXPECT_GE(over_1mb, 2u);
  expect_same(ours, json::parse(read_file(expect)));

  if (compression == Compression::none) {  // the framing is byte-identical to TensorFlow's
    fs::path again = temp_dir() / "rewritten.tfrecord";
    {
      TFRecordWriter writer(again);
      for (const auto& payload : payloads) writer.write(payload);
    }
    EXPECT_TRUE(read_file(again) == read_file(file));
  }
}

// Records that exercise every kind, empty ones, int64 extremes, denormal floats and > 1 MB.
std::vector<tf::Example> our_examples() {
  std::mt19937_64 rng(2024);
  std::vector<tf::Example> examples;
  auto add = [&]() -> google::protobuf::Map<std::string, tf::Feature>& {
    return *examples.emplace_back().mutable_features()->mutable_feature();
  };
  {
    std::vector<int64_t> ids = {1, 2, 3, 50256};
    tf::Example example;
    examples.push_back(parse_example(make_input_ids_example(ids)));
  }
  add();  // no features
  {
    auto& f = add();
    for (float v : {0.1f, -2.5f, 3.4028235e38f, 1.4e-45f, 0.0f, -0.0f}) f["x"].mutable_float_list()->add_value(v);
    f["b"].mutable_bytes_list()->add_value(std::string("\0\xff binary", 9));
    f["b"].mutable_bytes_list()->add_value("");
    f["input_ids"].mutable_int64_list()->add_value(INT64_MIN);
    f["input_ids"].mutable_int64_list()->add_value(INT64_MAX);
    f["input_ids"].mutable_int64_list()->add_value(-1);
  }
  {
    auto& f = add();
    f["e64"].mutable_int64_list();
    f["ef"].mutable_float_list();
    f["eb"].mutable_bytes_list();
  }
  {
    auto& f = add();
    std::string blob(1'300'000, '\0');
    for (char& c : blob) c = static_cast<char>(rng());
    f["blob"].mutable_bytes_list()->add_value(blob);
    for (int i = 0; i < 250'000; ++i) f["input_ids"].mutable_int64_list()->add_value(static_cast<int64_t>(rng() % 50257));
  }
  for (int n = 0; n < 30; ++n) {
    std::vector<int64_t> ids(1 + rng() % 2048);
    for (auto& id : ids) id = static_cast<int64_t>(rng() % 50257);
    examples.push_back(parse_example(make_input_ids_example(ids)));
  }
  return examples;
}

TEST_P(TensorFlowInterop, TensorFlowReadsWhatWeWrite) {
  const Compression compression = GetParam();
  const std::string name(compression_name(compression));
  const fs::path file = temp_dir() / ("ours." + name);
  const auto examples = our_examples();
  json expected = json::array();
  {
    TFRecordWriter writer(file, compression);
    for (const auto& example : examples) {
      writer.write(example.SerializeAsString());
      expected.push_back(to_json(example));
    }
    writer.close();
  }
  const fs::path parsed = temp_dir() / ("ours." + name + ".json");
  ASSERT_TRUE(run_oracle("tf_tfrecord.py", fmt::format("read --compression {} '{}'", name, file.string()), parsed));
  expect_same(expected, json::parse(read_file(parsed)));
}

INSTANTIATE_TEST_SUITE_P(Compressions, TensorFlowInterop,
                         ::testing::Values(Compression::none, Compression::gzip, Compression::zlib),
                         [](const auto& info) { return std::string(compression_name(info.param)); });

TEST(TensorBoardInterop, EventAccumulatorSeesOurTagsStepsAndValues) {
  const fs::path logdir = temp_dir() / "run";
  fs::remove_all(logdir);
  std::vector<double> weights;
  std::mt19937_64 rng(5);
  std::normal_distribution<double> normal;
  for (int i = 0; i < 1000; ++i) weights.push_back(normal(rng));
  {
    EventWriter writer(logdir);
    for (int step = 0; step < 20; ++step) {
      writer.add_scalar("train/loss", 10.0 / (step + 1), step);
      writer.add_scalar("train/lr", 3e-4 * step / 20, step);
    }
    writer.add_histogram("weights/wte", weights, 7);
    writer.add_text("config", "n_layer: 12\n**bold**", 0);
    writer.close();
  }
  const fs::path out = temp_dir() / "events.json";
  ASSERT_TRUE(run_oracle("tf_events.py", "'" + logdir.string() + "'", out));
  json seen = json::parse(read_file(out));
  EXPECT_EQ(seen["file_version"], "brain.Event:2");
  ASSERT_EQ(seen["files"].size(), 1u);
  ASSERT_EQ(seen["scalars"]["train/loss"].size(), 20u);
  for (int step = 0; step < 20; ++step) {
    const json& loss = seen["scalars"]["train/loss"][step];
    EXPECT_EQ(loss[0], step);
    EXPECT_EQ(loss[1].get<double>(), static_cast<float>(10.0 / (step + 1)));
    EXPECT_GT(loss[2].get<double>(), 1.6e9);  // wall time
    EXPECT_EQ(seen["scalars"]["train/lr"][step][1].get<double>(), static_cast<float>(3e-4 * step / 20));
  }
  const json& histo = seen["histograms"]["weights/wte"];
  ASSERT_EQ(histo.size(), 1u);
  tf::HistogramProto want = make_histogram(weights);
  EXPECT_EQ(histo[0][0], 7);
  EXPECT_EQ(histo[0][1].get<double>(), want.min());
  EXPECT_EQ(histo[0][2].get<double>(), want.max());
  EXPECT_EQ(histo[0][3].get<double>(), 1000.0);
  EXPECT_DOUBLE_EQ(histo[0][4].get<double>(), want.sum());
  EXPECT_EQ(histo[0][6].size(), static_cast<size_t>(want.bucket_limit_size()));
  EXPECT_EQ(histo[0][7].size(), static_cast<size_t>(want.bucket_size()));
  ASSERT_EQ(seen["texts"]["config"].size(), 1u);
  EXPECT_EQ(seen["texts"]["config"][0][1], "n_layer: 12\n**bold**");
  EXPECT_EQ(seen["plugins"]["text"], json::array({"config"}));
}

}  // namespace
}  // namespace paraflow::data
