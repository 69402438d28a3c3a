// TF Serving's REST API over a real engine (a small random GPT), answered through a recording
// exchange: status, metadata, :predict in row and columnar form (greedy rows equal the
// single-sequence generator's), and TF Serving's error bodies and codes for bad requests.
#include <gtest/gtest.h>

#include <future>
#include <nlohmann/json.hpp>

#include "infer/generator.h"
#include "model/model_files.h"
#include "model_configs.h"
#include "serve/tf_serving_rest.h"
#include "reference_runner.h"

namespace paraflow {
namespace {

using nlohmann::json;

class RecordingExchange : public serve::Exchange {
 public:
  void respond(int status, const std::string&, std::string body, serve::HttpHeaders) override {
    answered.set_value({status, std::move(body)});
  }
  void start_stream(const std::string&, serve::HttpHeaders) override { ADD_FAILURE() << "TF Serving's API does not stream"; }
  void send(std::string) override {}
  void end_stream() override {}
  // A client already gone: the callback fires at once, as the server does for a late registration.
  void on_disconnect(std::function<void()> callback) override {
    if (gone) callback();
  }

  bool gone = false;
  std::promise<std::pair<int, std::string>> answered;
};

class TfServingRestTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Rng rng(3);
    model::initialize_gpt(parameters, config, rng.next_u64());
    model::save_model_dir(dir.path() / "gpt", config, parameters);
  }

  std::pair<int, json> call(const std::string& method, const std::string& path, const std::string& body = "",
                            bool client_gone = false) {
    auto exchange = std::make_shared<RecordingExchange>();
    exchange->gone = client_gone;
    auto answer = exchange->answered.get_future();
    serve::HttpRequest request;
    request.method = method;
    request.target = path;
    request.body = body;
    rest.handle(request, path, exchange);
    auto [status, text] = answer.get();
    return {status, json::parse(text)};
  }

  std::vector<int32_t> greedy(const std::vector<int32_t>& prompt, int64_t tokens) {
    infer::Generator generator(config, parameters, cpu_backend());
    infer::Sampler sampler({.temperature = 0});
    return generator.generate(prompt, tokens, sampler).tokens;
  }

  model::GptConfig config = testing::gpt_config(61, 40, 32, 2, 2);
  model::ParameterSet parameters{model::gpt_tensor_specs(config), cpu_backend()};
  testing::TempDir dir;
  serve::ModelRegistry registry{
      {{.name = "gpt", .base_path = dir.path() / "gpt", .single_version = true}},
      [](const serve::ModelSource& source, int64_t, const std::filesystem::path&) {
        return serve::load_export_dir(source.base_path, cpu_backend(), {.kv_cache_gb = 0.01});
      },
      [](const std::string&) {},
      std::chrono::seconds(1)};
  serve::TfServingRest rest{registry, 1700000000};
};

TEST_F(TfServingRestTest, StatusAndMetadataAsTfServingWritesThem) {
  auto [status, body] = call("GET", "/v1/models/gpt");
  EXPECT_EQ(status, 404);  // nothing loaded yet
  EXPECT_NE(body["error"].get<std::string>().find("could not find any versions of model \"gpt\""), std::string::npos);
  registry.poll();
  std::tie(status, body) = call("GET", "/v1/models/gpt");
  EXPECT_EQ(status, 200);
  // TF Serving's status, and OpenAI's model object on the same path (GET /v1/models/{id}).
  EXPECT_EQ(body, json::parse(R"({"model_version_status": [{"version": "1", "state": "AVAILABLE",
                                  "status": {"error_code": "OK", "error_message": ""}}],
                                  "id": "gpt", "object": "model", "created": 1700000000, "owned_by": "paraflow"})"));
  std::tie(status, body) = call("GET", "/v1/models/gpt/versions/1");
  EXPECT_EQ(status, 200);
  EXPECT_FALSE(body.contains("id")) << body;
  std::tie(status, body) = call("GET", "/v1/models/gpt/versions/1/metadata");
  EXPECT_EQ(status, 200);
  EXPECT_EQ(body["model_spec"]["version"], "1");
  const json signature = body["metadata"]["signature_def"]["signature_def"]["serving_default"];
  EXPECT_EQ(signature["method_name"], "tensorflow/serving/predict");
  EXPECT_EQ(signature["inputs"]["input_ids"]["dtype"], "DT_INT32");
  EXPECT_EQ(signature["inputs"]["input_ids"]["tensor_shape"]["dim"].size(), 2u);
  EXPECT_EQ(signature["inputs"]["input_ids"]["tensor_shape"]["dim"][0]["size"], "-1");
  EXPECT_EQ(signature["outputs"]["output_ids"]["dtype"], "DT_INT32");
  // A scalar's shape, as TF Serving writes one: present, with no dims.
  EXPECT_EQ(signature["inputs"]["max_new_tokens"]["tensor_shape"], json::parse(R"({"dim": [], "unknown_rank": false})"));
}

TEST_F(TfServingRestTest, PredictRowsAndColumnsEqualTheGeneratorsGreedyTokens) {
  registry.poll();
  const std::vector<int32_t> first{3, 1, 4, 1, 5}, second{9, 2, 6, 5, 3};
  auto [status, body] = call("POST", "/v1/models/gpt:predict", R"({"instances": [[3, 1, 4, 1, 5], [9, 2, 6, 5, 3]]})");
  ASSERT_EQ(status, 200) << body;
  EXPECT_EQ(body["predictions"][0].get<std::vector<int32_t>>(), greedy(first, 16));
  EXPECT_EQ(body["predictions"][1].get<std::vector<int32_t>>(), greedy(second, 16));
  std::tie(status, body) = call("POST", "/v1/models/gpt/versions/1:predict",
                                R"({"inputs": {"input_ids": [[9, 2, 6, 5, 3]], "max_new_tokens": 5}})");
  ASSERT_EQ(status, 200) << body;
  EXPECT_EQ(body["outputs"][0].get<std::vector<int32_t>>(), greedy(second, 5));
  std::tie(status, body) = call("POST", "/v1/models/gpt/versions/1:predict",
                                R"({"signature_name": "serving_default",
                                    "instances": [{"input_ids": [3, 1, 4, 1, 5], "max_new_tokens": 3}]})");
  ASSERT_EQ(status, 200) << body;
  EXPECT_EQ(body["predictions"][0].get<std::vector<int32_t>>(), greedy(first, 3));
}

TEST_F(TfServingRestTest, BadRequestsGetTfServingErrors) {
  auto expect_error = [&](const std::string& method, const std::string& path, const std::string& body, int status,
                          const std::string& part) {
    auto [code, answer] = call(method, path, body);
    EXPECT_EQ(code, status) << path << " " << body << ": " << answer;
    ASSERT_TRUE(answer.contains("error")) << answer;
    EXPECT_NE(answer["error"].get<std::string>().find(part), std::string::npos) << answer;
  };
  const std::string predict = "/v1/models/gpt:predict";
  expect_error("POST", predict, R"({"instances": [[1]]})", 503, "no version available yet");
  registry.poll();
  expect_error("POST", "/v1/models/other:predict", R"({"instances": [[1]]})", 404, "no model \"other\"");
  expect_error("GET", "/v1/models/gpt/versions/2", "", 404, "no version 2");
  expect_error("GET", "/v1/models/gpt/versions/x", "", 400, "version 'x'");
  expect_error("GET", "/v1/models/gpt/labels/canary", "", 400, "no version label \"canary\"");  // TF Serving's code
  // The other signatures' verbs: this model has only Predict's; no other verb is TF Serving's.
  expect_error("POST", "/v1/models/gpt:classify", R"({"examples": [{"x": 1}]})", 400, "only the predict signature");
  expect_error("POST", "/v1/models/gpt/versions/1:regress", R"({"examples": [{"x": 1}]})", 400, ":regress needs a");
  expect_error("POST", "/v1/models/other:classify", "{}", 404, "no model \"other\"");
  expect_error("GET", "/v1/models/gpt:classify", "", 405, "use POST");
  expect_error("POST", "/v1/models/gpt:explain", "{}", 404, "no verb ':explain'");
  expect_error("GET", predict, "", 405, "use POST");
  expect_error("POST", predict, "{not json", 400, "JSON Parse error");
  expect_error("POST", predict, R"({"instances": [[1, 2], [3]]})", 400, "input_ids: row 1 has 1 ids");
  expect_error("POST", predict, R"({"instances": [[1, -2]]})", 400, "instances[0][1]");
  expect_error("POST", predict, R"({"instances": [[1, 99]]})", 400, "input_ids: id 99 at [0, 1] is outside the model's vocabulary of 61");
  expect_error("POST", predict, R"({"instances": [[1]], "inputs": [[1]]})", 400, "exactly one of");
  // More rows than the engine ever holds (64 running + 1024 queued by default): never "retry later".
  json rows = json::array();
  for (int i = 0; i < 64 + 1024 + 1; ++i) rows.push_back({1, 2});
  expect_error("POST", predict, json{{"instances", rows}}.dump(), 400,
               "1089 rows are more than this server runs at once (1088 = --max-num-seqs 64 + --max-waiting 1024)");
  expect_error("POST", predict, R"({"instances": [[1]], "extra": 1})", 400, "unknown field 'extra'");
  expect_error("POST", predict, R"({"inputs": {"input_ids": [[1]], "top_k": 3}})", 400, "no input 'top_k'");
  expect_error("POST", predict, R"({"inputs": {"input_ids": [[1]], "max_new_tokens": 0}})", 400, "max_new_tokens");
  expect_error("POST", predict, R"({"inputs": {"input_ids": [[1, 2, 3]], "max_new_tokens": 38}})", 400,
               "max_new_tokens: 3 ids per row plus max_new_tokens 38 exceed the model's context of 40");
  expect_error("POST", predict, R"({"instances": [{"input_ids": [1], "seed": 1}, {"input_ids": [2], "seed": 2}]})", 400,
               "scalar inputs differ");
  expect_error("POST", predict, R"({"signature_name": "other", "instances": [[1]]})", 400, "'other' not found");
  expect_error("POST", predict, R"({"inputs": {"input_ids": [[1]], "seed": -1}})", 400, "seed: must be >= 0");
  expect_error("POST", predict, R"({"inputs": {"input_ids": [[1]], "max_new_tokens": 9223372036854775807}})", 400,
               "exceed the model's context");
  expect_error("POST", predict, R"({"instances": )" + std::string(100000, '[') + std::string(100000, ']') + "}", 400,
               "deeper than 64 levels");
  const infer::EngineStats stats = registry.find("gpt")->engine->stats();
  EXPECT_EQ(stats.running + stats.waiting, 0);
}

// A Predict whose client has gone runs no rows (nor the rest of their tokens, had they started).
TEST_F(TfServingRestTest, APredictWhoseClientLeftRunsNothing) {
  registry.poll();
  auto [status, body] = call("POST", "/v1/models/gpt:predict", R"({"instances": [[1, 2], [3, 4]]})", true);
  EXPECT_EQ(status, 503);
  EXPECT_NE(body["error"].get<std::string>().find("went away"), std::string::npos) << body;
  const infer::EngineStats stats = registry.find("gpt")->engine->stats();
  EXPECT_EQ(stats.generated_tokens + stats.running + stats.waiting, 0);
}

// While the server drains, a kept-alive connection may still send requests: a Predict is refused
// (503) before it reaches an engine; status and metadata still answer.
TEST_F(TfServingRestTest, DrainingRefusesPredictButStillAnswersStatus) {
  registry.poll();
  rest.draining();
  auto [status, body] = call("POST", "/v1/models/gpt:predict", R"({"instances": [[1, 2]]})");
  EXPECT_EQ(status, 503);
  EXPECT_NE(body["error"].get<std::string>().find("shutting down"), std::string::npos) << body;
  EXPECT_EQ(call("GET", "/v1/models/gpt").first, 200);
  EXPECT_EQ(registry.find("gpt")->engine->stats().running, 0);
}

}  // namespace
}  // namespace paraflow
