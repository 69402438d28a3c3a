// Checkpoints: exact resume (bitwise, CPU deterministic), fallback from a corrupt latest
// checkpoint, and SIGTERM during `paraflow train` saving a checkpoint and exiting 0.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <thread>

#include "base/file_io.h"
#include "model/model_files.h"
#include "model/part_slices.h"
#include "model/safetensors.h"
#include "reference_runner.h"
#include "test_util.h"
#include "trained_model.h"

namespace paraflow {
namespace {

std::vector<float> flat_copy(const model::ParameterSet& parameters) {
  const float* data = parameters.flat().data<float>();
  return {data, data + parameters.numel()};
}

TEST(Checkpoint, ResumeContinuesBitwise) {
  testing::TempDir dir;
  model::GptConfig config = testing::small_config();
  train::TokenSource data = testing::repetitive_tokens(config.vocab_size);
  const int64_t steps = 8, stop_at = 3;

  train::Trainer uninterrupted(config, testing::short_training(dir.path() / "a", steps), data, cpu_backend());
  uninterrupted.initialize_or_resume();
  std::vector<double> losses_a;
  for (int64_t i = 0; i < steps; ++i) losses_a.push_back(uninterrupted.step().loss);

  {
    train::Trainer first(config, testing::short_training(dir.path() / "b", steps), data, cpu_backend());
    EXPECT_FALSE(first.initialize_or_resume());
    for (int64_t i = 0; i < stop_at; ++i) first.step();
    first.save_checkpoint();
  }
  train::Trainer resumed(config, testing::short_training(dir.path() / "b", steps), data, cpu_backend());
  ASSERT_TRUE(resumed.initialize_or_resume());
  ASSERT_EQ(resumed.current_step(), stop_at);
  for (int64_t i = stop_at; i < steps; ++i) EXPECT_EQ(resumed.step().loss, losses_a[static_cast<size_t>(i)]) << "step " << i;
  std::vector<float> a = flat_copy(uninterrupted.parameters()), b = flat_copy(resumed.parameters());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << "parameters differ after resume";
}

// Rewrites `checkpoint` in the single-file format that checkpoints had before they were sharded:
// model.safetensors as an export, optimizer.safetensors with "m."/"v." + name, state.json, and a
// manifest of exactly those four and config.json.
void rewrite_as_single_file(const std::filesystem::path& checkpoint, const model::GptConfig& config) {
  model::SliceReader reader = train::CheckpointManager::open(checkpoint, config);
  const std::vector<model::TensorSpec> specs = model::gpt_tensor_specs(config);
  model::ParameterSet weights(specs, cpu_backend()), first(specs, cpu_backend()), second(specs, cpu_backend());
  model::read_part(reader, weights, specs, {}, "", weights.flat().data<float>(), 0, weights.numel());
  model::read_part(reader, first, specs, {}, "m.", first.flat().data<float>(), 0, first.numel());
  model::read_part(reader, second, specs, {}, "v.", second.flat().data<float>(), 0, second.numel());
  const std::string state = read_file(checkpoint / "state.json");
  std::filesystem::remove_all(checkpoint);
  std::filesystem::create_directories(checkpoint);
  model::save_model_dir(checkpoint, config, weights);
  std::vector<std::pair<std::string, Tensor>> moments;
  for (size_t i = 0; i < specs.size(); ++i) {
    moments.emplace_back("m." + specs[i].name, first.at(i));
    moments.emplace_back("v." + specs[i].name, second.at(i));
  }
  write_file_atomic(checkpoint / "optimizer.safetensors", model::serialize_safetensors(moments));
  write_file_atomic(checkpoint / "state.json", state);
  nlohmann::json manifest = {{"files", nlohmann::json::object()}};
  for (const char* name : {"config.json", "model.safetensors", "optimizer.safetensors", "state.json"}) {
    const std::string content = read_file(checkpoint / name);
    manifest["files"][name] = {{"bytes", content.size()}, {"crc32c", crc32c(content.data(), content.size())}};
  }
  write_file_atomic(checkpoint / "manifest.json", manifest.dump());
}

TEST(Checkpoint, SingleFileCheckpointsOfEarlierVersionsStillResumeBitwise) {
  testing::TempDir dir;
  model::GptConfig config = testing::small_config();
  train::TokenSource data = testing::repetitive_tokens(config.vocab_size);
  const int64_t steps = 6, stop_at = 3;
  train::Trainer uninterrupted(config, testing::short_training(dir.path() / "a", steps), data, cpu_backend());
  uninterrupted.initialize_or_resume();
  std::vector<double> losses;
  for (int64_t i = 0; i < steps; ++i) losses.push_back(uninterrupted.step().loss);
  std::filesystem::path saved;
  {
    train::Trainer first(config, testing::short_training(dir.path() / "b", steps), data, cpu_backend());
    first.initialize_or_resume();
    for (int64_t i = 0; i < stop_at; ++i) first.step();
    saved = first.save_checkpoint();
  }
  ASSERT_TRUE(std::filesystem::exists(saved / "index.json"));
  rewrite_as_single_file(saved, config);
  ASSERT_FALSE(std::filesystem::exists(saved / "index.json"));
  train::CheckpointManager::verify(saved);
  train::Trainer resumed(config, testing::short_training(dir.path() / "b", steps), data, cpu_backend());
  ASSERT_TRUE(resumed.initialize_or_resume());
  ASSERT_EQ(resumed.current_step(), stop_at);
  for (int64_t i = stop_at; i < steps; ++i) EXPECT_EQ(resumed.step().loss, losses[static_cast<size_t>(i)]) << "step " << i;
  std::vector<float> a = flat_copy(uninterrupted.parameters()), b = flat_copy(resumed.parameters());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << "parameters differ after resume";
}

TEST(Checkpoint, CorruptLatestFallsBackToPrevious) {
  testing::TempDir dir;
  model::GptConfig config = testing::small_config();
  train::TokenSource data = testing::repetitive_tokens(config.vocab_size);
  train::Trainer trainer(config, testing::short_training(dir.path(), 10), data, cpu_backend());
  trainer.initialize_or_resume();
  trainer.step();
  std::filesystem::path older = trainer.save_checkpoint();
  trainer.step();
  std::filesystem::path newer = trainer.save_checkpoint();
  std::filesystem::resize_file(newer / "slices-00000.safetensors", std::filesystem::file_size(newer / "slices-00000.safetensors") / 2);

  train::CheckpointManager manager(dir.path(), 3);
  EXPECT_THROW(train::CheckpointManager::verify(newer), InputError);
  ASSERT_TRUE(manager.latest_valid().has_value());
  EXPECT_EQ(*manager.latest_valid(), older);
  train::Trainer resumed(config, testing::short_training(dir.path(), 10), data, cpu_backend());
  ASSERT_TRUE(resumed.initialize_or_resume());
  EXPECT_EQ(resumed.current_step(), 1);
}

TEST(Checkpoint, CrashWhileWritingLeavesThePreviousOneLoadable) {
  testing::TempDir dir;
  model::GptConfig config = testing::small_config();
  train::TokenSource data = testing::repetitive_tokens(config.vocab_size);
  train::Trainer trainer(config, testing::short_training(dir.path(), 10), data, cpu_backend());
  trainer.initialize_or_resume();
  trainer.step();
  std::filesystem::path complete = trainer.save_checkpoint();
  // What a crash mid-save leaves: the temporary directory with some files, and (had the rename
  // raced) a directory without its manifest.
  std::filesystem::copy(complete, dir.path() / "ckpt-000000002.tmp.999");
  std::filesystem::remove(dir.path() / "ckpt-000000002.tmp.999" / "manifest.json");
  std::filesystem::copy(complete, dir.path() / "ckpt-000000003");
  std::filesystem::remove(dir.path() / "ckpt-000000003" / "manifest.json");
  train::CheckpointManager manager(dir.path(), 3);
  ASSERT_TRUE(manager.latest_valid().has_value());
  EXPECT_EQ(*manager.latest_valid(), complete);
}

TEST(Checkpoint, KeepsOnlyTheLastK) {
  testing::TempDir dir;
  model::GptConfig config = testing::small_config();
  train::TokenSource data = testing::repetitive_tokens(config.vocab_size);
  train::TrainConfig train_config = testing::short_training(dir.path(), 10);
  train_config.keep_checkpoints = 2;
  train::Trainer trainer(config, train_config, data, cpu_backend());
  trainer.initialize_or_resume();
  for (int i = 0; i < 4; ++i) {
    trainer.step();
    trainer.save_checkpoint();
  }
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path())) count += entry.is_directory();
  EXPECT_EQ(count, 2);
}

// A run that keeps one checkpoint, one step in.
class OneCheckpointKept : public ::testing::Test {
 protected:
  void SetUp() override {
    train_config.keep_checkpoints = 1;
    trainer = std::make_unique<train::Trainer>(config, train_config, data, cpu_backend());
    trainer->initialize_or_resume();
    trainer->step();
  }

  testing::TempDir dir;
  model::GptConfig config = testing::small_config();
  train::TokenSource data = testing::repetitive_tokens(config.vocab_size);
  train::TrainConfig train_config = testing::short_training(dir.path(), 10);
  std::unique_ptr<train::Trainer> trainer;
};

// Saving again at the same step (a stop right after a periodic save, a finished run started
// again) swaps the checkpoint in: one whole checkpoint of that step, no temporary left.
TEST_F(OneCheckpointKept, SavingTheSameStepTwiceKeepsAWholeCheckpoint) {
  const std::filesystem::path first = trainer->save_checkpoint(), second = trainer->save_checkpoint();
  EXPECT_EQ(first, second);
  train::CheckpointManager::verify(second);
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path())) names.push_back(entry.path().filename());
  EXPECT_EQ(names, std::vector<std::string>{second.filename().string()});
}

// With the newest checkpoint corrupt, a run resumes from the one before and saves again: keeping
// one checkpoint keeps the one just saved, not the corrupt newer one (nor a folder of another name).
TEST_F(OneCheckpointKept, PruningKeepsTheCheckpointJustSaved) {
  trainer->save_checkpoint();
  trainer.reset();
  std::filesystem::create_directories(dir.path() / "ckpt-000000009");  // corrupt: no manifest
  std::filesystem::create_directories(dir.path() / "ckpt-best");        // the user's
  train::Trainer resumed(config, train_config, data, cpu_backend());
  ASSERT_TRUE(resumed.initialize_or_resume());
  ASSERT_EQ(resumed.current_step(), 1);
  resumed.step();
  const std::filesystem::path saved = resumed.save_checkpoint();
  train::CheckpointManager::verify(saved);
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "ckpt-000000001"));  // older than the one kept
  EXPECT_TRUE(std::filesystem::exists(dir.path() / "ckpt-best"));
  train::CheckpointManager manager(dir.path(), 1);
  EXPECT_EQ(manager.latest_valid(), saved);
}

// A run resumed on another corpus is refused (batches are drawn by (seed, index) from whatever
// tokens are there: it would go on silently on other data).
TEST_F(OneCheckpointKept, ResumingOnAnotherCorpusIsRefused) {
  trainer->save_checkpoint();
  trainer.reset();
  std::vector<int32_t> other(20000);
  for (size_t i = 0; i < other.size(); ++i) other[i] = static_cast<int32_t>(i % static_cast<size_t>(config.vocab_size));
  train::TokenSource other_data = train::TokenSource::from_tokens(other, 0.1);
  train::Trainer elsewhere(config, train_config, other_data, cpu_backend());
  try {
    elsewhere.initialize_or_resume();
    ADD_FAILURE() << "resumed on another corpus";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("not the corpus this run was trained on"), std::string::npos) << e.what();
  }
  train::Trainer same(config, train_config, data, cpu_backend());
  EXPECT_TRUE(same.initialize_or_resume());
}

TEST(Checkpoint, SigtermSavesACheckpointAndExitsZero) {
  testing::TempDir dir;
  testing::write_letter_corpus(dir.path() / "corpus.txt", 200000, 26, 1);
  write_file_atomic(dir.path() / "config.yaml", fmt::format(R"(model: {{vocab_size: 256, n_positions: 32, n_embd: 32, n_layer: 2, n_head: 2}}
data: {{train: "{}", format: text}}
train: {{batch_size: 4, sequence_length: 32, steps: 1000000, out_dir: "{}", log_every: 1000}}
)", (dir.path() / "corpus.txt").string(), (dir.path() / "run").string()));
  const char* binary = std::getenv("PARAFLOW_BINARY");
  ASSERT_NE(binary, nullptr);
  pid_t child = fork();
  if (child == 0) {
    execl(binary, binary, "train", "--config", (dir.path() / "config.yaml").c_str(), "--threads", "1", nullptr);
    _exit(127);
  }
  std::this_thread::sleep_for(std::chrono::seconds(3));
  kill(child, SIGTERM);
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  train::CheckpointManager manager(dir.path() / "run", 3);
  auto latest = manager.latest_valid();
  ASSERT_TRUE(latest.has_value());
  EXPECT_TRUE(std::filesystem::exists(dir.path() / "run" / "export" / "model.safetensors"));
}

}  // namespace
}  // namespace paraflow
