// The data path end to end with the real binary: `tokenizer train`, `data prepare` into TFRecord
// shards, training through the input pipeline on 2 MPI ranks stopped half-way and resumed (the
// pipeline's iterator state travels in the checkpoint), equal bit for bit to one uninterrupted
// rank with 2-step accumulation; then `generate` decodes with the exported tokenizer.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cctype>

#include <fmt/format.h>

#include "base/file_io.h"
#include "reference_runner.h"
#include "test_util.h"

namespace paraflow {
namespace {

int run(const std::string& command) {
  int status = std::system((command + " > /dev/null 2>&1").c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(PipelineTraining, ResumedDataParallelRunEqualsUninterruptedAccumulation) {
  testing::TempDir dir;
  const std::filesystem::path root = dir.path();
  Rng rng(9);
  const char* words[] = {"the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "far", "away", "home"};
  for (int d = 0; d < 40; ++d) {
    std::string text;
    for (int w = 0; w < 400; ++w) text += std::string(words[rng.below(12)]) + (w % 9 == 8 ? ".\n" : " ");
    write_file_atomic(root / fmt::format("doc{:02}.txt", d), text);
  }
  const std::string paraflow = std::getenv("PARAFLOW_BINARY");
  const std::string inputs = fmt::format("'{}'", (root / "*.txt").string());
  ASSERT_EQ(run(fmt::format("{} tokenizer train --vocab-size 300 --input {} --out {}", paraflow, inputs,
                            (root / "tok").string())), 0);
  ASSERT_EQ(run(fmt::format("{} data prepare --tokenizer {} --input {} --out {} --val-fraction 0.1 --seed 2", paraflow,
                            (root / "tok").string(), inputs, (root / "prep").string())), 0);
  write_file_atomic(root / "config.yaml", fmt::format(R"(model: {{vocab_size: 300, n_positions: 32, n_embd: 24, n_layer: 2, n_head: 2}}
data: {{train: "{}", tokenizer: "{}"}}
train: {{batch_size: 4, sequence_length: 32, steps: 12, lr: 3.0e-3, eval_every: 6, eval_batches: 2, log_every: 100}}
)", (root / "prep").string(), (root / "tok").string()));
  auto train = [&](const std::string& out, const std::string& extra) {
    return fmt::format("{} train --config {} --threads 1 --set train.out_dir={} {}", paraflow,
                       (root / "config.yaml").string(), (root / out).string(), extra);
  };
  const std::string mpirun = "mpirun --allow-run-as-root --oversubscribe -np 2 -x OMP_NUM_THREADS=1 ";
  ASSERT_EQ(run(train("single", "--set train.grad_accumulation=2")), 0);
  ASSERT_EQ(run(mpirun + train("parallel", "--set train.stop_at_step=5")), 0);
  ASSERT_TRUE(std::filesystem::exists(root / "parallel/ckpt-000000005"));
  ASSERT_EQ(run(mpirun + train("parallel", "")), 0);
  EXPECT_EQ(read_file(root / "single/export/model.safetensors"), read_file(root / "parallel/export/model.safetensors"));

  for (const char* file : {"vocab.json", "merges.txt", "tokenizer.json"}) {
    EXPECT_TRUE(std::filesystem::exists(root / "parallel/export" / file)) << file;
  }
  std::string out = (root / "generated.txt").string();
  ASSERT_EQ(std::system(fmt::format("{} generate --model {} --prompt 'the cat' --max-tokens 20 --temperature 0 > {}",
                                    paraflow, (root / "parallel/export").string(), out).c_str()), 0);
  std::string generated = read_file(out);
  EXPECT_EQ(generated.rfind("the cat", 0), 0u) << generated;
  EXPECT_GT(generated.size(), std::string("the cat\n").size()) << generated;

  // --stop ends the completion where the stop string first appears, wherever that falls: here
  // strings across a space (a word's last letter to the next word's first), which end inside the
  // next word's token (this vocabulary has every word as one), so a check on the completion's end
  // alone would miss them.
  const std::string completion = generated.substr(7, generated.size() - 8);  // less the prompt and the newline
  auto letter = [&](size_t at) { return at < completion.size() && std::isalpha(static_cast<unsigned char>(completion[at])); };
  int stops = 0;
  for (size_t space = completion.find(' ', 1); space != std::string::npos && stops < 3;
       space = completion.find(' ', space + 1)) {
    if (!letter(space - 1) || !letter(space + 1) || !letter(space + 2)) continue;
    const std::string stop = completion.substr(space - 1, 3);
    ASSERT_EQ(std::system(fmt::format("{} generate --model {} --prompt 'the cat' --max-tokens 20 --temperature 0 "
                                      "--stop '{}' > {}", paraflow, (root / "parallel/export").string(), stop, out)
                              .c_str()),
              0);
    EXPECT_EQ(read_file(out), "the cat" + completion.substr(0, completion.find(stop)) + "\n") << "--stop '" << stop << "'";
    ++stops;
  }
  EXPECT_GT(stops, 0) << generated;
}

}  // namespace
}  // namespace paraflow
