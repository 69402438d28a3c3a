// The evaluator role and TensorBoard summaries, read back by the `tensorboard` package:
// the chief's train/* scalars, and an evaluator (TF_CONFIG task or `paraflow eval --watch`)
// that evaluates the run's checkpoints, writes eval/ summaries, and after a restart does not
// evaluate a checkpoint twice.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <atomic>
#include <cmath>
#include <future>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/file_io.h"
#include "train/evaluator.h"
#include "trained_model.h"
#include "reference_runner.h"
#include "test_util.h"

namespace paraflow {
namespace {

nlohmann::json tensorboard_scalars(const std::filesystem::path& logdir) {
  std::filesystem::path python = testing::source_dir() / ".venv-data/bin/python";
  EXPECT_TRUE(std::filesystem::exists(python)) << "run scripts/setup.sh (.venv-data)";
  std::filesystem::path out = logdir.parent_path() / (logdir.filename().string() + ".json");
  std::string command = fmt::format("{} {} {} > {}", python.string(),
                                    (testing::source_dir() / "tests/reference/tf_events.py").string(), logdir.string(),
                                    out.string());
  EXPECT_EQ(std::system(command.c_str()), 0) << command;
  return nlohmann::json::parse(read_file(out)).at("scalars");
}

class EvaluatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::write_letter_corpus(dir.path() / "corpus.txt", 40000, 8, 4);
    write_file_atomic(dir.path() / "config.yaml", fmt::format(R"(model: {{vocab_size: 256, n_positions: 16, n_embd: 16, n_layer: 1, n_head: 2}}
data: {{train: "{}", format: text, validation_fraction: 0.2}}
train: {{batch_size: 4, sequence_length: 16, steps: 12, checkpoint_every: 4, eval_batches: 2, out_dir: "{}", log_every: 100}}
)", (dir.path() / "corpus.txt").string(), (dir.path() / "run").string()));
  }
  std::string command(const std::string& subcommand) const {
    return fmt::format("{} {} --config {} --threads 1", std::getenv("PARAFLOW_BINARY"), subcommand,
                       (dir.path() / "config.yaml").string());
  }
  testing::TempDir dir;
};

TEST_F(EvaluatorTest, TfConfigEvaluatorFollowsTheChief) {
  // A chief and an evaluator task running the same command.
  std::string cluster = R"("cluster":{"chief":["127.0.0.1:1"],"evaluator":["127.0.0.1:2"]})";
  std::string evaluator = fmt::format(R"(TF_CONFIG='{{{},"task":{{"type":"evaluator","index":0}}}}' {} > {} 2>&1 &)",
                                      cluster, command("train"), (dir.path() / "evaluator.log").string());
  ASSERT_EQ(std::system(evaluator.c_str()), 0);
  std::string chief = fmt::format(R"(TF_CONFIG='{{{},"task":{{"type":"chief","index":0}}}}' {} > /dev/null 2>&1)",
                                  cluster, command("train"));
  ASSERT_EQ(std::system(chief.c_str()), 0);
  // The evaluator exits by itself once it has evaluated the final checkpoint.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!std::filesystem::exists(dir.path() / "run/eval/evaluated.json") ||
         nlohmann::json::parse(read_file(dir.path() / "run/eval/evaluated.json"))["step"] != 12) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << read_file(dir.path() / "evaluator.log");
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));

  nlohmann::json train = tensorboard_scalars(dir.path() / "run");
  for (const char* tag : {"train/loss", "train/lr", "train/grad_norm", "train/tokens_per_second", "train/mfu"}) {
    ASSERT_TRUE(train.contains(tag)) << tag;
    EXPECT_EQ(train[tag].size(), 12u) << tag;
    EXPECT_EQ(train[tag].back()[0], 12) << tag;
  }
  nlohmann::json eval = tensorboard_scalars(dir.path() / "run/eval");
  ASSERT_TRUE(eval.contains("loss"));
  EXPECT_EQ(eval["loss"].back()[0], 12);
  double loss = eval["loss"].back()[1];
  EXPECT_NEAR(eval["perplexity"].back()[1].get<double>(), std::exp(loss), 1e-3 * std::exp(loss));

  // `paraflow eval --checkpoint` on the export gives the evaluator's loss for the final step.
  std::string out = (dir.path() / "eval.txt").string();
  ASSERT_EQ(std::system((command("eval") + " --checkpoint " + (dir.path() / "run/export").string() + " > " + out).c_str()), 0);
  // TensorBoard stores float32 scalars: equal up to that rounding (and the 4 printed decimals).
  std::string printed = read_file(out);
  ASSERT_EQ(printed.rfind("val loss ", 0), 0u) << printed;
  EXPECT_NEAR(std::stod(printed.substr(9)), loss, 1e-4) << printed;
}

TEST_F(EvaluatorTest, WatchSurvivesARestartWithoutRepeatingWork) {
  ASSERT_EQ(std::system((command("train") + " > /dev/null 2>&1").c_str()), 0);
  std::string log = (dir.path() / "watch.log").string();
  ASSERT_EQ(std::system((command("eval") + " --watch " + (dir.path() / "run").string() + " 2> " + log).c_str()), 0);
  EXPECT_NE(read_file(log).find("evaluator: step 12"), std::string::npos) << read_file(log);
  // A restarted evaluator remembers step 12 and evaluates nothing again.
  ASSERT_EQ(std::system((command("eval") + " --watch " + (dir.path() / "run").string() + " 2> " + log).c_str()), 0);
  EXPECT_NE(read_file(log).find("resuming after step 12"), std::string::npos) << read_file(log);
  EXPECT_EQ(read_file(log).find("evaluator: step"), std::string::npos) << read_file(log);
}

// The evaluator runs a validation batch in the slices training splits it into (here 4
// accumulation steps): a graph a quarter of the batch, and the loss the trainer's own
// evaluation gives on the same batches.
TEST(Evaluator, RunsEachBatchInTheTrainingMicroBatches) {
  testing::TempDir dir;
  model::GptConfig config = testing::small_config();
  train::TokenSource data = testing::repetitive_tokens(config.vocab_size);
  train::TrainConfig train_config = testing::short_training(dir.path(), 5);
  train_config.batch_size = 8;
  train_config.grad_accumulation = 4;
  train_config.eval_batches = 3;
  train::Trainer trainer(config, train_config, data, cpu_backend());
  trainer.initialize_or_resume();
  trainer.step();
  train::Evaluator evaluator(config, data, cpu_backend(), train_config);
  EXPECT_EQ(evaluator.gpt_graph().graph.value(evaluator.gpt_graph().tokens).shape, (Shape{2, train_config.sequence_length}));
  const double expected = trainer.evaluate(train_config.eval_batches);
  EXPECT_NEAR(evaluator.evaluate(trainer.parameters()).loss, expected, 1e-6 * expected);
  // A batch that does not split into the micro-batches is refused by name.
  train_config.batch_size = 6;
  try {
    train::Evaluator uneven(config, data, cpu_backend(), train_config);
    ADD_FAILURE() << "a batch of 6 in 4 micro-batches was taken";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("train.batch_size (6) must split into 4 micro-batches"), std::string::npos)
        << e.what();
  }
}

// A GEMM peak measured while other processes held the cores reads low (a user's run printed MFU
// 400%): MFU stays at most 1 however low the start-up measurement was (here 1 FLOP/s).
TEST(TrainerSummaries, MfuNeverExceedsOneWhenThePeakWasMeasuredLow) {
  testing::TempDir dir;
  const model::GptConfig config = testing::small_config();
  train::TokenSource data = testing::repetitive_tokens(config.vocab_size);
  train::Trainer trainer(config, testing::short_training(dir.path(), 4), data, cpu_backend());
  trainer.initialize_or_resume();
  trainer.run(nullptr, 1.0);
  nlohmann::json scalars = tensorboard_scalars(dir.path());
  ASSERT_TRUE(scalars.contains("train/mfu"));
  ASSERT_EQ(scalars["train/mfu"].size(), 4u);
  for (const auto& point : scalars["train/mfu"]) EXPECT_LE(point[1].get<double>(), 1.0) << point;
}

// An evaluator that cannot evaluate a checkpoint that stays (here: no validation split) stops
// with the reason after a second try, instead of retrying without pause forever.
TEST(Evaluator, WatchStopsOnAFailureThatIsItsOwn) {
  testing::TempDir dir;
  model::GptConfig config = testing::small_config();
  train::TokenSource data = testing::repetitive_tokens(config.vocab_size);
  train::TrainConfig train_config = testing::short_training(dir.path(), 5);
  train::Trainer trainer(config, train_config, data, cpu_backend());
  trainer.initialize_or_resume();
  trainer.step();
  trainer.save_checkpoint();
  std::vector<int32_t> tokens(2000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(i % 7);
  train::TokenSource no_validation = train::TokenSource::from_tokens(tokens, 0.0);
  train::Evaluator evaluator(config, no_validation, cpu_backend(), train_config);
  std::atomic<bool> stop{false};
  auto watching = std::async(std::launch::async, [&] { evaluator.watch(dir.path(), train_config.steps, &stop, 0.05); });
  const bool ended = watching.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
  stop = true;
  EXPECT_TRUE(ended) << "the evaluator kept retrying";
  try {
    watching.get();
    ADD_FAILURE() << "the watch ended without an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("validation split"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace paraflow
