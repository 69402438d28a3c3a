#include <fmt/format.h>
#include <omp.h>

#include <atomic>
#include <memory>
#include <optional>

#include "base/config.h"
#include "base/directory_lock.h"
#include "cli/commands.h"
#include "cli/stop_signal.h"
#include "dist/cluster_spec.h"
#include "dist/communicator.h"
#include "dist/mesh.h"
#include "cli/run_setup.h"
#include "ps/coordinator.h"
#include "ps/parameter_server.h"
#include "ps/wire.h"
#include "ps/worker.h"
#include "train/evaluator.h"
#include "train/trainer.h"

namespace paraflow::cli {

namespace {

struct TrainOptions {
  std::string config_path;
  std::vector<std::string> overrides;
  int threads = 0;
};

// mpirun -> MPI; TF_CONFIG -> Gloo through the chief's rendezvous; otherwise one process.
std::unique_ptr<dist::Communicator> join_training_group(std::chrono::milliseconds timeout) {
  if (dist::launched_by_mpi()) return dist::make_mpi_communicator();
  if (auto cluster = dist::ClusterSpec::from_environment(); cluster && cluster->training_size() > 1) {
    return dist::make_gloo_communicator(*cluster, timeout);
  }
  return dist::make_local_communicator();
}

// One rank's training: build, resume, step until the end or a stop request.
void train_in_group(const RunSetup& setup, train::BatchSource& data, dist::Communicator& communicator,
                    const std::atomic<bool>* stop) {
  // The chief owns out_dir: one run at a time, and a crashed save's leftovers are removed.
  std::optional<DirectoryLock> out_dir_lock;
  if (communicator.rank() == 0) {
    out_dir_lock.emplace(setup.train.out_dir, "train.out_dir");
    train::CheckpointManager(setup.train.out_dir, setup.train.keep_checkpoints).remove_stale_temporaries();
  }
  Backend& backend = default_backend();  // the GPU where one is present
  train::Trainer trainer(setup.model, setup.train, data, backend, communicator);
  trainer.initialize_or_resume();
  // MFU is relative to the peak of the GEMMs this policy runs: bf16 ones under mixed_bfloat16
  // where the CPU has them, f32 otherwise.
  const DType gemms = train::gemm_dtype(setup.train.precision, backend);
  double peak = train::measure_peak_flops(backend, 1024, gemms);
  if (communicator.rank() == 0) {
    fmt::print(stderr, "precision {}: activations stored in {}, GEMMs in {} ({}); measured {} GEMM peak {:.1f} GFLOP/s per "
               "process (MFU is relative to it x ranks)\n",
               graph::precision_policy_name(setup.train.precision),
               dtype_name(graph::storage_dtype(setup.train.precision)), dtype_name(gemms),
               gemms == DType::f32 && setup.train.precision != graph::PrecisionPolicy::float32
                   ? fmt::format("no 16-bit training matmul on {}: bf16 GEMMs need AMX or AMD's AVX512_BF16, f16 ones are not written yet",
                                 backend.describe())
                   : backend.describe(),
               dtype_name(gemms), peak / 1e9);
  }
  peak *= communicator.size();
  // The trainer checks the flag between steps, saves a checkpoint and exits 0.
  trainer.run(stop, peak);
}

// A TF_CONFIG with ps tasks: this task's part of parameter-server training (ParameterServerStrategy).
void train_with_parameter_servers(const RunSetup& setup, const dist::ClusterSpec& cluster,
                                  const std::atomic<bool>* stop) {
  const int64_t rss_before = train::peak_rss_bytes();
  const train::TrainConfig& config = setup.train;
  check(cluster.jobs.count("chief") != 0, "TF_CONFIG: parameter-server training needs a chief task (it coordinates "
        "the workers and writes the checkpoints)");
  check(cluster.jobs.count("worker") != 0 && !cluster.jobs.at("worker").empty(),
        "TF_CONFIG: parameter-server training needs worker tasks");
  check(config.tensor_parallel == 1 && config.pipeline_parallel == 1,
        "dist.tensor_parallel and dist.pipeline_parallel do not combine with ps tasks");
  check(config.grad_accumulation == 1, "train.grad_accumulation ({}) does not combine with ps tasks: raise "
        "train.batch_size instead (each worker computes a slice of it)", config.grad_accumulation);
  check(config.precision != graph::PrecisionPolicy::mixed_float16,
        "train.precision mixed_float16 needs loss scaling, which ps mode lacks: use mixed_bfloat16");
  // Every task refuses this alike (the workers could not start, and the chief would wait for them).
  if (setup.ps_synchronous) {
    ps::check_synchronous_batch(config.batch_size, static_cast<int>(cluster.jobs.at("worker").size()));
  }
  const std::vector<model::TensorSpec> specs = model::gpt_tensor_specs(setup.model, config.decay_embeddings);
  const std::vector<std::string>& ps_addresses = cluster.jobs.at("ps");
  const std::vector<std::string>& worker_addresses = cluster.jobs.at("worker");
  ps::Placement placement = ps::place_variables(specs, static_cast<int>(ps_addresses.size()));
  ps::ChannelSecurity security =
      ps::ChannelSecurity::from_files(setup.tls_cert, setup.tls_key, setup.tls_ca, setup.auth_token_file);
  // Every message carries at most a chunk of a shard, whatever the model's size (ps/wire.h).
  const int64_t max_message_bytes = ps::max_message_bytes();
  const std::string task = fmt::format("{} {} ({})", cluster.task_type, cluster.task_index, cluster.address());
  // Each task its own (the chief also gathers them all through Status).
  auto report_peak = [&] {
    fmt::print(stderr, "memory: {}: whole run, peak RSS grew {:.1f} MiB (`paraflow plan --ps-tasks {} --workers {}` "
               "predicts each task's)\n", task, static_cast<double>(train::peak_rss_bytes() - rss_before) / (1 << 20),
               ps_addresses.size(), worker_addresses.size());
  };
  switch (cluster.role()) {
    case dist::Role::ps: {
      ps::ParameterServerTask server(cluster.address(), security, max_message_bytes, cpu_backend(), cluster.cluster_json(),
                                     rss_before);
      fmt::print(stderr, "{}: serving its shard of the variables ({})\n", task, security.describe());
      server.serve(stop, setup.timeout);
      report_peak();
      return;
    }
    case dist::Role::worker: {
      std::unique_ptr<train::BatchSource> data = setup.open_data();
      ps::WorkerSettings settings{cluster.address(), ps_addresses, security, setup.timeout, max_message_bytes,
                                  setup.ps_synchronous,
                                  setup.ps_synchronous ? static_cast<int>(worker_addresses.size()) : 1,
                                  cluster.cluster_json(), rss_before};
      ps::WorkerTask worker(setup.model, config, *data, cpu_backend(), placement, std::move(settings));
      fmt::print(stderr, "{}: waiting for steps from the chief ({})\n", task, security.describe());
      worker.serve(stop, setup.timeout);
      report_peak();
      return;
    }
    default: {
      DirectoryLock out_dir_lock(config.out_dir, "train.out_dir");
      train::CheckpointManager(config.out_dir, config.keep_checkpoints).remove_stale_temporaries();
      ps::ClusterSettings settings{ps_addresses,      worker_addresses,       security, setup.timeout,
                                   max_message_bytes, setup.ps_synchronous, setup.max_staleness,
                                   cluster.cluster_json(), rss_before};
      // (It prints every task's peak at its end, its own too.)
      ps::Coordinator(setup.model, config, std::move(placement), std::move(settings)).run(stop);
    }
  }
}

void run_train(const TrainOptions& options) {
  // From the start: a SIGTERM while the data loads or the graph builds still ends with a
  // checkpoint and exit 0, instead of killing the process.
  const std::atomic<bool>* stop = stop_requests("a checkpoint");
  RunSetup setup = RunSetup::load(options.config_path, options.overrides);
  int threads = options.threads > 0 ? options.threads : setup.threads;
  if (threads > 0) omp_set_num_threads(threads);
  const model::GptConfig& model_config = setup.model;
  const train::TrainConfig& train_config = setup.train;

  std::optional<dist::ClusterSpec> cluster = dist::ClusterSpec::from_environment();
  if (cluster && cluster->jobs.count("ps") && cluster->role() != dist::Role::evaluator) {
    return train_with_parameter_servers(setup, *cluster, stop);
  }
  std::unique_ptr<train::BatchSource> source = setup.open_data();
  train::BatchSource& data = *source;
  if (cluster && cluster->role() == dist::Role::evaluator) {
    // The evaluator task of a TF_CONFIG cluster runs the same command and follows the chief.
    train::Evaluator evaluator(model_config, data, cpu_backend(), train_config);
    evaluator.watch(train_config.out_dir, train_config.steps, stop);
    return;
  }
  fmt::print(stderr, "data: {}\n", data.describe());
  fmt::print(stderr, "model: {:.2f}M parameters, {} layers, {} heads, n_embd {}; {} threads\n",
             static_cast<double>(model_config.parameter_count()) / 1e6, model_config.n_layer, model_config.n_head,
             model_config.n_embd, omp_get_max_threads());

  std::unique_ptr<dist::Communicator> communicator = join_training_group(setup.timeout);
  if (communicator->size() == 1) return train_in_group(setup, data, *communicator, stop);
  try {
    if (communicator->rank() == 0) {
      const dist::MeshShape mesh =
          dist::mesh_shape(communicator->size(), train_config.tensor_parallel, train_config.pipeline_parallel);
      fmt::print(stderr, "{} ranks over {}: tensor parallel {} x pipeline parallel {} x data parallel {}\n",
                 communicator->size(), communicator->name(), mesh.tensor, mesh.pipeline, mesh.data);
    }
    train_in_group(setup, data, *communicator, stop);
  } catch (const std::exception& e) {
    // The other ranks may be waiting for this one in a collective: end the whole job from here.
    fmt::print(stderr, "error on rank {} of {}: {}\n", communicator->rank(), communicator->size(), e.what());
    communicator->abort_job(exit_status(e));
  }
}

}  // namespace

void add_train_command(CLI::App& app) {
  auto options = std::make_shared<TrainOptions>();
  CLI::App* command = app.add_subcommand("train", "Train a GPT-2-architecture model from a YAML config");
  add_config_option(command, options->config_path, "YAML config (see configs/)");
  command->add_option("--set", options->overrides, "Override a config key: --set train.lr=3e-4 (repeatable)");
  command->add_option("--threads", options->threads, "CPU threads (default: all cores, or train.threads)")
      ->check(in_range(at_least(0)));
  command->callback([options] { run_train(*options); });
}

}  // namespace paraflow::cli
