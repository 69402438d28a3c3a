// Parameter-server jobs of real processes on loopback: ps tasks, workers and a chief started from
// TF_CONFIG like Kubernetes pods, compared with one process training on the same global batch,
// and put through killed workers, ps tasks and chiefs, signals, TLS and tokens.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <nlohmann/json.hpp>

#include <cstring>
#include <regex>

#include "dist/training_job.h"
#include "model/slice_index.h"

namespace paraflow {
namespace {

class ParameterServerJob : public testing::TrainingJob {
 protected:
  void SetUp() override {
    // Long enough (200 steps, a checkpoint every 20) for a task to be killed mid-run.
    write_config("{vocab_size: 256, n_positions: 32, n_embd: 32, n_layer: 2, n_head: 2}",
                 "{batch_size: 6, sequence_length: 32, steps: 200, lr: 1.0e-3, log_every: 100, "
                 "checkpoint_every: 20}");
  }

  static std::string launch(int ps, int workers) {
    return fmt::format("{} {} {} ", (testing::source_dir() / "tests/ps/launch_ps_job.sh").string(), ps, workers);
  }

  // The "cluster" part of a TF_CONFIG with a chief, `workers` and `ps` tasks on free loopback ports.
  static std::string make_cluster(int ps, int workers) {
    std::vector<int> ports;
    std::vector<int> sockets;
    for (int i = 0; i < ps + workers + 1; ++i) {
      int fd = socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in address{};
      address.sin_family = AF_INET;
      address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      socklen_t length = sizeof(address);
      bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address));
      getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
      ports.push_back(ntohs(address.sin_port));
      sockets.push_back(fd);
    }
    for (int fd : sockets) close(fd);
    auto list = [&](int first, int count) {
      std::vector<std::string> addresses;
      for (int i = 0; i < count; ++i) addresses.push_back(fmt::format("\"127.0.0.1:{}\"", ports[first + i]));
      return fmt::format("[{}]", fmt::join(addresses, ","));
    };
    return fmt::format(R"("cluster":{{"chief":{},"worker":{},"ps":{}}})", list(0, 1), list(1, workers),
                       list(1 + workers, ps));
  }

  // Starts one task of `cluster` training into `out`; its output goes to log(out, type, index).
  pid_t start_task(const std::string& cluster, const std::string& type, int index, const std::string& out,
                   const std::string& extra = "") {
    return start(fmt::format("(TF_CONFIG='{{{},\"task\":{{\"type\":\"{}\",\"index\":{}}}}}' {} >> {} 2>&1)", cluster,
                             type, index, train_command(out, extra), log_path(out, type, index).string()));
  }
  std::filesystem::path log_path(const std::string& out, const std::string& type, int index) const {
    return dir.path() / fmt::format("{}-{}{}.log", out, type, index);
  }
  std::string log(const std::string& out, const std::string& type, int index) const {
    return read_file(log_path(out, type, index));
  }
  // Every task of a 1-ps, 2-worker job; returns their pids: ps, worker 0, worker 1, chief.
  std::vector<pid_t> start_job(const std::string& cluster, const std::string& out, const std::string& extra = "") {
    return {start_task(cluster, "ps", 0, out, extra), start_task(cluster, "worker", 0, out, extra),
            start_task(cluster, "worker", 1, out, extra), start_task(cluster, "chief", 0, out, extra)};
  }
  static int exit_status(pid_t task) {
    int status = 0;
    waitpid(task, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  static void kill_task(pid_t task, int signal = SIGKILL) { kill(-task, signal); }

  // Runs an uninterrupted 1-ps, 2-worker job into "whole", then starts the same job as `cluster`
  // into `out` (with `extra` settings) and waits for its checkpoint 20; returns its tasks as
  // start_job does.
  std::vector<pid_t> whole_run_then_job_at_checkpoint_20(const std::string& cluster, const std::string& out,
                                                         const std::string& extra = "") {
    EXPECT_EQ(run(launch(1, 2) + train_command("whole")), 0);
    std::vector<pid_t> tasks = start_job(cluster, out, extra);
    EXPECT_TRUE(wait_for_checkpoint(dir.path() / out, 20));
    return tasks;
  }

  // Runs an uninterrupted 1-ps, 2-worker job into "whole", then the same job into `out`, whose
  // task `victim` (0: the ps task, 1 and 2: the workers, 3: the chief) is SIGKILLed once
  // checkpoint 20 exists and, when `relaunch`, started again. Every task left must exit 0, and
  // the export must equal the uninterrupted run's bit for bit.
  void kill_mid_run(const std::string& out, size_t victim, bool relaunch) {
    const std::string cluster = make_cluster(1, 2);
    std::vector<pid_t> tasks = whole_run_then_job_at_checkpoint_20(cluster, out);
    kill_task(tasks[victim]);
    exit_status(tasks[victim]);
    EXPECT_FALSE(std::filesystem::exists(dir.path() / out / "export")) << "killed before the end";
    if (relaunch) {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      const char* types[] = {"ps", "worker", "worker", "chief"};
      tasks[victim] = start_task(cluster, types[victim], victim == 2 ? 1 : 0, out);
    }
    EXPECT_EQ(exit_status(tasks[3]), 0) << log(out, "chief", 0);
    for (size_t task = 0; task < 3; ++task) {
      if (task != victim || relaunch) {
        EXPECT_EQ(exit_status(tasks[task]), 0) << "task " << task;
      }
    }
    EXPECT_TRUE(bitwise_equal(out, "whole"));
  }
};

// Synchronous mode sums every worker's slice on the ps tasks before one AdamW update: the same
// training as one process on the whole batch (the slices' gradients summed in another order).
TEST_F(ParameterServerJob, SynchronousModeEqualsOneProcessOnTheSameBatch) {
  const std::string short_run = "--set train.steps=12 --set train.checkpoint_every=0 ";
  ASSERT_EQ(run(train_command("one", short_run)), 0);
  // With an evaluator task too, which follows the chief's checkpoints as in any TF_CONFIG job.
  ASSERT_EQ(run("EVALUATOR=1 " + launch(2, 2) + train_command("ps2x2", short_run)), 0);
  EXPECT_TRUE(std::filesystem::exists(dir.path() / "ps2x2/eval/evaluated.json"));
  ASSERT_EQ(run(launch(1, 3) + train_command("ps1x3", short_run)), 0);
  ASSERT_EQ(run(launch(3, 1) + train_command("ps3x1", short_run)), 0);
  expect_same_training("ps2x2", "one");
  expect_same_training("ps1x3", "one");
  expect_same_training("ps3x1", "one");
  // The placement is recorded in the checkpoint: the embedding's rows split over the 3 ps tasks.
  nlohmann::json state = nlohmann::json::parse(read_file(dir.path() / "ps3x1/ckpt-000000012/state.json"));
  const nlohmann::json& placement = state["parameter_servers"]["placement"];
  ASSERT_EQ(placement.size(), 3u);
  for (int task = 0; task < 3; ++task) {
    EXPECT_EQ(placement[task][0][0], fmt::format("wte.weight[{}:{}]", 256 * task / 3, 256 * (task + 1) / 3));
  }
}

// The chief holds one piece of the model at a time: it loads each ps task piece by piece and
// snapshots it piece by piece into one checkpoint file per task. That checkpoint reads back
// exactly into one process (resumed at its step, which saves it again unchanged), the export
// streamed from it equals one process's, and the chief's peak RSS grows by less than the model's
// weights (it used to hold the weights and both moments, and a serialised copy for the export).
TEST_F(ParameterServerJob, TheChiefHoldsOnePieceAtATimeAndItsCheckpointResumesExactlyInOneProcess) {
  const std::string short_run = "--set train.steps=4 --set train.checkpoint_every=0 ";
  ASSERT_EQ(run(launch(2, 1) + train_command("ps", short_run)), 0);
  const std::filesystem::path saved = dir.path() / "ps" / "ckpt-000000004";
  const model::SliceIndex index = model::SliceIndex::from_json(
      nlohmann::json::parse(read_file(saved / "index.json")), "index.json");
  EXPECT_EQ(index.files(), (std::vector<std::string>{"slices-00000.safetensors", "slices-00001.safetensors"}));
  std::filesystem::copy(dir.path() / "ps", dir.path() / "one", std::filesystem::copy_options::recursive);
  std::filesystem::remove_all(dir.path() / "one" / "export");
  ASSERT_EQ(run(train_command("one", short_run)), 0);
  model::SliceReader before(saved, index);
  const std::filesystem::path resaved = dir.path() / "one" / "ckpt-000000004";
  model::SliceReader after(resaved, model::SliceIndex::from_json(
                                        nlohmann::json::parse(read_file(resaved / "index.json")), "index.json"));
  for (const auto& [name, stored] : index.tensors) {
    const std::vector<float> a = before.read(name, TensorSlice::whole(stored.shape));
    const std::vector<float> b = after.read(name, TensorSlice::whole(stored.shape));
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << name;
  }
  EXPECT_TRUE(bitwise_equal("one", "ps")) << "the streamed export differs from one process's";

  // The chief's peak RSS (under /usr/bin/time) on a model of ~10.5M parameters (40 MiB of weights;
  // its largest piece, half the embedding, 2 MiB) against a near-empty one; the smaller of two runs.
  auto chief_peak_mib = [&](const std::string& out, const std::string& model) {
    const std::string cluster = make_cluster(2, 1);
    const std::string extra = model + " --set train.steps=2 --set train.checkpoint_every=1";
    std::vector<pid_t> tasks{start_task(cluster, "ps", 0, out, extra), start_task(cluster, "ps", 1, out, extra),
                             start_task(cluster, "worker", 0, out, extra)};
    const std::string rss = (dir.path() / (out + ".rss")).string();
    tasks.push_back(start(fmt::format("(TF_CONFIG='{{{},\"task\":{{\"type\":\"chief\",\"index\":0}}}}' "
                                      "/usr/bin/time -o {} -f %M {} >> {} 2>&1)", cluster, rss,
                                      train_command(out, extra), log_path(out, "chief", 0).string())));
    for (pid_t task : tasks) EXPECT_EQ(exit_status(task), 0) << log(out, "chief", 0);
    return std::stod(read_file(rss)) / 1024.0;
  };
  const std::string big = "--set model.vocab_size=4096 --set model.n_embd=256 --set model.n_layer=12";
  const double empty = chief_peak_mib("empty", "--set model.n_embd=8 --set model.n_layer=2");
  const double full = std::min(chief_peak_mib("big", big), chief_peak_mib("big_again", big));
  const double parameters = 4096.0 * 256 + 32 * 256 + 12 * (12.0 * 256 * 256 + 13 * 256) + 2 * 256;
  const double weights_mib = 4 * parameters / (1 << 20);
  std::printf("  chief: peak RSS grew %.1f MiB (the model's weights: %.1f MiB)\n", full - empty, weights_mib);
  EXPECT_LT(full - empty, weights_mib) << "the chief held about a whole model";
  // The chief prints every task's growth, as the ranks of other layouts are printed: each answered.
  const std::string chief = log("big", "chief", 0);
  EXPECT_TRUE(std::regex_search(chief, std::regex(R"(by task \(MiB; \?: no answer\): chief 0: [0-9.]+, worker 0: )"
                                                  R"([0-9.]+, ps 0: [0-9.]+, ps 1: [0-9.]+\n)")))
      << chief;
}

// Every message carries at most a chunk of a shard (ps/wire.h), whatever the shard's size. Under a
// message limit lowered to 4 KiB (PARAFLOW_PS_MAX_MESSAGE_BYTES, for tests only: a chunk is then
// 512 values), each ps task's half of the embedding (128 rows x 32: 16 KiB, 48 KiB with its
// moments, which one Fill or Snapshot used to carry) and of the blocks' MLP (32 x 128) spans many
// messages, as a GPT-2 Large shard of 194M parameters spans 2 GiB: the chief's fills and
// snapshots, the workers' pulls and pushes all go in chunks. Synchronous training equals one
// process, across a resume that fills the ps tasks from the checkpoint; asynchronous pushes are
// applied from their chunks. Load's list of pieces is the one message that grows with the model:
// past the limit it is refused naming it.
TEST_F(ParameterServerJob, EveryMessageCarriesAtMostAChunkWhateverTheShardSize) {
  const std::string capped = "PARAFLOW_PS_MAX_MESSAGE_BYTES=4096 ";
  const std::string run_12 = "--set train.steps=12 --set train.checkpoint_every=0 ";
  ASSERT_EQ(run(train_command("one", run_12)), 0);
  ASSERT_EQ(run(capped + launch(2, 2) + train_command("chunked", run_12 + "--set train.stop_at_step=6")), 0);
  EXPECT_EQ(latest_checkpoint(dir.path() / "chunked"), 6);
  ASSERT_EQ(run(capped + launch(2, 2) + train_command("chunked", run_12)), 0);
  expect_same_training("chunked", "one");

  ASSERT_EQ(run(capped + launch(2, 2) + train_command("async", run_12 + "--set dist.ps_mode=async")), 0);
  EXPECT_EQ(latest_checkpoint(dir.path() / "async"), 12);
  EXPECT_EQ(scalars("async", "train/loss").size(), 12u);

  const std::string message = failure_message(capped + launch(1, 1) + train_command("many", "--set model.n_layer=40"));
  EXPECT_TRUE(std::regex_search(message, std::regex(R"(ps 0 \(127\.0\.0\.1:[0-9]+\): Load's [0-9]+ pieces take [0-9]+ )"
                                                    R"(bytes, more than a message may carry \(4096\))")))
      << message;
}

// The Llama family (grouped k/v heads, an untied head) trains in synchronous mode like one process;
// both vocabulary tables, the embedding and the head, are split by rows over the ps tasks.
TEST_F(ParameterServerJob, LlamaSynchronousModeEqualsOneProcess) {
  write_config("{architecture: llama, vocab_size: 256, n_positions: 32, n_embd: 32, n_layer: 2, n_head: 4, "
               "n_kv_head: 2, intermediate_size: 48, tie_word_embeddings: false}",
               "{batch_size: 6, sequence_length: 32, steps: 12, lr: 1.0e-3, log_every: 100, checkpoint_every: 0}");
  ASSERT_EQ(run(train_command("one")), 0);
  ASSERT_EQ(run(launch(2, 2) + train_command("ps2x2")), 0);
  expect_same_training("ps2x2", "one");
  nlohmann::json state = nlohmann::json::parse(read_file(dir.path() / "ps2x2/ckpt-000000012/state.json"));
  const nlohmann::json& placement = state["parameter_servers"]["placement"];
  ASSERT_EQ(placement.size(), 2u);
  for (int task = 0; task < 2; ++task) {
    const std::string rows = fmt::format("[{}:{}]", 128 * task, 128 * (task + 1));
    EXPECT_EQ(placement[task].front()[0], "model.embed_tokens.weight" + rows);
    EXPECT_EQ(placement[task].back()[0], "lm_head.weight" + rows);
  }
}

// Asynchronous mode applies each worker's push on arrival; a push computed on parameters more than
// dist.max_staleness updates old is rejected and counted. Training still converges.
TEST_F(ParameterServerJob, AsynchronousModeConvergesAndRejectsStalePushes) {
  const std::string settings = "--set dist.ps_mode=async --set train.log_every=20 ";
  ASSERT_EQ(run(train_command("sync", "--set train.log_every=20")), 0);
  ASSERT_EQ(run(launch(1, 2) + train_command("async", settings + "--set dist.max_staleness=4")), 0);
  ASSERT_EQ(run(launch(1, 2) + train_command("strict", settings + "--set dist.max_staleness=0")), 0);
  const std::map<int64_t, double> sync = scalars("sync", "train/loss"), async = scalars("async", "train/loss");
  ASSERT_FALSE(async.empty());
  const double sync_final = sync.rbegin()->second, async_final = async.rbegin()->second;
  std::printf("  final loss: sync %.4f, async %.4f; first async step %.4f\n", sync_final, async_final,
              async.begin()->second);
  EXPECT_LT(async_final, 0.8 * async.begin()->second) << "asynchronous training must learn";
  EXPECT_LT(std::abs(async_final - sync_final), 0.1 * sync_final);
  auto stale_pushes = [&](const std::string& out) {
    return nlohmann::json::parse(read_file(dir.path() / out / "ckpt-000000200/state.json"))["parameter_servers"]
        .value("stale_pushes", -1);
  };
  std::printf("  stale pushes: max_staleness 4: %d, max_staleness 0: %d\n", stale_pushes("async"), stale_pushes("strict"));
  EXPECT_GT(stale_pushes("strict"), 0) << "two workers at once must overlap some of their steps";
  EXPECT_GE(stale_pushes("async"), 0);
}

// A worker killed mid-run: its step goes to the other worker, and since synchronous pushes are
// kept per slice, no update is applied twice: the result is bit for bit the uninterrupted run's.
TEST_F(ParameterServerJob, KilledWorkerStepsRunElsewhereAndTheResultIsUnchanged) {
  kill_mid_run("killed_worker", 2, false);
  EXPECT_NE(log("killed_worker", "chief", 0).find("worker 1 (127.0.0.1:"), std::string::npos)
      << log("killed_worker", "chief", 0);
}

// A ps task killed and restarted (as Kubernetes restarts a pod): the chief notices, waits for it,
// reloads every shard from the latest checkpoint and finishes — again bit for bit the same.
TEST_F(ParameterServerJob, KilledPsTaskIsReloadedFromTheLatestCheckpoint) {
  kill_mid_run("killed_ps", 0, true);
  const std::string chief = log("killed_ps", "chief", 0);
  EXPECT_NE(chief.find("a ps task failed"), std::string::npos) << chief;
  EXPECT_NE(chief.find("resumed from"), std::string::npos) << chief;
}

// The chief killed and relaunched: it reloads the ps tasks from its latest checkpoint; the
// workers and ps tasks never stopped.
TEST_F(ParameterServerJob, RelaunchedChiefResumesFromItsLatestCheckpoint) {
  kill_mid_run("killed_chief", 3, true);
  EXPECT_NE(log("killed_chief", "chief", 0).find("resumed from"), std::string::npos);
}

// A worker that hangs (SIGSTOP) mid-run: its step runs past the deadline (3 x
// dist.timeout_seconds), goes to the other worker, and the result is again the uninterrupted one.
TEST_F(ParameterServerJob, HungWorkerStepRunsElsewhereAfterItsDeadline) {
  std::vector<pid_t> tasks =
      whole_run_then_job_at_checkpoint_20(make_cluster(1, 2), "hung_worker", "--set dist.timeout_seconds=1");
  kill_task(tasks[2], SIGSTOP);
  EXPECT_EQ(exit_status(tasks[3]), 0) << log("hung_worker", "chief", 0);
  kill_task(tasks[2]);
  exit_status(tasks[2]);
  EXPECT_EQ(exit_status(tasks[0]), 0);
  EXPECT_EQ(exit_status(tasks[1]), 0);
  const std::string chief = log("hung_worker", "chief", 0);
  EXPECT_NE(chief.find("did not finish batch"), std::string::npos) << chief;
  EXPECT_TRUE(bitwise_equal("hung_worker", "whole"));
}

// A ps task that hangs (SIGSTOP) past dist.timeout_seconds and comes back with its state: the
// chief finds every shard whole at its step, so the failed step runs again (or, had every shard
// applied it, the run goes on); nothing is reloaded from a checkpoint (before, every such failure
// rolled the run back to its latest one), and the result is the uninterrupted run's bit for bit.
TEST_F(ParameterServerJob, HungPsTaskComesBackWithoutAReload) {
  std::vector<pid_t> tasks =
      whole_run_then_job_at_checkpoint_20(make_cluster(1, 2), "hung_ps", "--set dist.timeout_seconds=2");
  kill_task(tasks[0], SIGSTOP);
  // Past a ps call's deadline (2 s), within the chief's wait for every ps task (2 s more).
  std::this_thread::sleep_for(std::chrono::milliseconds(2800));
  kill_task(tasks[0], SIGCONT);
  EXPECT_EQ(exit_status(tasks[3]), 0) << log("hung_ps", "chief", 0);
  for (size_t task = 0; task < 3; ++task) EXPECT_EQ(exit_status(tasks[task]), 0) << "task " << task;
  const std::string chief = log("hung_ps", "chief", 0);
  EXPECT_NE(chief.find("a ps task failed"), std::string::npos) << chief;
  EXPECT_TRUE(chief.find("it runs again") != std::string::npos || chief.find("the run goes on") != std::string::npos)
      << chief;
  EXPECT_EQ(chief.find("reloading"), std::string::npos) << chief;
  EXPECT_EQ(chief.find("resumed from"), std::string::npos) << chief;
  EXPECT_TRUE(bitwise_equal("hung_ps", "whole"));
}

// SIGTERM to every task at once (a preempted job): the ps tasks and workers stay until the chief
// has taken its last snapshot, and everything exits 0 with a checkpoint.
TEST_F(ParameterServerJob, SigtermToEveryTaskEndsWithACheckpoint) {
  const std::string cluster = make_cluster(1, 2);
  std::vector<pid_t> tasks = start_job(cluster, "preempted");
  ASSERT_TRUE(wait_for_checkpoint(dir.path() / "preempted", 20));
  // To the paraflow processes (the pattern is anchored at the binary), not their shells.
  std::system(fmt::format("pkill -TERM -f '^{} train.*{}/preempted'", binary(), dir.path().string()).c_str());
  for (pid_t task : tasks) EXPECT_EQ(exit_status(task), 0);
  EXPECT_TRUE(std::filesystem::exists(dir.path() / "preempted/export/model.safetensors"));
  train_checkpoint_exists_after(dir.path() / "preempted", 21);
  EXPECT_NE(log("preempted", "chief", 0).find("stop requested"), std::string::npos);
}

// A ps task that never comes up: the chief fails within its timeout, naming the task.
TEST_F(ParameterServerJob, UnreachablePsTaskFailsInBoundedTimeNamingIt) {
  const std::string cluster = make_cluster(1, 1);
  pid_t worker = start_task(cluster, "worker", 0, "no_ps");
  const auto start = std::chrono::steady_clock::now();
  pid_t chief = start_task(cluster, "chief", 0, "no_ps", "--set dist.timeout_seconds=2");
  EXPECT_NE(exit_status(chief), 0);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
  kill_task(worker);
  exit_status(worker);
  const std::string chief_log = log("no_ps", "chief", 0);
  const std::string ps_address = nlohmann::json::parse("{" + cluster + "}")["cluster"]["ps"][0];
  EXPECT_NE(chief_log.find("ps 0 (" + ps_address + ")"), std::string::npos) << chief_log;
  EXPECT_NE(chief_log.find("unreachable for 2000 ms"), std::string::npos) << chief_log;
}

// No worker ever answers: the chief fails within its timeout, naming the workers.
TEST_F(ParameterServerJob, NoReachableWorkerFailsInBoundedTimeNamingThem) {
  const std::string cluster = make_cluster(1, 2);
  pid_t ps = start_task(cluster, "ps", 0, "no_workers");
  const auto start = std::chrono::steady_clock::now();
  pid_t chief = start_task(cluster, "chief", 0, "no_workers", "--set dist.timeout_seconds=2");
  EXPECT_NE(exit_status(chief), 0);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
  kill_task(ps);
  exit_status(ps);
  const std::string chief_log = log("no_workers", "chief", 0);
  EXPECT_NE(chief_log.find("no worker answered for 2000 ms: worker 0 (127.0.0.1:"), std::string::npos) << chief_log;
  EXPECT_NE(chief_log.find("worker 1 (127.0.0.1:"), std::string::npos) << chief_log;
}

// TLS and a token: a job with both trains; a worker with another token is refused by name.
TEST_F(ParameterServerJob, TlsAndTokenProtectEveryTask) {
  const std::string base = dir.path().string();
  ASSERT_EQ(std::system(fmt::format("openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=paraflow -addext "
                                    "subjectAltName=IP:127.0.0.1 -keyout {0}/key.pem -out {0}/cert.pem > /dev/null 2>&1",
                                    base).c_str()), 0);
  write_file_atomic(dir.path() / "token", "correct horse battery staple\n");
  write_file_atomic(dir.path() / "other-token", "something else\n");
  const std::string secure = fmt::format("--set train.steps=12 --set dist.tls_cert={0}/cert.pem --set "
                                         "dist.tls_key={0}/key.pem --set dist.auth_token_file={0}/token ", base);
  ASSERT_EQ(run(launch(1, 2) + train_command("secure", secure)), 0);
  EXPECT_TRUE(std::filesystem::exists(dir.path() / "secure/export/model.safetensors"));

  const std::string cluster = make_cluster(1, 1);
  pid_t ps = start_task(cluster, "ps", 0, "intruder", secure);
  pid_t worker = start_task(cluster, "worker", 0, "intruder",
                            secure + fmt::format("--set dist.auth_token_file={}/other-token", base));
  pid_t chief = start_task(cluster, "chief", 0, "intruder", secure);
  EXPECT_NE(exit_status(chief), 0);
  kill_task(ps);
  kill_task(worker);
  exit_status(ps);
  exit_status(worker);
  const std::string chief_log = log("intruder", "chief", 0);
  EXPECT_NE(chief_log.find("worker 0 (127.0.0.1:"), std::string::npos) << chief_log;
  EXPECT_NE(chief_log.find("missing or wrong token"), std::string::npos) << chief_log;
}

// A second copy of a task on the same address is refused, not given half the connections.
TEST_F(ParameterServerJob, SecondCopyOfATaskIsRefused) {
  const std::string cluster = make_cluster(1, 1);
  pid_t ps = start_task(cluster, "ps", 0, "twice");
  const std::string address = nlohmann::json::parse("{" + cluster + "}")["cluster"]["ps"][0];
  ASSERT_TRUE(wait_for(log_path("twice", "ps", 0)));
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (log("twice", "ps", 0).find("serving") == std::string::npos && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const std::string message =
      failure_message(fmt::format("TF_CONFIG='{{{},\"task\":{{\"type\":\"ps\",\"index\":0}}}}' {}", cluster,
                                  train_command("twice")));
  EXPECT_NE(message.find("cannot listen on " + address), std::string::npos) << message;
  kill_task(ps);
  exit_status(ps);
}

TEST_F(ParameterServerJob, BadClustersAndSettingsAreRefusedByName) {
  const std::string no_chief = R"("cluster":{"worker":["127.0.0.1:1"],"ps":["127.0.0.1:2"]})";
  std::string message = failure_message(fmt::format("TF_CONFIG='{{{},\"task\":{{\"type\":\"ps\",\"index\":0}}}}' {}",
                                                    no_chief, train_command("bad")));
  EXPECT_NE(message.find("needs a chief task"), std::string::npos) << message;
  const std::string no_workers = R"("cluster":{"chief":["127.0.0.1:1"],"worker":[],"ps":["127.0.0.1:2"]})";
  message = failure_message(fmt::format("TF_CONFIG='{{{},\"task\":{{\"type\":\"chief\",\"index\":0}}}}' {}",
                                        no_workers, train_command("bad")));
  EXPECT_NE(message.find("needs worker tasks"), std::string::npos) << message;
  const std::string cluster = make_cluster(1, 1);
  message = failure_message(fmt::format("TF_CONFIG='{{{},\"task\":{{\"type\":\"chief\",\"index\":0}}}}' {}", cluster,
                                        train_command("bad", "--set dist.pipeline_parallel=2")));
  EXPECT_NE(message.find("dist.pipeline_parallel"), std::string::npos) << message;
  message = failure_message(fmt::format("TF_CONFIG='{{{},\"task\":{{\"type\":\"worker\",\"index\":0}}}}' {}", cluster,
                                        train_command("bad", "--set dist.ps_mode=eventually")));
  EXPECT_NE(message.find("dist.ps_mode"), std::string::npos) << message;
  // A batch the workers cannot split is refused by every task, the ps task too (before, only the
  // workers refused it, and the chief and the ps task waited for them).
  message = failure_message(fmt::format("TF_CONFIG='{{{},\"task\":{{\"type\":\"ps\",\"index\":0}}}}' {}",
                                        make_cluster(1, 2), train_command("bad", "--set train.batch_size=7")));
  EXPECT_NE(message.find("multiple of the worker tasks (2)"), std::string::npos) << message;
}

// A chief that fails on its input (here the run directory holds a checkpoint of another model)
// tells the ps tasks and workers to exit: none is left waiting for a chief that would fail again,
// not even the workers that start after it has failed (it waits for them to come up).
TEST_F(ParameterServerJob, AChiefRefusingItsInputEndsTheWholeJob) {
  ASSERT_EQ(run(launch(1, 2) + train_command("taken", "--set train.steps=20")), 0);
  const std::string cluster = make_cluster(1, 2), other_model = "--set model.n_embd=16";
  const char* types[] = {"ps", "chief", "worker", "worker"};
  const int indices[] = {0, 0, 0, 1};
  std::vector<pid_t> tasks;
  for (int task = 0; task < 4; ++task) {
    if (task == 2) std::this_thread::sleep_for(std::chrono::seconds(3));  // the workers late
    tasks.push_back(start(fmt::format("(TF_CONFIG='{{{},\"task\":{{\"type\":\"{}\",\"index\":{}}}}}' timeout 120 {} "
                                      ">> {} 2>&1)", cluster, types[task], indices[task],
                                      train_command("taken", other_model),
                                      log_path("taken", types[task], indices[task]).string())));
  }
  EXPECT_EQ(exit_status(tasks[1]), 1) << log("taken", "chief", 0);
  EXPECT_NE(log("taken", "chief", 0).find("other settings"), std::string::npos) << log("taken", "chief", 0);
  for (int task : {0, 2, 3}) EXPECT_EQ(exit_status(tasks[task]), 0) << types[task] << " (124: still waiting)";
}

// Tasks whose TF_CONFIG clusters differ (here one lists a single worker, the others two) are
// refused naming the task and both clusters: a ps task by the chief at start, a worker at the
// first step it is handed (before it computes); the chief exits 1 and tells every task to exit.
TEST_F(ParameterServerJob, TasksWithAnotherClusterAreRefusedNamingBoth) {
  for (const char* odd_type : {"ps", "worker"}) {
    const std::string full = make_cluster(1, 2);
    nlohmann::json cluster = nlohmann::json::parse("{" + full + "}")["cluster"];
    nlohmann::json short_cluster = cluster;
    short_cluster["worker"].erase(1);  // worker 0 alone
    const std::string out = std::string("odd-") + odd_type;
    const char* types[] = {"ps", "worker", "worker", "chief"};
    const int indices[] = {0, 0, 1, 0};
    std::vector<pid_t> tasks;
    for (int task = 0; task < 4; ++task) {
      const bool odd = std::string(types[task]) == odd_type && indices[task] == 0;
      tasks.push_back(start(fmt::format("(TF_CONFIG='{{\"cluster\":{},\"task\":{{\"type\":\"{}\",\"index\":{}}}}}' "
                                        "timeout 120 {} >> {} 2>&1)", (odd ? short_cluster : cluster).dump(), types[task],
                                        indices[task], train_command(out), log_path(out, types[task], indices[task]).string())));
    }
    const int chief_status = exit_status(tasks[3]);
    EXPECT_EQ(chief_status, 1) << odd_type << "\n" << log(out, "chief", 0);
    const std::string odd_task = std::string(odd_type) == "ps" ? fmt::format("ps 0 ({})", cluster["ps"][0].get<std::string>())
                                                               : "worker " + cluster["worker"][0].get<std::string>();
    const std::string expected = fmt::format("TF_CONFIG differs between tasks: {} has the cluster {}, the chief {}",
                                             odd_task, short_cluster.dump(), cluster.dump());
    EXPECT_NE(log(out, "chief", 0).find(expected), std::string::npos) << expected << "\n" << log(out, "chief", 0);
    EXPECT_FALSE(std::filesystem::exists(dir.path() / out / "export"));
    for (int task : {0, 1, 2}) EXPECT_EQ(exit_status(tasks[task]), 0) << types[task] << " (124: still waiting)";
  }
}

// Asynchronous mode logs each step as train.log_every asks: a line every log_every steps and a
// TensorBoard point every step, as synchronous mode does (it logged once per window of steps).
TEST_F(ParameterServerJob, AsynchronousModeLogsEveryStepItIsAskedTo) {
  for (int log_every : {1, 10}) {
    const std::string out = fmt::format("async-log-{}", log_every);
    const int status = std::system((launch(1, 2) +
                                    train_command(out, fmt::format("--set dist.ps_mode=async --set train.steps=40 "
                                                                   "--set train.log_every={}", log_every)) +
                                    " > " + (dir.path() / (out + ".log")).string() + " 2>&1")
                                       .c_str());
    ASSERT_EQ(status, 0) << read_file(dir.path() / (out + ".log"));
    const std::string output = read_file(dir.path() / (out + ".log"));
    const std::regex line("step ([0-9]+)/40 \\|");
    std::vector<int64_t> logged;
    for (auto it = std::sregex_iterator(output.begin(), output.end(), line); it != std::sregex_iterator(); ++it) {
      logged.push_back(std::stoll((*it)[1]));
    }
    std::vector<int64_t> expected;
    for (int64_t step = log_every; step <= 40; step += log_every) expected.push_back(step);
    EXPECT_EQ(logged, expected) << output;
    const std::map<int64_t, double> losses = scalars(out, "train/loss");
    EXPECT_EQ(losses.size(), 40u);
    if (!losses.empty()) {
      EXPECT_EQ(losses.begin()->first, 1);
      EXPECT_EQ(losses.rbegin()->first, 40);
    }
  }
}

}  // namespace
}  // namespace paraflow
