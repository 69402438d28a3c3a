// What a training config names (issue 44): relative paths in a config file are relative to its
// folder (with --set, to the current directory), and every path error names the key and the
// resolved path; the tokenizer an export will carry must be the one the model trains on; and
// training data never takes validation shards.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "base/config.h"
#include "base/file_io.h"
#include "cli/config_schema.h"
#include "cli/run_setup.h"
#include "data/prepare.h"
#include "data/tokenizer.h"
#include "data/tokenizer_train.h"
#include "expect_error.h"
#include "faults/process.h"
#include "reference_runner.h"

namespace paraflow {
namespace {

namespace fs = std::filesystem;
using testing::expect_error;

const char* kModel = "model: {vocab_size: 512, n_positions: 16, n_embd: 8, n_layer: 1, n_head: 2}\n";

// A project folder: configs/run.yaml beside data/ and runs/, the test's current directory elsewhere.
struct Project {
  testing::TempDir dir;
  fs::path config() const { return dir.path() / "configs" / "run.yaml"; }
  void write_config(const std::string& yaml) const {
    fs::create_directories(config().parent_path());
    write_file_atomic(config(), std::string(kModel) + yaml);
  }
  cli::RunSetup load(const std::vector<std::string>& overrides = {}) const {
    return cli::RunSetup::load(config().string(), overrides);
  }
};

// The same file, however the two paths spell it.
void expect_same_file(const fs::path& a, const fs::path& b) {
  EXPECT_TRUE(fs::equivalent(a, b)) << a << " vs " << b;
}

TEST(ConfigPaths, RelativeToTheConfigFileFolderAndToTheCurrentDirectoryWithSet) {
  Project project;
  fs::create_directories(project.dir.path() / "data");
  testing::write_letter_corpus(project.dir.path() / "data" / "corpus.txt", 4000, 5, 1);
  project.write_config("data: {train: ../data/corpus.txt, format: text}\ntrain: {out_dir: ../runs/one}\n");
  ASSERT_NE(fs::current_path(), project.config().parent_path());
  const cli::RunSetup setup = project.load();
  ASSERT_EQ(setup.train_files.size(), 1u);
  expect_same_file(setup.train_files[0], project.dir.path() / "data" / "corpus.txt");
  EXPECT_EQ(setup.train.out_dir, fs::weakly_canonical(project.dir.path()) / "runs/one");

  // --set: as given, from the current directory.
  const fs::path from_here = fs::relative(project.dir.path() / "data" / "corpus.txt");
  ASSERT_TRUE(from_here.is_relative());
  const cli::RunSetup overridden = project.load({"data.train=" + from_here.string(), "train.out_dir=runs/two"});
  EXPECT_EQ(overridden.data_path, from_here.string());
  expect_same_file(overridden.train_files[0], project.dir.path() / "data" / "corpus.txt");
  EXPECT_EQ(overridden.train.out_dir, fs::path("runs/two"));
  // Absolute paths stay as written.
  const fs::path absolute = project.dir.path() / "data" / "corpus.txt";
  project.write_config(fmt::format("data: {{train: {}, format: text}}\n", absolute.string()));
  EXPECT_EQ(project.load().data_path, absolute.string());
}

TEST(ConfigPaths, ErrorsNameTheKeyAndTheResolvedPath) {
  Project project;
  const std::string configs = fs::weakly_canonical(project.config().parent_path()).string();
  project.write_config("data: {train: missing/corpus.txt, format: text}\n");
  expect_error<InputError>([&] { project.load(); },
                           {"data.train 'missing/corpus.txt' (" + configs + "/missing/corpus.txt): no such file"});
  project.write_config("data: {train: no-prepared-dir, format: prepared}\n");
  expect_error<InputError>([&] { project.load(); },
                           {"data.train 'no-prepared-dir' (" + configs + "/no-prepared-dir): no such directory"});

  testing::write_letter_corpus(project.config().parent_path() / "corpus.txt", 4000, 5, 1);
  project.write_config("data: {train: corpus.txt, format: text, tokenizer: no-tokenizer}\n");
  expect_error<InputError>([&] { project.load(); },
                           {"data.tokenizer 'no-tokenizer' (" + configs + "/no-tokenizer): no such directory"});
  // A folder without a tokenizer in it: the tokenizer's own message, after the key.
  fs::create_directories(project.config().parent_path() / "empty");
  project.write_config("data: {train: corpus.txt, format: text, tokenizer: empty}\n");
  expect_error<InputError>([&] { project.load(); }, {"data.tokenizer 'empty' (" + configs + "/empty): "});
  project.write_config("data: {train: corpus.txt, format: text, validation: ../nothing/*.tfrecord}\n");
  expect_error<InputError>([&] { project.load(); },
                           {"data.validation '../nothing/*.tfrecord' (" + fs::path(configs).parent_path().string() +
                            "/nothing/*.tfrecord)"});
}

// The shipped configs name the repository's runs/ (where scripts/quickstart.sh puts the data,
// and where the README's commands, run from the repository root, look) from configs/.
TEST(ShippedConfigs, PathsResolveToTheRepositorysRunsFolder) {
  const fs::path root = testing::source_dir();
  const Config quickstart = Config::from_file((root / "configs/quickstart.yaml").string(), cli::run_config_schema());
  EXPECT_EQ(quickstart.path("data.train").lexically_normal(), (root / "runs/quickstart-data").lexically_normal());
  EXPECT_EQ(quickstart.path("data.tokenizer").lexically_normal(),
            (root / "runs/quickstart-tokenizer").lexically_normal());
  EXPECT_EQ(quickstart.path("train.out_dir").lexically_normal(), (root / "runs/quickstart").lexically_normal());
  const Config small = Config::from_file((root / "configs/gpt-small.yaml").string(), cli::run_config_schema());
  EXPECT_EQ(small.path("train.out_dir").lexically_normal(), (root / "runs/gpt-small").lexically_normal());
}

// A tokenizer trained on a little text, saved in `dir`.
void train_tokenizer(const fs::path& dir, const std::string& text) {
  data::BpeTrainOptions options;
  options.vocab_size = 300;
  data::BpeTrainer trainer(options);
  trainer.add_text(text);
  trainer.train().save(dir);
}

// Prepared shards of a few hundred paragraphs with the tokenizer in `tokenizer`.
void prepare(const fs::path& tokenizer, const fs::path& out) {
  std::string text;
  for (int i = 0; i < 300; ++i) text += fmt::format("Paragraph {} says the jury said {} things.\n\n", i, i % 7);
  write_file_atomic(out.parent_path() / "story.txt", text);
  data::PrepareOptions options;
  options.tokenizer = tokenizer;
  options.inputs = {(out.parent_path() / "story.txt").string()};
  options.out = out;
  options.val_fraction = 0.1;
  options.progress = false;
  data::prepare(options);
}

// configs/tokenizer and the shards prepared with it in configs/prepared; returns configs/.
fs::path prepare_beside(const Project& project) {
  const fs::path configs = project.config().parent_path();
  train_tokenizer(configs / "tokenizer", "The jury said the jury said the things it said.");
  prepare(configs / "tokenizer", configs / "prepared");
  return configs;
}

// Issue 44's silent garbage: quickstart.yaml with data.format switched to text trained a byte
// model and exported the BPE tokenizer, so generate and serve fed it BPE ids. Now refused, by
// RunSetup and by `paraflow train` (exit 1), before any training.
TEST(TokenizerMatchesData, ByteLevelTextWithATokenizerIsRefused) {
  Project project;
  const fs::path configs = project.config().parent_path();
  train_tokenizer(configs / "tokenizer", "The jury said the jury said the things it said.");
  testing::write_letter_corpus(configs / "corpus.txt", 4000, 5, 1);
  project.write_config("data: {train: corpus.txt, format: text, tokenizer: tokenizer}\n"
                       "train: {out_dir: ../run, steps: 1, batch_size: 2, sequence_length: 8}\n");
  const std::vector<std::string> says = {"data.tokenizer 'tokenizer' (" + (configs / "tokenizer").string() + ") is set",
                                         "data.format text trains on bytes"};
  expect_error<InputError>([&] { project.load(); }, says);
  const testing::Ended ended = testing::run_process(
      fmt::format("{} train --config {} --threads 1", std::getenv("PARAFLOW_BINARY"), project.config().string()),
      project.dir.path() / "train.txt", std::chrono::seconds(60));
  testing::expect_refused(ended, "format text with a BPE tokenizer", says[1]);
  EXPECT_EQ(ended.exit_code, 1);
  EXPECT_FALSE(fs::exists(project.dir.path() / "run" / "export")) << ended.output;
  // Without the tokenizer, a byte-level run: accepted.
  project.write_config("data: {train: corpus.txt, format: text}\n");
  EXPECT_NO_THROW(project.load());
}

// The same copy of quickstart.yaml without data.tokenizer: its shards read as bytes. Refused.
TEST(TokenizerMatchesData, APreparedDirectoryReadAsTextIsRefused) {
  Project project;
  const fs::path configs = prepare_beside(project);
  project.write_config("data: {train: prepared, format: text}\n");
  expect_error<InputError>([&] { project.load(); },
                           {"data.train 'prepared' (" + (configs / "prepared").string() +
                            ") is a `paraflow data prepare` directory, but data.format text would read its shards"});
}

// Shards prepared with one tokenizer and a data.tokenizer of another: the export would carry
// ids the model never learned. Refused naming both.
TEST(TokenizerMatchesData, PreparedDataWithAnotherTokenizerIsRefused) {
  Project project;
  const fs::path configs = prepare_beside(project);
  train_tokenizer(configs / "other", "Quite other words entirely, with other merges in them.");
  project.write_config("data: {train: prepared, tokenizer: other}\n");
  const std::string other = data::Tokenizer::load(configs / "other").fingerprint();
  const std::string used = data::Tokenizer::load(configs / "tokenizer").fingerprint();
  expect_error<InputError>([&] { project.load(); },
                           {"data.tokenizer 'other'", "is not the tokenizer data.train 'prepared'", used, other});
  EXPECT_NO_THROW(project.load({"data.tokenizer=" + (configs / "tokenizer").string()}));
}

// A prepared folder that lost its manifest.json was read as TFRecord files, val-* among them:
// validation data trained on. Refused, naming the shard; so is a file in both splits.
TEST(SplitsApart, APreparedFolderWithoutItsManifestIsRefused) {
  Project project;
  const fs::path configs = prepare_beside(project);
  project.write_config("data: {train: prepared}\n");
  EXPECT_EQ(project.load().data_format, "prepared");
  fs::remove(configs / "prepared" / "manifest.json");
  for (const char* format : {"auto", "tfrecord"}) {
    expect_error<InputError>([&] { project.load({std::string("data.format=") + format}); },
                             {"data.train 'prepared' (" + (configs / "prepared").string() + ") takes " +
                                  (configs / "prepared" / "val-00000.tfrecord").string(),
                              "without its manifest.json"});
  }
  // The training shards alone, with the validation shards as data.validation: fine; the same
  // file in both: refused.
  const std::string train_glob = (configs / "prepared" / "train-*").string();
  EXPECT_NO_THROW(project.load({"data.train=" + train_glob, "data.validation=" + (configs / "prepared/val-*").string()}));
  expect_error<InputError>(
      [&] { project.load({"data.train=" + train_glob, "data.validation=" + train_glob}); },
      {(configs / "prepared" / "train-00000.tfrecord").string() + " is in both data.train and data.validation"});
}

}  // namespace
}  // namespace paraflow
