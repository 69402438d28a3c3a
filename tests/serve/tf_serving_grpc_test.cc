// TF Serving's gRPC Predict over a real engine and a real gRPC client on loopback: a call whose
// client cancels stops its rows at their next token and leaves the engine idle. (Everything a
// client sees is checked with TF Serving's own Python client in tf_serving_grpc_check.py.)
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <thread>

#include "model/model_files.h"
#include "model_configs.h"
#include "reference_runner.h"
#include "serve/tf_serving_grpc.h"
#include "tensorflow_serving/apis/prediction_service.grpc.pb.h"

namespace paraflow {
namespace {

namespace tfs = tensorflow::serving;

// Polls `done` every millisecond for up to ten seconds.
template <typename Condition>
bool eventually(Condition done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

TEST(TfServingGrpc, ACancelledPredictStopsItsRows) {
  constexpr int64_t kRows = 4, kNewTokens = 1000;
  const model::GptConfig config = testing::gpt_config(61, 1024, 64, 2, 2);
  model::ParameterSet parameters{model::gpt_tensor_specs(config), cpu_backend()};
  Rng rng(5);
  model::initialize_gpt(parameters, config, rng.next_u64());
  testing::TempDir dir;
  model::save_model_dir(dir.path() / "gpt", config, parameters);
  serve::ModelRegistry registry{
      {{.name = "gpt", .base_path = dir.path() / "gpt", .single_version = true}},
      [](const serve::ModelSource& source, int64_t, const std::filesystem::path&) {
        return serve::load_export_dir(source.base_path, cpu_backend(), {.kv_cache_gb = 0.05});
      },
      [](const std::string&) {},
      std::chrono::seconds(1)};
  registry.poll();
  serve::TfServingGrpc grpc_server(registry, "");
  const int port = grpc_server.listen("127.0.0.1", 0);

  tfs::PredictRequest request;
  request.mutable_model_spec()->set_name("gpt");
  tensorflow::TensorProto& ids = (*request.mutable_inputs())["input_ids"];
  ids.set_dtype(tensorflow::DT_INT32);
  ids.mutable_tensor_shape()->add_dim()->set_size(kRows);
  ids.mutable_tensor_shape()->add_dim()->set_size(2);
  for (int i = 0; i < kRows * 2; ++i) ids.add_int_val(i + 1);
  tensorflow::TensorProto& new_tokens = (*request.mutable_inputs())["max_new_tokens"];
  new_tokens.set_dtype(tensorflow::DT_INT32);
  new_tokens.add_int_val(kNewTokens);

  auto stub = tfs::PredictionService::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  tfs::PredictResponse response;
  auto status = std::async(std::launch::async, [&] { return stub->Predict(&context, request, &response); });
  infer::Engine& engine = *registry.find("gpt")->engine;
  ASSERT_TRUE(eventually([&] { return engine.stats().generated_tokens > 0; }));
  context.TryCancel();
  EXPECT_EQ(status.get().error_code(), grpc::StatusCode::CANCELLED);

  // The rows stop at their next token instead of generating all kRows x kNewTokens for no one.
  EXPECT_TRUE(eventually([&] {
    const infer::EngineStats stats = engine.stats();
    return stats.running + stats.waiting == 0;
  }));
  EXPECT_LT(engine.stats().generated_tokens, kRows * kNewTokens);
  grpc_server.stop(std::chrono::milliseconds(0));
}

}  // namespace
}  // namespace paraflow
