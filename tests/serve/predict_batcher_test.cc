// TF Serving's dynamic batching for Predict over a real engine (a small random GPT): requests
// arriving together run as one batch and answer what each answers alone (the single-sequence
// generator's greedy tokens), a lone request waits batch_timeout_micros, the article's settings
// behave as documented, a full queue and an oversized request are refused naming the limit,
// num_batch_threads bounds the batches running, and stop() leaves no request unanswered.
#include <gtest/gtest.h>

#include <future>
#include <thread>

#include "infer/generator.h"
#include "model_configs.h"
#include "serve/predict_batcher.h"

namespace paraflow {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// The article's settings (TF Serving's batching guide), in its batching_parameters.txt form.
const char* const kArticleSettings =
    "max_batch_size { value: 32 }\nbatch_timeout_micros { value: 100000 }\nnum_batch_threads { value: 4 }\n";

// Blocks the engine's thread in its first token until released: the engine runs nothing meanwhile.
class BlockingSink : public infer::RequestSink {
 public:
  bool on_token(const infer::TokenEvent&) override {
    if (!blocked_) {
      blocked_ = true;
      entered.set_value();
      release_.wait();
    }
    return true;
  }
  void on_finish(const infer::Outcome&) override {}

  std::promise<void> entered;
  std::promise<void> release;

 private:
  bool blocked_ = false;
  std::shared_future<void> release_ = release.get_future().share();
};

class PredictBatcherTest : public ::testing::Test {
 protected:
  std::vector<int32_t> greedy(const std::vector<int32_t>& prompt, int64_t tokens) {
    infer::Generator generator(config, parameters, cpu_backend());
    infer::Sampler sampler({.temperature = 0});
    return generator.generate(prompt, tokens, sampler).tokens;
  }

  static std::future<serve::PredictOutcome> predict(serve::PredictBatcher& batcher, serve::PredictInputs inputs) {
    auto promise = std::make_shared<std::promise<serve::PredictOutcome>>();
    std::future<serve::PredictOutcome> outcome = promise->get_future();
    batcher.predict(std::move(inputs),
                    [promise](serve::PredictOutcome result) { promise->set_value(std::move(result)); });
    return outcome;
  }

  static serve::PredictOutcome wait(std::future<serve::PredictOutcome>& outcome) {
    EXPECT_EQ(outcome.wait_for(seconds(30)), std::future_status::ready);
    return outcome.get();
  }

  Histogram::Snapshot histogram(const std::string& name) { return metrics().histogram(name, "", {1}).snapshot(); }
  double refused(const std::string& reason) {
    return metrics().counter("paraflow_predict_batch_refused_total", "", {{"reason", reason}}).value();
  }
  MetricsRegistry& metrics() { return engine.metrics(); }

  // Polls `condition` (a test's view of another thread's progress) for up to 10 s.
  static bool eventually(const std::function<bool()>& condition) {
    const auto deadline = std::chrono::steady_clock::now() + seconds(10);
    while (!condition()) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(milliseconds(1));
    }
    return true;
  }

  static model::ParameterSet random_parameters(const model::GptConfig& config) {
    model::ParameterSet parameters(model::gpt_tensor_specs(config), cpu_backend());
    Rng rng(3);
    model::initialize_gpt(parameters, config, rng.next_u64());
    return parameters;
  }

  model::GptConfig config = testing::gpt_config(61, 40, 32, 2, 2);
  // Initialised before the engine, which copies the weights it decodes with.
  model::ParameterSet parameters = random_parameters(config);
  infer::Engine engine{config, parameters, cpu_backend(), infer::EngineOptions{.kv_cache_gb = 0.01}};
};

TEST_F(PredictBatcherTest, RequestsArrivingTogetherRunAsOneBatchAndAnswerAsAlone) {
  // A long timeout: the batch runs because it is full, not because the timeout passed.
  serve::PredictBatcher batcher(
      engine, {.max_batch_size = 6, .batch_timeout_micros = 60'000'000, .num_batch_threads = 1}, metrics());
  // Prompts of different lengths share the batch; one request has two rows.
  const std::vector<std::vector<std::vector<int32_t>>> requests = {
      {{3, 1, 4}}, {{1, 5, 9, 2, 6}}, {{5, 3}}, {{5, 8, 9, 7, 9, 3, 2}}, {{3, 8, 4, 6}, {2, 6, 4, 3}}};
  // Arriving 10 ms apart: the batch waits for the last one.
  std::vector<std::future<serve::PredictOutcome>> outcomes;
  for (const auto& rows : requests) {
    outcomes.push_back(predict(batcher, {.input_ids = rows, .max_new_tokens = 8}));
    std::this_thread::sleep_for(milliseconds(10));
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    const serve::PredictOutcome outcome = wait(outcomes[i]);
    ASSERT_EQ(outcome.error, "") << "request " << i;
    ASSERT_EQ(outcome.output_ids.size(), requests[i].size());
    for (size_t row = 0; row < requests[i].size(); ++row) {
      EXPECT_EQ(outcome.output_ids[row], greedy(requests[i][row], 8)) << "request " << i << " row " << row;
    }
  }
  const Histogram::Snapshot batches = histogram("paraflow_predict_batch_size");
  EXPECT_EQ(batches.count, 1u);
  EXPECT_EQ(batches.sum, 6);
  EXPECT_EQ(histogram("paraflow_predict_batch_wait_seconds").count, requests.size());
  // What /metrics shows.
  const std::string text = metrics().render();
  EXPECT_NE(text.find("\nparaflow_predict_batch_size_count 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("\nparaflow_predict_batch_size_sum 6\n"), std::string::npos) << text;
}

TEST_F(PredictBatcherTest, ALoneRequestWaitsTheBatchTimeoutAndNotMuchMore) {
  serve::PredictBatcher batcher(engine, serve::parse_batching_parameters(kArticleSettings, "article"), metrics());
  std::future<serve::PredictOutcome> outcome = predict(batcher, {.input_ids = {{3, 1, 4, 1, 5}}, .max_new_tokens = 4});
  EXPECT_EQ(wait(outcome).output_ids, (std::vector<std::vector<int32_t>>{greedy({3, 1, 4, 1, 5}, 4)}));
  const Histogram::Snapshot waits = histogram("paraflow_predict_batch_wait_seconds");
  ASSERT_EQ(waits.count, 1u);
  std::printf("  a lone request waited %.1f ms (batch_timeout_micros 100000)\n", waits.sum * 1e3);
  EXPECT_GE(waits.sum, 0.1);
  EXPECT_LT(waits.sum, 0.1 + 0.5);  // a generous margin for a loaded machine: a behaviour check
  EXPECT_EQ(histogram("paraflow_predict_batch_size").sum, 1);
}

TEST_F(PredictBatcherTest, TheArticlesSettingsRunAFullBatchAtOnceAndTheRestAtTheTimeout) {
  serve::PredictBatcher batcher(engine, serve::parse_batching_parameters(kArticleSettings, "article"), metrics());
  std::vector<std::future<serve::PredictOutcome>> outcomes;
  for (int32_t i = 0; i < 33; ++i) outcomes.push_back(predict(batcher, {.input_ids = {{i % 61}}, .max_new_tokens = 2}));
  for (int32_t i = 0; i < 33; ++i) {
    EXPECT_EQ(wait(outcomes[i]).output_ids, (std::vector<std::vector<int32_t>>{greedy({i % 61}, 2)})) << i;
  }
  // Two batches: 32 rows (over 16: the bucket at 32), then the 33rd alone after the timeout.
  const Histogram::Snapshot batches = histogram("paraflow_predict_batch_size");
  EXPECT_EQ(batches.count, 2u);
  EXPECT_EQ(batches.sum, 33);
  ASSERT_EQ(batches.upper_bounds, (std::vector<double>{1, 2, 4, 8, 16, 32}));
  EXPECT_EQ(batches.cumulative_counts[0], 1u);  // <= 1 row
  EXPECT_EQ(batches.cumulative_counts[4], 1u);  // <= 16 rows
  EXPECT_EQ(batches.cumulative_counts[5], 2u);  // <= 32 rows
  const Histogram::Snapshot waits = histogram("paraflow_predict_batch_wait_seconds");
  EXPECT_EQ(waits.count, 33u);
  EXPECT_GE(waits.sum, 0.1);  // the last one's wait
}

TEST_F(PredictBatcherTest, AFullQueueRefusesAtOnceNamingMaxEnqueuedBatches) {
  // One batch may wait, the open one: a request that does not fit in it is refused.
  serve::PredictBatcher batcher(
      engine,
      {.max_batch_size = 2, .batch_timeout_micros = 60'000'000, .max_enqueued_batches = 1, .num_batch_threads = 1},
      metrics());
  std::future<serve::PredictOutcome> first = predict(batcher, {.input_ids = {{3, 1, 4}}, .max_new_tokens = 4});
  try {
    predict(batcher, {.input_ids = {{1, 5}, {9, 2}}, .max_new_tokens = 4});
    ADD_FAILURE() << "a request needing a second batch was queued";
  } catch (const serve::BatchQueueFull& error) {
    EXPECT_NE(std::string(error.what()).find("max_enqueued_batches is 1"), std::string::npos) << error.what();
  }
  EXPECT_EQ(refused("queue_full"), 1);
  EXPECT_NE(metrics().render().find("paraflow_predict_batch_refused_total{reason=\"queue_full\"} 1\n"),
            std::string::npos);
  // A request that fits in the open batch is still taken.
  std::future<serve::PredictOutcome> second = predict(batcher, {.input_ids = {{2, 7}}, .max_new_tokens = 4});
  // stop() runs the waiting batch without waiting its timeout out, and returns once it answered.
  batcher.stop();
  ASSERT_EQ(first.wait_for(milliseconds(0)), std::future_status::ready);
  ASSERT_EQ(second.wait_for(milliseconds(0)), std::future_status::ready);
  EXPECT_EQ(first.get().output_ids, (std::vector<std::vector<int32_t>>{greedy({3, 1, 4}, 4)}));
  EXPECT_EQ(second.get().output_ids, (std::vector<std::vector<int32_t>>{greedy({2, 7}, 4)}));
  EXPECT_EQ(histogram("paraflow_predict_batch_size").count, 1u);
  EXPECT_THROW(predict(batcher, {.input_ids = {{1}}}), infer::Draining);
}

TEST_F(PredictBatcherTest, ARequestLargerThanMaxBatchSizeOrNotFittingTheModelIsRefused) {
  serve::PredictBatcher batcher(engine, {.max_batch_size = 2, .num_batch_threads = 1}, metrics());
  try {
    predict(batcher, {.input_ids = {{1}, {2}, {3}}});
    ADD_FAILURE() << "a request of 3 rows was queued with max_batch_size 2";
  } catch (const InputError& error) {
    EXPECT_NE(std::string(error.what()).find("3 rows are more than the batch size limit, max_batch_size 2"),
              std::string::npos)
        << error.what();
  }
  EXPECT_EQ(refused("too_large"), 1);
  EXPECT_THROW(predict(batcher, {.input_ids = {{1, 99}}}), InputError);  // outside the vocabulary of 61
  EXPECT_EQ(histogram("paraflow_predict_batch_size").count, 0u);
  EXPECT_THROW({ serve::PredictBatcher invalid(engine, {.max_batch_size = 0}, metrics()); }, InputError);
}

TEST_F(PredictBatcherTest, NumBatchThreadsBoundsTheBatchesRunning) {
  auto blocker = std::make_shared<BlockingSink>();
  engine.submit({.prompt = {1}, .max_tokens = 2}, blocker);
  blocker->entered.get_future().wait();
  serve::PredictBatcher batcher(engine, {.max_batch_size = 1, .batch_timeout_micros = 0, .num_batch_threads = 1},
                                metrics());
  std::vector<std::future<serve::PredictOutcome>> outcomes;
  for (int32_t i = 0; i < 3; ++i) outcomes.push_back(predict(batcher, {.input_ids = {{i + 1}}, .max_new_tokens = 2}));
  // The first batch runs (in the blocked engine); the other two wait for its slot. (No ASSERT
  // before the release: the engine would stay blocked.)
  EXPECT_TRUE(eventually([&] { return histogram("paraflow_predict_batch_size").count == 1; }));
  std::this_thread::sleep_for(milliseconds(50));
  EXPECT_EQ(histogram("paraflow_predict_batch_size").count, 1u);
  EXPECT_NE(metrics().render().find("\nparaflow_predict_enqueued_batches 2\n"), std::string::npos);
  blocker->release.set_value();
  for (int32_t i = 0; i < 3; ++i) {
    EXPECT_EQ(wait(outcomes[i]).output_ids, (std::vector<std::vector<int32_t>>{greedy({i + 1}, 2)})) << i;
  }
  EXPECT_EQ(histogram("paraflow_predict_batch_size").count, 3u);
  EXPECT_NE(metrics().render().find("\nparaflow_predict_enqueued_batches 0\n"), std::string::npos);
}

TEST_F(PredictBatcherTest, ABatchTheEngineRefusesAnswersEachRequestWithTheError) {
  serve::PredictBatcher batcher(engine, {.batch_timeout_micros = 60'000'000, .num_batch_threads = 1}, metrics());
  std::future<serve::PredictOutcome> first = predict(batcher, {.input_ids = {{3, 1, 4}}});
  std::future<serve::PredictOutcome> second = predict(batcher, {.input_ids = {{1, 5}}});
  engine.drain(milliseconds(0));  // the engine takes no more requests
  batcher.stop();
  for (std::future<serve::PredictOutcome>* outcome : {&first, &second}) {
    const serve::PredictOutcome refused = wait(*outcome);
    EXPECT_NE(refused.error.find("shutting down"), std::string::npos);
    EXPECT_EQ(refused.failure, serve::PredictFailure::unavailable);  // 503 / UNAVAILABLE, not a failure of ours
  }
}

TEST_F(PredictBatcherTest, AllowedBatchSizesRecordThePaddedSizeWithoutPadding) {
  serve::PredictBatcher batcher(
      engine,
      {.max_batch_size = 8, .batch_timeout_micros = 60'000'000, .num_batch_threads = 1,
       .allowed_batch_sizes = {2, 4, 8}},
      metrics());
  std::vector<std::future<serve::PredictOutcome>> outcomes;
  for (int32_t i = 0; i < 3; ++i) outcomes.push_back(predict(batcher, {.input_ids = {{i + 1}}, .max_new_tokens = 2}));
  batcher.stop();
  for (int32_t i = 0; i < 3; ++i) {
    EXPECT_EQ(wait(outcomes[i]).output_ids, (std::vector<std::vector<int32_t>>{greedy({i + 1}, 2)})) << i;
  }
  EXPECT_EQ(histogram("paraflow_predict_batch_size").sum, 3);
  const Histogram::Snapshot padded = histogram("paraflow_predict_batch_padded_size");
  EXPECT_EQ(padded.count, 1u);
  EXPECT_EQ(padded.sum, 4);
}

}  // namespace
}  // namespace paraflow
