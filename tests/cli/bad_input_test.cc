// The command line's contract on bad input, with the real binary: every refused command line
// exits 1 naming the flag and the value (CLI11's own checks included), --help and --version exit
// 0, other failures 2; values that used to be wrapped, saturated or printed as inf/nan are refused.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <regex>

#include "cli/cli_process.h"
#include "train/checkpoint.h"

namespace paraflow {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

class BadInput : public testing::CliProcess {
 protected:
  testing::Ended paraflow(const std::string& arguments) const { return run(binary() + " " + arguments, 60s); }
  // A tiny model trained for one step: its export in dir/run/export.
  fs::path exported_model() const {
    testing::Ended trained = run(train("--set train.steps=1"));
    EXPECT_EQ(trained.exit_code, 0) << trained.output;
    return dir.path() / "run/export";
  }
};

TEST_F(BadInput, EveryRefusedCommandLineExitsOne) {
  struct Case {
    std::string arguments, needle;
  };
  for (const Case& c : std::vector<Case>{{"", "A subcommand is required"},
                                         {"train", "--config is required"},
                                         {"train --config " + config() + " --no-such-flag", "--no-such-flag"},
                                         {"plan --config " + config() + " --ranks 0", "--ranks"},  // CLI11's check: 105
                                         {"plan --config " + (dir.path() / "missing.yaml").string(), "missing.yaml"},
                                         {"train --config " + config() + " --set train.lr=-1", "train.lr"}}) {
    testing::Ended ended = paraflow(c.arguments);
    testing::expect_clean_end(ended, c.arguments);
    EXPECT_EQ(ended.exit_code, 1) << "paraflow " << c.arguments << "\n" << ended.output;
    EXPECT_NE(ended.output.find(c.needle), std::string::npos) << "paraflow " << c.arguments << "\n" << ended.output;
  }
}

TEST_F(BadInput, HelpAndVersionExitZero) {
  testing::Ended help = paraflow("--help");
  EXPECT_EQ(help.exit_code, 0) << help.output;
  EXPECT_NE(help.output.find("Subcommands:"), std::string::npos) << help.output;
  EXPECT_EQ(paraflow("train --help").exit_code, 0);
  // The version the build declares (CMakeLists.txt's project()).
  std::smatch declared;
  const std::string cmake = read_file(testing::source_dir() / "CMakeLists.txt");
  ASSERT_TRUE(std::regex_search(cmake, declared, std::regex("project\\(paraflow VERSION ([0-9.]+)")));
  testing::Ended version = paraflow("--version");
  EXPECT_EQ(version.exit_code, 0) << version.output;
  EXPECT_EQ(version.output, "paraflow " + declared[1].str() + "\n");
}

TEST_F(BadInput, AFailureThatIsNotBadInputExitsTwo) {
  // A port another socket listens on: the system's refusal, not the input's.
  const int taken = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  ASSERT_EQ(bind(taken, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(listen(taken, 1), 0);
  getsockname(taken, reinterpret_cast<sockaddr*>(&address), &length);
  const int port = ntohs(address.sin_port);
  testing::Ended ended = paraflow(fmt::format("serve --model {} --port {}", exported_model().string(), port));
  close(taken);
  testing::expect_clean_end(ended, "serve on a taken port");
  EXPECT_EQ(ended.exit_code, 2) << ended.output;
  EXPECT_NE(ended.output.find(fmt::format("cannot listen on 127.0.0.1:{}", port)), std::string::npos) << ended.output;
}

TEST_F(BadInput, TheConfigMayBeGivenWithoutItsFlag) {
  testing::Ended trained = run(fmt::format("{} train {} --threads 1 --set train.steps=2", binary(), config()));
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  EXPECT_TRUE(train::CheckpointManager(dir.path() / "run", 3).latest_valid().has_value()) << trained.output;
  testing::Ended planned = paraflow("plan " + config() + " --peak-tflops 1");
  EXPECT_EQ(planned.exit_code, 0) << planned.output;
  testing::Ended evaluated = paraflow(fmt::format("eval {} --checkpoint {}", config(), (dir.path() / "run/export").string()));
  EXPECT_EQ(evaluated.exit_code, 0) << evaluated.output;
  EXPECT_NE(evaluated.output.find("val loss"), std::string::npos) << evaluated.output;
}

// eval --score-second-half: in each whole window of --context 8, the predictions from position 4
// on, 3 tokens; a text shorter than one window is refused naming --text.
TEST_F(BadInput, SecondHalfScoringCountsLlamaPerplexitysTokens) {
  const fs::path model = exported_model(), text = dir.path() / "text.txt", short_text = dir.path() / "short.txt";
  std::string words;
  for (int i = 0; i < 50; ++i) words += "the quick brown fox ";
  std::ofstream(text) << words;
  std::ofstream(short_text) << "fox";
  const std::string eval = fmt::format("eval --model {} --context 8 --score-second-half --text ", model.string());
  testing::Ended scored = paraflow(eval + text.string());
  ASSERT_EQ(scored.exit_code, 0) << scored.output;
  std::smatch counts;
  ASSERT_TRUE(std::regex_search(scored.output, counts, std::regex(R"((\d+) tokens scored in (\d+) windows of 8)")))
      << scored.output;
  EXPECT_GT(std::stoi(counts[2]), 1);
  EXPECT_EQ(std::stoi(counts[1]), 3 * std::stoi(counts[2])) << scored.output;
  testing::Ended refused = paraflow(eval + short_text.string());
  testing::expect_refused(refused, "eval --score-second-half of a short text", "whole window of --context 8");
  EXPECT_NE(refused.output.find("--text"), std::string::npos) << refused.output;
}

TEST_F(BadInput, SeedsOutsideUnsigned64BitsAreRefused) {
  const fs::path model = exported_model();
  const std::string generate = fmt::format("generate --model {} --prompt abc --max-tokens 2 --seed ", model.string());
  for (const char* bad : {"-1", "999999999999999999999", "18446744073709551616", "1.5", "0x10"}) {
    testing::Ended ended = paraflow(generate + bad);
    testing::expect_clean_end(ended, std::string("--seed ") + bad);
    EXPECT_EQ(ended.exit_code, 1) << bad << "\n" << ended.output;
    for (const std::string& needle : {std::string("--seed"), std::string(bad), std::string("[0, 18446744073709551615]")}) {
      EXPECT_NE(ended.output.find(needle), std::string::npos) << "--seed " << bad << ": no '" << needle << "'\n" << ended.output;
    }
  }
  testing::Ended largest = paraflow(generate + "18446744073709551615");
  EXPECT_EQ(largest.exit_code, 0) << largest.output;
  testing::Ended prepare = paraflow(fmt::format("data prepare --tokenizer {} --input x --out y --seed -1", model.string()));
  EXPECT_EQ(prepare.exit_code, 1) << prepare.output;
  EXPECT_NE(prepare.output.find("--seed: -1 is not an integer"), std::string::npos) << prepare.output;
}

// Ids 0-255 of paraflow's byte-level BPE are the bytes themselves: 97, 98 -> "ab".
TEST_F(BadInput, TokenizerDecodeAcceptsItsDocumentedListFormsOnly) {
  const fs::path tokenizer = dir.path() / "tokenizer";
  testing::Ended trained = paraflow(fmt::format("tokenizer train --vocab-size 300 --input {} --out {}",
                                                (dir.path() / "corpus.txt").string(), tokenizer.string()));
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  const std::string decode = fmt::format("tokenizer decode --tokenizer {} --ids ", tokenizer.string());
  for (const char* list : {"'97 98'", "'97,98'", "'97, 98'", "'[97, 98]'", "' [97 98] '"}) {
    testing::Ended ended = paraflow(decode + list);
    EXPECT_EQ(ended.exit_code, 0) << list << "\n" << ended.output;
    EXPECT_EQ(ended.output, "ab") << list;
  }
  struct Case {
    std::string list, token;
  };
  for (const Case& c : std::vector<Case>{{"7;8", "'7;8'"}, {"[7, 8", "'[7'"}, {"7 8]", "'8]'"}, {"(7, 8)", "'(7'"}}) {
    testing::Ended ended = paraflow(decode + "'" + c.list + "'");
    testing::expect_refused(ended, "--ids " + c.list, "--ids: " + c.token + " is not a decimal token id");
    EXPECT_EQ(ended.exit_code, 1) << ended.output;
  }
}

TEST_F(BadInput, PlanRefusesNonFiniteRatesAndPrintsUnitsThatFit) {
  for (const char* bad : {"inf", "nan", "-inf"}) {
    testing::Ended ended = paraflow(fmt::format("plan {} --peak-tflops {}", config(), bad));
    testing::expect_refused(ended, std::string("--peak-tflops ") + bad, "--peak-tflops");
    EXPECT_NE(ended.output.find(bad), std::string::npos) << ended.output;
    EXPECT_EQ(ended.exit_code, 1) << ended.output;
  }
  // 0.005 TFLOP/s is 5 GFLOP/s; the tiny model's step (2.8e7 FLOPs) then takes 5.6 ms, not "0.006 s".
  testing::Ended planned = paraflow(fmt::format("plan {} --peak-tflops 0.005", config()));
  ASSERT_EQ(planned.exit_code, 0) << planned.output;
  EXPECT_NE(planned.output.find("modelled step at 5 GFLOP/s,"), std::string::npos) << planned.output;
  EXPECT_TRUE(std::regex_search(planned.output, std::regex(": 5\\.[0-9]+ ms, [0-9]+ tokens/s"))) << planned.output;
  for (const char* wrong : {"nan", "inf", "0.0 TFLOP/s", "0.000 s"}) {
    EXPECT_EQ(planned.output.find(wrong), std::string::npos) << wrong << "\n" << planned.output;
  }
}

TEST_F(BadInput, EvalWatchRefusesAMissingRunDir) {
  const fs::path typo = dir.path() / "rnu";
  testing::Ended ended = paraflow(fmt::format("eval {} --watch {}", config(), typo.string()));
  testing::expect_refused(ended, "eval --watch of a missing dir", "--watch");
  EXPECT_EQ(ended.exit_code, 1) << ended.output;
  EXPECT_NE(ended.output.find(typo.string()), std::string::npos) << ended.output;
  EXPECT_FALSE(fs::exists(typo));
}

TEST_F(BadInput, ServeRefusesMemoryItCannotHave) {
  const fs::path model = exported_model();
  // 1e9 GiB = 1073741824000000000 bytes.
  testing::Ended kv = paraflow(fmt::format("serve --model {} --port 0 --kv-cache-gb 1e9", model.string()));
  testing::expect_refused(kv, "--kv-cache-gb 1e9", "--kv-cache-gb 1e+09");
  EXPECT_EQ(kv.exit_code, 1) << kv.output;
  EXPECT_NE(kv.output.find("1073741824000000000 bytes"), std::string::npos) << kv.output;
  EXPECT_NE(kv.output.find("available"), std::string::npos) << kv.output;
  testing::Ended seqs = paraflow(fmt::format("serve --model {} --port 0 --kv-cache-gb 0.002 --max-num-seqs 99999999999",
                                             model.string()));
  testing::expect_refused(seqs, "--max-num-seqs 99999999999", "--max-num-seqs 99999999999");
  EXPECT_EQ(seqs.exit_code, 1) << seqs.output;
  // At least the logits and hidden state of each: 99999999999 x (vocab 256 + n_embd 32) x 4 bytes.
  EXPECT_NE(seqs.output.find("115199999998848 bytes"), std::string::npos) << seqs.output;
  EXPECT_NE(seqs.output.find("available"), std::string::npos) << seqs.output;
}

TEST_F(BadInput, ATensorParallelRunPrintsItsLayout) {
  testing::Ended ended = run(fmt::format("mpirun --allow-run-as-root --oversubscribe -np 2 -x OMP_NUM_THREADS=1 {}",
                                         train("--set train.steps=1 --set dist.tensor_parallel=2")),
                             120s);
  ASSERT_EQ(ended.exit_code, 0) << ended.output;
  EXPECT_NE(ended.output.find("2 ranks over mpi: tensor parallel 2 x pipeline parallel 1 x data parallel 1"),
            std::string::npos)
      << ended.output;
  EXPECT_EQ(ended.output.find("data parallel: 2 ranks"), std::string::npos) << ended.output;
}

}  // namespace
}  // namespace paraflow
