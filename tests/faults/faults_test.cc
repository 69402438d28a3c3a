// Fault injection with real processes, signals and files: paraflow must end cleanly (no crash,
// no hang, no raw library message), say what is wrong, and lose nothing. Each test is one
// defect of the hardening report (issue 8) kept fixed.
#include <gtest/gtest.h>
#include <sys/mount.h>

#include <fmt/format.h>

#include <cstring>
#include <random>

#include "base/file_io.h"
#include "data/example.h"
#include "data/tfrecord.h"
#include "faults/process.h"
#include "reference_runner.h"
#include "test_util.h"
#include "train/checkpoint.h"

namespace paraflow {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

class Faults : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::write_letter_corpus(dir.path() / "corpus.txt", 100000, 26, 5);
    write_config("config.yaml", "");
  }

  // A tiny model on the letter corpus; `train` adds keys to the train section.
  void write_config(const std::string& name, const std::string& train) const {
    write_file_atomic(dir.path() / name,
                      fmt::format(R"(model: {{vocab_size: 256, n_positions: 32, n_embd: 32, n_layer: 2, n_head: 2}}
data: {{train: "{}", format: text}}
train: {{batch_size: 4, sequence_length: 32, steps: 1000000, log_every: 1000, out_dir: "{}"{}}}
dist: {{timeout_seconds: 20}}
)",
                                  (dir.path() / "corpus.txt").string(), (dir.path() / "run").string(), train));
  }
  static std::string binary() { return std::getenv("PARAFLOW_BINARY"); }
  std::string train(const std::string& extra = "") const {
    return fmt::format("{} train --config {} --threads 1 {}", binary(), (dir.path() / "config.yaml").string(), extra);
  }
  static std::string mpirun(int ranks) {
    return fmt::format("mpirun --allow-run-as-root --oversubscribe -np {} -x OMP_NUM_THREADS=1 ", ranks);
  }
  testing::Ended run(const std::string& command, std::chrono::duration<double> deadline = 60s) const {
    return testing::run_process(command, dir.path() / "output.txt", deadline);
  }
  // Trains `steps` steps into run/ and returns its newest checkpoint.
  fs::path trained_checkpoint(int steps) const {
    testing::Ended ended = run(train(fmt::format("--set train.steps={}", steps)));
    EXPECT_EQ(ended.exit_code, 0) << ended.output;
    auto latest = train::CheckpointManager(dir.path() / "run", 3).latest_valid();
    EXPECT_TRUE(latest.has_value());
    return latest.value_or(fs::path());
  }

  // A 300-token BPE trained on the corpus, in dir/tokenizer.
  fs::path trained_tokenizer() const {
    const fs::path tokenizer = dir.path() / "tokenizer";
    testing::Ended ended = run(fmt::format("{} tokenizer train --vocab-size 300 --input {} --out {}", binary(),
                                           (dir.path() / "corpus.txt").string(), tokenizer.string()),
                               60s);
    EXPECT_EQ(ended.exit_code, 0) << ended.output;
    return tokenizer;
  }

  testing::TempDir dir;
};

// 1. SIGTERM at random moments (while loading, building, stepping, saving): never a crash, and
// always a checkpoint and an export.
TEST_F(Faults, SigtermAtRandomMomentsAlwaysEndsWithACheckpoint) {
  std::mt19937_64 random(testing::test_seed());
  std::uniform_real_distribution<double> delay(0.1, 2.5);
  for (int attempt = 0; attempt < 50; ++attempt) {
    fs::remove_all(dir.path() / "run");
    testing::Process process(train(), dir.path() / "output.txt");
    const double seconds = delay(random);
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
    process.signal(SIGTERM);
    testing::Ended ended = process.wait(60s);
    const std::string what = fmt::format("SIGTERM after {:.2f}s (attempt {})", seconds, attempt);
    testing::expect_clean_end(ended, what);
    ASSERT_EQ(ended.exit_code, 0) << what << "\n" << ended.output;
    EXPECT_TRUE(train::CheckpointManager(dir.path() / "run", 3).latest_valid().has_value()) << what;
    EXPECT_TRUE(fs::exists(dir.path() / "run/export/model.safetensors")) << what;
  }
}

// 2. An error on one rank ends the whole job within seconds, printed, never a hang; over MPI
// and over Gloo (TF_CONFIG).
TEST_F(Faults, AnErrorOnOneRankEndsTheWholeJob) {
  write_file_atomic(dir.path() / "not-a-dir", "a regular file");
  const std::string bad_out_dir = "--set train.out_dir=" + (dir.path() / "not-a-dir").string();
  testing::Ended mpi = run(mpirun(2) + train(bad_out_dir), 45s);
  testing::expect_refused(mpi, "mpirun -np 2 with out_dir a file", "cannot create the directory");
  const std::string launcher = (testing::source_dir() / "tests/dist/launch_tf_config.sh").string() + " 2 ";
  testing::Ended gloo = run(launcher + train(bad_out_dir), 45s);
  testing::expect_refused(gloo, "2 TF_CONFIG tasks with out_dir a file", "cannot create the directory");
}

// 3. A train split whose records hold no tokens fails at once, naming it (it spun forever).
TEST_F(Faults, EmptyRecordsFailNamingTheFiles) {
  fs::create_directories(dir.path() / "empty");
  {
    data::TFRecordWriter writer(dir.path() / "empty/train-0.tfrecord");
    for (int i = 0; i < 10; ++i) writer.write(data::make_int64_example("input_ids", {}));
    writer.close();
  }
  testing::Ended ended = run(train("--set data.format=tfrecord --set data.train=" + (dir.path() / "empty").string()), 30s);
  testing::expect_refused(ended, "a split of empty records", "no tokens in " + (dir.path() / "empty").string());
}

// 4 and 11. Bad command-line values: refused naming the flag, never a crash.
TEST_F(Faults, BadFlagValuesAreRefusedNamingTheFlag) {
  const std::string config = (dir.path() / "config.yaml").string();
  struct Case {
    std::string arguments, needle;
  };
  for (const Case& c : std::vector<Case>{{"plan --config " + config + " --ranks 0", "--ranks"},
                                         {"plan --config " + config + " --ranks -2", "--ranks"},
                                         {"plan --config " + config + " --memory-budget -1", "--memory-budget"},
                                         {"plan --config " + config + " --threads -1", "--threads"},
                                         {"plan --config " + config + " --ps-tasks 0", "--ps-tasks"},
                                         {"plan --config " + config + " --ps-tasks 2 --workers 0", "--workers"},
                                         {"train --config " + config + " --threads -1", "--threads"},
                                         {"eval --config " + config + " --checkpoint . --threads -1", "--threads"},
                                         {"generate --model . --prompt x --max-tokens -1", "--max-tokens"},
                                         {"generate --model . --prompt x --top-p 0", "--top-p"},
                                         {"generate --model . --prompt x --temperature -1", "--temperature"},
                                         {"tokenizer train --input x --out y --vocab-size 10", "--vocab-size"}}) {
    testing::expect_refused(run(binary() + " " + c.arguments, 30s), c.arguments, c.needle);
  }
}

// 11. Bad config values through --set: refused at start-up naming key and value.
TEST_F(Faults, BadConfigValuesAreRefusedAtStartUp) {
  for (const char* assignment : {"train.lr=-1", "train.min_lr=-1", "train.warmup_steps=-3", "train.eps=-1",
                                 "train.beta1=1.5", "train.grad_clip=-1", "train.threads=-1", "train.steps=0",
                                 "train.precision=float8", "dist.zero=9", "model.n_head=0", "train.lr=abc"}) {
    const std::string key = std::string(assignment).substr(0, std::string(assignment).find('='));
    testing::Ended ended = run(train(fmt::format("--set {}", assignment)), 30s);
    testing::expect_refused(ended, assignment, "'" + key + "'");
    EXPECT_EQ(ended.exit_code, 1) << assignment;
  }
}

// 12. Every input path is checked before the first step, not at export time.
TEST_F(Faults, MissingInputPathsAreReportedBeforeTraining) {
  testing::Ended tokenizer = run(train("--set data.tokenizer=" + (dir.path() / "no-tokenizer").string()), 30s);
  testing::expect_refused(tokenizer, "a missing data.tokenizer", "no-tokenizer");
  EXPECT_FALSE(fs::exists(dir.path() / "run")) << "it trained before noticing";
  testing::Ended data = run(train("--set data.train=" + (dir.path() / "no-corpus").string()), 30s);
  testing::expect_refused(data, "a missing data.train", "no-corpus");
}

// 5. Two runs on one out_dir: the second is refused naming the first; a changed config does not
// silently resume, unless forced.
TEST_F(Faults, ConcurrentRunsAndChangedSettingsAreRefused) {
  testing::Process first(train(), dir.path() / "first.txt");
  const fs::path lock = dir.path() / "run/.lock";
  for (int i = 0; i < 300 && !(fs::exists(lock) && fs::file_size(lock) > 0); ++i) std::this_thread::sleep_for(20ms);
  testing::Ended second = run(train(), 30s);
  testing::expect_refused(second, "a second run on the same out_dir", fmt::format("process {}", first.pid()));
  first.signal(SIGTERM);
  testing::Ended first_end = first.wait(60s);
  testing::expect_clean_end(first_end, "the first run");
  EXPECT_EQ(first_end.exit_code, 0) << first_end.output;

  testing::Ended changed = run(train("--set train.lr=1.0e-2"), 30s);
  testing::expect_refused(changed, "resuming with another learning rate", "train.lr");
  testing::Ended forced = run(train("--set train.lr=1.0e-2 --set train.resume=force --set train.stop_at_step=1"), 60s);
  testing::expect_clean_end(forced, "forced resume");
  EXPECT_EQ(forced.exit_code, 0) << forced.output;
  EXPECT_NE(forced.output.find("resuming"), std::string::npos) << forced.output;
}

// 9. Corrupt checkpoints and hostile manifests: refused by eval, skipped by a resuming run,
// never a raw JSON exception.
TEST_F(Faults, CorruptCheckpointsAndManifestsAreRefused) {
  const fs::path checkpoint = trained_checkpoint(2);
  const std::string eval = fmt::format("{} eval --config {} --threads 1 --checkpoint {}", binary(),
                                       (dir.path() / "config.yaml").string(), checkpoint.string());
  const fs::path slices = checkpoint / "slices-00000.safetensors";  // the chief's slices
  const std::string model = read_file(slices);
  const std::string manifest = read_file(checkpoint / "manifest.json");
  ASSERT_EQ(run(eval, 60s).exit_code, 0);

  std::string flipped = model;
  flipped[flipped.size() / 2] ^= 0x10;
  write_file_atomic(slices, flipped);
  testing::expect_refused(run(eval, 60s), "eval of a flipped byte", "checksum mismatch");
  write_file_atomic(slices, model);

  for (const char* hostile : {"{}", "null", "[]", "{\"files\": {}}", "{\"files\": null}", "{\"files\": [1]}",
                              "{\"files\": {\"config.json\": 5}}", "{\"fil", ""}) {
    write_file_atomic(checkpoint / "manifest.json", hostile);
    testing::expect_refused(run(eval, 60s), std::string("eval with manifest ") + hostile, "manifest.json");
    // Training skips it with a warning and starts afresh (it was the only checkpoint).
    testing::Ended resumed = run(train("--set train.steps=2"), 60s);
    testing::expect_clean_end(resumed, std::string("train with manifest ") + hostile);
    EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
    EXPECT_NE(resumed.output.find("skipping corrupt checkpoint"), std::string::npos) << resumed.output;
    write_file_atomic(checkpoint / "manifest.json", manifest);
  }
}

// 14. Temporaries of interrupted saves are removed at start-up.
TEST_F(Faults, StaleCheckpointTemporariesAreRemoved) {
  const fs::path stale = dir.path() / "run/ckpt-000000007.tmp.99999";
  fs::create_directories(stale);
  write_file_atomic(stale / "model.safetensors", "partial");
  testing::Ended ended = run(train("--set train.steps=1"), 60s);
  EXPECT_EQ(ended.exit_code, 0) << ended.output;
  EXPECT_FALSE(fs::exists(stale));
}

// Disk full while saving a checkpoint (a tmpfs with room for one checkpoint, not two): a clear
// error, the previous checkpoint intact, no temporaries left; over MPI the job ends.
TEST_F(Faults, DiskFullDuringACheckpointLosesNothing) {
  const fs::path small = dir.path() / "small";
  fs::create_directories(small);
  // The model has 43,072 parameters: a checkpoint takes 12 bytes each, the export 4.
  if (mount("tmpfs", small.c_str(), "tmpfs", 0, "size=800k") != 0) {
    GTEST_SKIP() << "cannot mount a tmpfs here (" << std::strerror(errno) << "): disk-full case not run";
  }
  struct Unmount {
    fs::path path;
    ~Unmount() { umount2(path.c_str(), MNT_DETACH); }
  } unmount{small};
  for (const std::string& launcher : {std::string(), mpirun(2)}) {
    const fs::path out = small / (launcher.empty() ? "one" : "mpi");
    testing::Ended ended = run(launcher + train(fmt::format("--set train.out_dir={} --set train.checkpoint_every=1 "
                                                            "--set train.keep_checkpoints=3 --set train.steps=6",
                                                            out.string())),
                               60s);
    const std::string what = launcher.empty() ? "disk full, one process" : "disk full, 2 MPI ranks";
    testing::expect_refused(ended, what, "No space left on device");
    auto latest = train::CheckpointManager(out, 3).latest_valid();
    ASSERT_TRUE(latest.has_value()) << what << ": no checkpoint survived";
    for (const auto& entry : fs::directory_iterator(out)) {
      EXPECT_EQ(entry.path().filename().string().find(".tmp"), std::string::npos) << entry.path();
    }
    fs::remove_all(out);
  }
}

// kill -9 of one rank while the ranks of a 2 x 2 job write their slices of a checkpoint (every
// fsync made slow, so that a save is caught mid-way): the job ends, the checkpoint being written
// never appears, the previous one stays whole, and the same command resumes from it to the end.
TEST_F(Faults, KillingARankMidSaveKeepsThePreviousCheckpoint) {
  const fs::path run_dir = dir.path() / "run";
  const std::string layout = "--set dist.tensor_parallel=2 --set dist.pipeline_parallel=2 "
                             "--set train.checkpoint_every=2 --set train.steps=8";
  testing::Process job(mpirun(4) + fmt::format("env LD_PRELOAD={} PARAFLOW_TEST_FSYNC_MS=300 ", SLOW_FSYNC_LIBRARY) +
                           train(layout),
                       dir.path() / "killed.txt");
  // A save in progress after a complete one: a temporary directory beside ckpt-000000002.
  auto saving = [&] {
    if (!fs::exists(run_dir / "ckpt-000000002")) return false;
    for (const auto& entry : fs::directory_iterator(run_dir)) {
      if (entry.path().filename().string().find(".tmp.") != std::string::npos) return true;
    }
    return false;
  };
  const auto until = std::chrono::steady_clock::now() + 120s;
  while (!saving() && !job.finished() && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(5ms);
  ASSERT_TRUE(saving()) << "no save was caught in progress";
  // The newest paraflow process of this job (the launcher starts rank 0 first): a writing rank.
  const std::string newest = testing::Process(fmt::format("pgrep -n -f '^{} train --config {}'", binary(),
                                                          (dir.path() / "config.yaml").string()),
                                              dir.path() / "pgrep.txt").wait(10s).output;
  ASSERT_FALSE(newest.empty());
  kill(static_cast<pid_t>(std::stol(newest)), SIGKILL);
  const testing::Ended killed = job.wait(120s);
  EXPECT_FALSE(killed.timed_out) << "the job hung after a rank died";
  EXPECT_NE(killed.exit_code, 0) << killed.output;
  const auto latest = train::CheckpointManager(run_dir, 3).latest_valid();
  ASSERT_TRUE(latest.has_value()) << "the previous checkpoint was lost";
  train::CheckpointManager::verify(*latest);
  EXPECT_FALSE(fs::exists(run_dir / "export")) << "the killed job must not have finished";
  // The same command, without the slow disk, resumes from it and finishes; no temporary is left.
  const testing::Ended resumed = run(mpirun(4) + train(layout), 300s);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resumed from " + latest->string()), std::string::npos) << resumed.output;
  EXPECT_TRUE(fs::exists(run_dir / "export" / "model.safetensors"));
  for (const auto& entry : fs::directory_iterator(run_dir)) {
    EXPECT_EQ(entry.path().filename().string().find(".tmp"), std::string::npos) << entry.path();
  }
}

// 7. TFRecord files without a manifest (as TensorFlow writes them) are read as TFRecord, never
// as bytes; files that are neither are refused with the way out named.
TEST_F(Faults, TfRecordFilesWithoutAManifestAreReadAsRecords) {
  fs::create_directories(dir.path() / "records");
  for (int shard = 0; shard < 2; ++shard) {
    data::TFRecordWriter writer(dir.path() / fmt::format("records/part-{}", shard),
                                shard == 0 ? data::Compression::none : data::Compression::gzip);
    std::vector<int64_t> ids(200);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>((i * 7 + static_cast<size_t>(shard)) % 200);
    for (int i = 0; i < 20; ++i) writer.write(data::make_int64_example("input_ids", ids));
    writer.close();
  }
  testing::Ended ended = run(train("--set data.format=auto --set train.steps=2 --set data.train=" +
                                   (dir.path() / "records").string()),
                             60s);
  testing::expect_clean_end(ended, "TFRecord files");
  EXPECT_EQ(ended.exit_code, 0) << ended.output;
  EXPECT_NE(ended.output.find("2 train / 0 validation TFRecord files"), std::string::npos) << ended.output;

  fs::create_directories(dir.path() / "binary");
  write_file_atomic(dir.path() / "binary/blob", std::string("\x01\x02\x03\x04\xff\xfe binary", 14));
  testing::expect_refused(run(train("--set data.format=auto --set data.train=" + (dir.path() / "binary").string()), 30s),
                          "a directory of non-TFRecord files", "data.format: text");
}

// 10. generate: a full context is reported, with finish_reason length.
TEST_F(Faults, GenerateReportsAFullContext) {
  trained_checkpoint(1);
  testing::Ended ended = run(fmt::format("{} generate --model {} --prompt abcdef --max-tokens 60", binary(),
                                         (dir.path() / "run/export").string()),
                             60s);
  testing::expect_clean_end(ended, "generate past the context");
  EXPECT_EQ(ended.exit_code, 0) << ended.output;
  EXPECT_NE(ended.output.find("context of 32 positions is full"), std::string::npos) << ended.output;
  // 6 prompt + 26 generated tokens fill the 32 positions: prompt + completion <= context, as
  // OpenAI-compatible servers count (generate runs on the serving engine).
  EXPECT_NE(ended.output.find("stopped after 26 of 60 tokens"), std::string::npos) << ended.output;
  EXPECT_NE(ended.output.find("6 prompt + 26 generated tokens"), std::string::npos) << ended.output;
  EXPECT_NE(ended.output.find("finish_reason: length"), std::string::npos) << ended.output;
}

// 10. An invalid PARAFLOW_GEMM is refused naming it at start-up, by generate too, whose batch-1
// decoding calls no f32 GEMM that would read it.
TEST_F(Faults, GenerateRefusesAnInvalidGemmEngine) {
  trained_checkpoint(1);
  testing::Ended ended = run(fmt::format("env PARAFLOW_GEMM=blas {} generate --model {} --prompt abc --max-tokens 2",
                                         binary(), (dir.path() / "run/export").string()),
                             60s);
  testing::expect_refused(ended, "generate with PARAFLOW_GEMM=blas", "PARAFLOW_GEMM='blas'");
}

// 8. generate reads GPT-2's original tokenizer file names (encoder.json + vocab.bpe): the
// prompt is encoded as `tokenizer encode` does, not as bytes.
TEST_F(Faults, GenerateReadsGpt2TokenizerFileNames) {
  const fs::path tokenizer = trained_tokenizer();
  testing::Ended trained = run(train("--set train.steps=1 --set model.vocab_size=300"), 60s);
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  const fs::path model = dir.path() / "run/export";
  fs::copy_file(tokenizer / "vocab.json", model / "encoder.json");
  fs::copy_file(tokenizer / "merges.txt", model / "vocab.bpe");
  const std::string prompt = read_file(dir.path() / "corpus.txt").substr(0, 24);  // fits the context of 32
  testing::Ended encoded = run(fmt::format("{} tokenizer encode --tokenizer {} --text {}", binary(), model.string(), prompt), 30s);
  ASSERT_EQ(encoded.exit_code, 0) << encoded.output;
  const size_t ids = static_cast<size_t>(std::count(encoded.output.begin(), encoded.output.end(), ',')) + 1;
  ASSERT_LT(ids, prompt.size()) << "the test tokenizer should merge some of " << prompt;
  testing::Ended generated =
      run(fmt::format("{} generate --model {} --prompt {} --max-tokens 2", binary(), model.string(), prompt), 30s);
  testing::expect_clean_end(generated, "generate with encoder.json + vocab.bpe");
  EXPECT_NE(generated.output.find(fmt::format("[{} prompt + ", ids)), std::string::npos) << generated.output;
  EXPECT_EQ(generated.output.find("no tokenizer files"), std::string::npos) << generated.output;
}

// 13. Token ids are parsed strictly; an empty --text is the empty string, not standard input.
TEST_F(Faults, TokenizerCommandsParseStrictly) {
  const fs::path tokenizer = trained_tokenizer();
  const std::string decode = fmt::format("{} tokenizer decode --tokenizer {} --ids ", binary(), tokenizer.string());
  testing::Ended spaced = run(decode + "'97 98,99'", 30s);
  EXPECT_EQ(spaced.exit_code, 0) << spaced.output;
  EXPECT_EQ(spaced.output, "abc");
  for (const char* bad : {"12abc", "1.5", "0x10", "7,-", "99999999999999"}) {
    testing::expect_refused(run(decode + "'" + bad + "'", 30s), std::string("--ids ") + bad, "--ids");
  }
  testing::Ended empty = run(fmt::format("{} tokenizer encode --tokenizer {} --text '' < /dev/zero", binary(),
                                         tokenizer.string()),
                             30s);
  testing::expect_clean_end(empty, "encode of the empty text");
  EXPECT_EQ(empty.output, "\n");
}

}  // namespace
}  // namespace paraflow
