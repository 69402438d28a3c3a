#include "ps/coordinator.h"

#include <fmt/format.h>
#include <malloc.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <memory>
#include <optional>
#include <thread>

#include "base/clock.h"
#include "base/progress.h"
#include "data/events.h"
#include "data/tokenizer.h"
#include "model/model_files.h"
#include "ps/parameter_server.grpc.pb.h"
#include "ps/wire.h"
#include "ps/worker_pool.h"
#include "train/optimizer.h"

namespace paraflow::ps {

namespace {

using Clock = std::chrono::steady_clock;

// A piece's arrays as a checkpoint names them: "wte.weight", "m.wte.weight", "v.wte.weight".
constexpr std::array<std::pair<const char*, Field>, 3> kFields{
    {{"", PARAMETERS}, {"m.", FIRST_MOMENT}, {"v.", SECOND_MOMENT}}};

// What a step (or an asynchronous window of steps) reports for the progress line and summaries.
struct StepMetrics {
  double loss = 0, lr = 0, grad_norm = 0, seconds = 0;
  double pull_seconds = 0, compute_seconds = 0, push_seconds = 0;  // means over the step's calls
  int64_t bytes = 0;                                               // pulled and pushed, per step
  int64_t stale_pushes = 0;

  void add_replies(const std::vector<StepReply>& replies, int64_t steps) {
    for (const StepReply& reply : replies) {
      loss += reply.loss();
      pull_seconds += reply.pull_seconds();
      compute_seconds += reply.compute_seconds();
      push_seconds += reply.push_seconds();
      bytes += reply.bytes_pulled() + reply.bytes_pushed();
      stale_pushes += reply.stale_pushes();
    }
    const double calls = static_cast<double>(replies.size());
    loss /= calls;
    pull_seconds /= calls;
    compute_seconds /= calls;
    push_seconds /= calls;
    bytes /= steps;
  }
};

// The chief's big buffers are a piece or a tensor of the model, each freed before the next (tens
// to hundreds of MiB at GPT-2's shapes). glibc raises its mmap threshold to the size of each
// mapped buffer freed (up to 32 MiB) and its trim threshold to twice that: the next buffers under
// the new threshold come from the heap, and up to twice the largest of them stays resident once
// freed (GPT-2 Large's chief held 52 MiB over the tensor and piece it needs, GPT-2 124M's 17-20).
// A fixed threshold (glibc's default, 128 KiB) turns that off: every such buffer is a mapping of
// its own, given back when freed. (The chief's allocations are few: nothing to gain from the heap.)
void give_freed_buffers_back() { mallopt(M_MMAP_THRESHOLD, 128 * 1024); }

}  // namespace

struct Coordinator::Impl {
  model::GptConfig model_config;
  train::TrainConfig config;
  Placement placement;
  std::string placement_digest;  // sent with every step
  ClusterSettings settings;
  std::vector<std::string> ps_names;
  std::vector<std::unique_ptr<ParameterServer::Stub>> shards;
  std::unique_ptr<WorkerPool> workers;
  train::CheckpointManager checkpoints;
  // The whole model's tensors, in flat-buffer order: the chief holds none of them but one piece
  // at a time, read from a checkpoint (or initialised) into a ps task, or snapshotted from one
  // into a checkpoint.
  std::vector<model::TensorSpec> specs;
  int64_t chunk = 0;  // the most elements a message carries
  uint64_t generation = 0;
  int64_t step = 0;
  int64_t optimizer_steps = 0;
  int64_t stale_pushes = 0;  // asynchronous, over the run (as of the last load)

  Impl(model::GptConfig model_config_, train::TrainConfig config_, Placement placement_, ClusterSettings settings_)
      : model_config(model_config_),
        config(std::move(config_)),
        placement(std::move(placement_)),
        placement_digest(placement.digest()),
        settings(std::move(settings_)),
        checkpoints(config.out_dir, config.keep_checkpoints) {
    give_freed_buffers_back();
    specs = model::gpt_tensor_specs(model_config, config.decay_embeddings);
    chunk = chunk_elements(settings.max_message_bytes);
    for (size_t task = 0; task < settings.ps_addresses.size(); ++task) {
      ps_names.push_back(peer_name("ps", task, settings.ps_addresses[task]));
      shards.push_back(ParameterServer::NewStub(
          open_channel(settings.ps_addresses[task], settings.security, settings.max_message_bytes)));
    }
    workers = std::make_unique<WorkerPool>(settings.worker_addresses, settings.security, settings.timeout,
                                           settings.max_message_bytes);
  }

  template <typename Request, typename Reply>
  Reply call(size_t task, const char* method,
             grpc::Status (ParameterServer::Stub::*rpc)(grpc::ClientContext*, const Request&, Reply*),
             const Request& request) {
    return call_peer(ps_names[task], method, *shards[task], rpc, request, settings.timeout, settings.security);
  }

  // Every ps task answering (with the chief's cluster), or an error naming those that did not
  // within the timeout. Each try opens a new channel: an old one to a task that died keeps
  // answering with its last failure for as long as gRPC's reconnect backoff lasts (measured: up
  // to 19 s).
  void wait_for_shards() {
    const auto deadline = Clock::now() + settings.timeout;
    while (true) {
      std::vector<std::string> silent;
      for (size_t task = 0; task < shards.size(); ++task) {
        try {
          shards[task] = ParameterServer::NewStub(
              open_channel(settings.ps_addresses[task], settings.security, settings.max_message_bytes));
          const StatusReply status = call_peer(ps_names[task], "Status", *shards[task], &ParameterServer::Stub::Status,
                                               StatusRequest(), std::chrono::milliseconds(1000), settings.security);
          const std::string difference = cluster_difference(ps_names[task], status.cluster(), settings.cluster);
          if (!difference.empty()) throw InputError(difference);
        } catch (const PeerError& e) {
          if (!e.unreachable()) throw;
          silent.push_back(e.what());
        }
      }
      if (silent.empty()) return;
      check(Clock::now() < deadline, "ps tasks unreachable for {} ms (dist.timeout_seconds): {}",
            settings.timeout.count(), fmt::join(silent, "; "));
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  }

  // A piece as a box of the tensor holding it: the whole tensor, or a block of the embedding's
  // rows (a piece's name then says which, as "wte.weight[0:128]").
  std::pair<const model::TensorSpec*, TensorSlice> piece_box(const Piece& piece) const {
    int64_t offset = 0;
    for (const model::TensorSpec& spec : specs) {
      const int64_t within = piece.offset - offset, columns = spec.shape.dims().back();
      offset += spec.shape.numel();
      if (piece.offset >= offset) continue;
      if (within == 0 && piece.count == spec.shape.numel()) return {&spec, TensorSlice::whole(spec.shape)};
      check(spec.shape.rank() == 2 && within % columns == 0 && piece.count % columns == 0 &&
                within + piece.count <= spec.shape.numel(),
            "placement: piece {} is not a block of whole rows of {}", piece.tensor, spec.name);
      return {&spec, TensorSlice{{within / columns, 0}, {piece.count / columns, columns}}};
    }
    throw InputError(fmt::format("placement: piece {} lies past the model's {} parameters", piece.tensor, offset));
  }

  // The latest valid checkpoint (or GPT-2's initialisation) into every ps task, under a new
  // generation: whatever was in flight before is refused from now on. Each task is loaded
  // without values, then filled a chunk at a time: the chief holds one array of a piece at a time.
  void load_shards() {
    stale_pushes = 0;
    std::optional<model::SliceReader> reader;
    if (auto checkpoint = checkpoints.latest_valid()) {
      const nlohmann::json state = train::CheckpointManager::read_state(*checkpoint);
      train::check_resumable(*checkpoint, state, model_config, config);
      reader.emplace(train::CheckpointManager::open(*checkpoint, model_config));
      step = state.at("step").get<int64_t>();
      optimizer_steps = state.at("optimizer_steps").get<int64_t>();
      if (state.contains("parameter_servers")) stale_pushes = state["parameter_servers"].value("stale_pushes", 0);
      fmt::print(stderr, "resumed from {} at step {}\n", checkpoint->string(), step);
    } else {
      step = optimizer_steps = 0;
    }
    const uint64_t previous = generation;
    generation = static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count());
    if (generation == previous) ++generation;
    for_each_task(shards.size(), [&](size_t task) {
      LoadRequest request;
      request.set_generation(generation);
      for (const Piece& piece : placement.shards[task]) {
        PieceSpec* wire = request.add_pieces();
        wire->set_tensor(piece.tensor);
        wire->set_offset(piece.offset);
        wire->set_count(piece.count);
        wire->set_weight_decay(piece.weight_decay);
      }
      OptimizerSettings* optimizer = request.mutable_optimizer();
      optimizer->set_beta1(config.adamw.beta1);
      optimizer->set_beta2(config.adamw.beta2);
      optimizer->set_eps(config.adamw.eps);
      optimizer->set_weight_decay(config.adamw.weight_decay);
      request.set_synchronous(settings.synchronous);
      request.set_slices(static_cast<int>(settings.worker_addresses.size()));
      request.set_max_staleness(settings.max_staleness);
      request.set_version(settings.synchronous ? step : optimizer_steps);
      request.set_optimizer_steps(optimizer_steps);
      // (Its list of pieces is the one part of a message that grows with the model: ~50 bytes a piece.)
      check(static_cast<int64_t>(request.ByteSizeLong()) <= settings.max_message_bytes, "{}: Load's {} pieces take {} "
            "bytes, more than a message may carry ({})", ps_names[task], request.pieces_size(), request.ByteSizeLong(),
            settings.max_message_bytes);
      return call(task, "Load", &ParameterServer::Stub::Load, request);
    });
    for (size_t task = 0; task < shards.size(); ++task) {
      for (size_t index = 0; index < placement.shards[task].size(); ++index) {
        const auto [spec, box] = piece_box(placement.shards[task][index]);
        for (const auto& [prefix, field] : kFields) {
          const std::vector<float> values = reader              ? reader->read(prefix + spec->name, box)
                                            : field == PARAMETERS ? initial_values(*spec, box)
                                                                  : std::vector<float>(static_cast<size_t>(box.numel()));
          const auto count = static_cast<int64_t>(values.size());
          for (int64_t first = 0; first < count; first += chunk) {
            FillRequest request;
            request.set_generation(generation);
            request.set_piece(static_cast<int>(index));
            request.set_field(field);
            request.set_offset(first);
            request.set_values(to_bytes(values.data() + first, std::min(chunk, count - first)));
            call(task, "Fill", &ParameterServer::Stub::Fill, request);
          }
        }
      }
    }
  }

  // GPT-2's initial values of `box` of tensor `spec` (as model::initialize_gpt gives the whole
  // model), from that one tensor.
  std::vector<float> initial_values(const model::TensorSpec& spec, const TensorSlice& box) const {
    model::ParameterSet tensor({spec}, cpu_backend());
    // The box's first element in the tensor (a box of whole rows, or the whole tensor).
    const int64_t begin = box.offsets[0] * (spec.shape.numel() / spec.shape.dims()[0]);
    model::initialize_gpt(tensor, model_config, config.seed, {}, begin, begin + box.numel());
    const float* values = tensor.flat().data<float>() + begin;
    return {values, values + box.numel()};
  }

  // After a failure under a synchronous step: the version every ps task holds, when they all
  // still hold this generation at one version; nullopt when one restarted or they differ.
  std::optional<int64_t> common_version() {
    std::optional<int64_t> version;
    for (size_t task = 0; task < shards.size(); ++task) {
      const StatusReply status = call(task, "Status", &ParameterServer::Stub::Status, StatusRequest());
      if (status.generation() != generation || (version && *version != status.version())) return std::nullopt;
      version = status.version();
    }
    return version;
  }

  // A failure that left every ps task's state whole (a slow or briefly hung task, a lost answer)
  // costs nothing in synchronous mode: the step runs again (its pushes are kept per slice, a
  // repeat replacing the first), or, when every shard applied it, the run goes on after it
  // (without its log line and, were it one, its periodic checkpoint). Otherwise (a task that
  // restarted empty, a step applied on some shards only, any asynchronous failure) every shard
  // is reloaded from the latest checkpoint.
  void recover(const std::string& reason) {
    fmt::print(stderr, "a ps task failed ({}): waiting for every ps task\n", reason);
    wait_for_shards();
    if (settings.synchronous) {
      const std::optional<int64_t> version = common_version();
      if (version == step) {
        fmt::print(stderr, "every ps task still holds step {}: it runs again\n", step);
        return;
      }
      if (version == step + 1) {
        fmt::print(stderr, "every ps task applied step {}: the run goes on\n", step);
        ++step;
        ++optimizer_steps;
        return;
      }
    }
    fmt::print(stderr, "reloading every ps task from the latest checkpoint\n");
    load_shards();
  }

  StepMetrics synchronous_step() {
    const auto start = Clock::now();
    StepMetrics metrics;
    metrics.lr = config.schedule.at(step);
    std::vector<StepRequest> slices;
    const int count = static_cast<int>(settings.worker_addresses.size());
    for (int slice = 0; slice < count; ++slice) slices.push_back(step_request(step, slice, count, metrics.lr));
    metrics.add_replies(workers->run(slices), 1);
    // The global norm of the summed gradients, over every shard, clips them all alike.
    std::vector<double> squares = for_each_task(shards.size(), [&](size_t task) {
      ReduceRequest request;
      request.set_generation(generation);
      request.set_version(step);
      return call(task, "Reduce", &ParameterServer::Stub::Reduce, request).squares();
    });
    double total = 0;
    for (double part : squares) total += part;
    metrics.grad_norm = std::sqrt(total);
    const float scale = static_cast<float>(train::clip_factor(config.adamw.grad_clip, metrics.grad_norm));
    for_each_task(shards.size(), [&](size_t task) {
      ApplyRequest request;
      request.set_generation(generation);
      request.set_version(step);
      request.set_lr(metrics.lr);
      request.set_grad_scale(scale);
      return call(task, "Apply", &ParameterServer::Stub::Apply, request);
    });
    ++step;
    ++optimizer_steps;
    metrics.seconds = seconds_since(start);
    return metrics;
  }

  // Steps [step, step + count), each a whole batch applied by its worker as it finishes: the
  // metrics of each, in order (the window's time shared evenly between them).
  std::vector<StepMetrics> asynchronous_steps(int64_t count) {
    const auto start = Clock::now();
    std::vector<StepRequest> steps;
    for (int64_t index = step; index < step + count; ++index) {
      steps.push_back(step_request(index, 0, 1, config.schedule.at(index)));
    }
    const std::vector<StepReply> replies = workers->run(steps);
    const double seconds = seconds_since(start) / static_cast<double>(count);
    std::vector<StepMetrics> metrics(replies.size());
    for (size_t index = 0; index < replies.size(); ++index) {
      metrics[index].lr = steps[index].lr();
      metrics[index].seconds = seconds;
      metrics[index].add_replies({replies[index]}, 1);
    }
    step += count;
    return metrics;
  }

  StepRequest step_request(int64_t index, int slice, int slices, double lr) const {
    StepRequest request;
    request.set_generation(generation);
    request.set_synchronous(settings.synchronous);
    request.set_batch_index(index);
    request.set_slice(slice);
    request.set_slices(slices);
    request.set_version(step);
    request.set_lr(lr);
    request.set_placement(placement_digest);
    request.set_cluster(settings.cluster);
    return request;
  }

  // Every ps task's pieces, snapshotted an array at a time, a chunk a call, into the checkpoint's
  // file of that task (slices-<task>.safetensors), then committed as a sharded checkpoint: the
  // chief holds one array of a piece.
  std::filesystem::path save_checkpoint() {
    const std::filesystem::path temporary = checkpoints.begin_save(step);
    int64_t updates = 0;
    try {
      for (size_t task = 0; task < shards.size(); ++task) {
        // Asynchronous shards may have applied different numbers of updates; AdamW's bias
        // correction resumes from the most. (A snapshot is taken between steps: a task's count
        // is the same in each of its replies.)
        auto snapshot = [this, task, &updates](int piece, Field field, int64_t count) {
          std::vector<float> values(static_cast<size_t>(count));
          for (int64_t first = 0; first < count; first += chunk) {
            SnapshotRequest request;
            request.set_generation(generation);
            request.set_piece(piece);
            request.set_field(field);
            request.set_offset(first);
            request.set_count(std::min(chunk, count - first));
            const SnapshotReply reply = call(task, "Snapshot", &ParameterServer::Stub::Snapshot, request);
            from_bytes(reply.values(), values.data() + first, request.count(), ps_names[task] + ": Snapshot");
            updates = std::max(updates, reply.optimizer_steps());
          }
          return values;
        };
        std::vector<model::SliceValues> slices;
        for (size_t index = 0; index < placement.shards[task].size(); ++index) {
          const auto [spec, box] = piece_box(placement.shards[task][index]);
          const int piece = static_cast<int>(index);
          for (const auto& [prefix, field] : kFields) {
            slices.push_back({prefix + spec->name, spec->shape, box, [snapshot, piece, field = field, count = box.numel()] {
                                return snapshot(piece, field, count);
                              }});
          }
        }
        train::CheckpointManager::write_rank_slices(temporary, static_cast<int>(task), slices);
      }
    } catch (...) {
      train::CheckpointManager::abandon(temporary);
      throw;
    }
    optimizer_steps = updates;
    nlohmann::json state = {
        {"run_settings", train::run_settings(model_config, config)},
        {"data", {{"seed", config.seed}, {"next_batch", step}}},
        {"parameter_servers",
         {{"mode", settings.synchronous ? "sync" : "async"},
          {"max_staleness", settings.max_staleness},
          {"stale_pushes", stale_pushes},
          {"placement", placement.to_json()}}}};
    return checkpoints.commit(temporary, step, model_config, optimizer_steps, state);
  }

  // Every task's peak RSS growth over the whole run (its Status; the chief's own), as `train`
  // prints it for the ranks of other layouts, for `paraflow plan --ps-tasks P --workers W`.
  void report_task_peaks() {
    std::vector<std::pair<std::string, int64_t>> tasks{{"chief 0", train::peak_rss_bytes() - settings.rss_before}};
    const std::vector<int64_t> grown = workers->peak_rss_grown();
    for (size_t worker = 0; worker < grown.size(); ++worker) tasks.emplace_back(fmt::format("worker {}", worker), grown[worker]);
    const std::vector<int64_t> ps_grown = for_each_task(shards.size(), [&](size_t task) -> int64_t {
      try {
        return call_peer(ps_names[task], "Status", *shards[task], &ParameterServer::Stub::Status, StatusRequest(),
                         std::chrono::milliseconds(1000), settings.security)
            .peak_rss_grown();
      } catch (const PeerError&) {
        return -1;
      }
    });
    for (size_t task = 0; task < ps_grown.size(); ++task) tasks.emplace_back(fmt::format("ps {}", task), ps_grown[task]);
    auto mib = [](int64_t bytes) { return bytes < 0 ? std::string("?") : fmt::format("{:.1f}", static_cast<double>(bytes) / (1 << 20)); };
    const auto largest = std::max_element(tasks.begin(), tasks.end(),
                                          [](const auto& a, const auto& b) { return a.second < b.second; });
    std::string by_task;
    for (const auto& [name, bytes] : tasks) by_task += fmt::format("{}{}: {}", by_task.empty() ? "" : ", ", name, mib(bytes));
    fmt::print(stderr, "memory: whole run (start-up, steps, checkpoints, export), peak RSS grew {} MiB on {}, the most "
               "of {} tasks (`paraflow plan --ps-tasks {} --workers {}` predicts each task's); by task (MiB; ?: no "
               "answer): {}\n", mib(largest->second), largest->first, tasks.size(), shards.size(), grown.size(), by_task);
  }

  // Tells every worker and ps task to exit, the ps tasks while the workers are told
  // (ps::shut_down_tasks: with `wait_for_starting`, each may be waited for up to the timeout).
  void shut_down_cluster(bool wait_for_starting) {
    std::thread ps_tasks([&] {
      shut_down_tasks(ps_names, shards, &ParameterServer::Stub::Shutdown, ShutdownRequest(), wait_for_starting,
                      settings.timeout, settings.security);
    });
    workers->shut_down_workers(wait_for_starting);
    ps_tasks.join();
  }

  // The summaries of the step that ended at `at_step`.
  void log(data::EventWriter& events, const StepMetrics& metrics, int64_t at_step) {
    const double tokens = static_cast<double>(config.batch_size * config.sequence_length);
    events.add_scalar("train/loss", metrics.loss, at_step);
    events.add_scalar("train/lr", metrics.lr, at_step);
    if (settings.synchronous) events.add_scalar("train/grad_norm", metrics.grad_norm, at_step);
    events.add_scalar("train/tokens_per_second", tokens / metrics.seconds, at_step);
    events.add_scalar("ps/pull_seconds", metrics.pull_seconds, at_step);
    events.add_scalar("ps/compute_seconds", metrics.compute_seconds, at_step);
    events.add_scalar("ps/push_seconds", metrics.push_seconds, at_step);
    events.add_scalar("ps/bytes_per_step", static_cast<double>(metrics.bytes), at_step);
    if (!settings.synchronous) events.add_scalar("ps/stale_pushes", static_cast<double>(stale_pushes), at_step);
  }
};

Coordinator::Coordinator(model::GptConfig model_config, train::TrainConfig config, Placement placement,
                         ClusterSettings settings)
    : impl_(std::make_unique<Impl>(model_config, std::move(config), std::move(placement), std::move(settings))) {}

Coordinator::~Coordinator() = default;

void Coordinator::run(const std::atomic<bool>* stop) {
  try {
    train_and_export(stop);
  } catch (const InputError&) {
    // Wrong input (a checkpoint of other settings, data past the vocabulary): a relaunched chief
    // would fail alike, so the ps tasks and workers are told to exit rather than wait for one.
    // Other failures leave them up for the chief that is relaunched to resume.
    impl_->shut_down_cluster(/*wait_for_starting=*/true);
    throw;
  }
  impl_->report_task_peaks();
  impl_->shut_down_cluster(/*wait_for_starting=*/false);
}

void Coordinator::train_and_export(const std::atomic<bool>* stop) {
  Impl& m = *impl_;
  const train::TrainConfig& config = m.config;
  fmt::print(stderr, "parameter servers: {} ps task(s), {} worker(s), {} mode{}; {}\nplacement {}:\n{}",
             m.shards.size(), m.settings.worker_addresses.size(), m.settings.synchronous ? "synchronous" : "asynchronous",
             m.settings.synchronous ? "" : fmt::format(" (max staleness {})", m.settings.max_staleness),
             m.settings.security.describe(), m.placement_digest, m.placement.describe());
  if (config.eval_every > 0) fmt::print(stderr, "train.eval_every: the evaluator task evaluates in ps mode\n");
  m.wait_for_shards();
  m.load_shards();
  const int64_t last_step = config.stop_at_step > 0 ? std::min(config.stop_at_step, config.steps) : config.steps;
  const size_t workers = m.settings.worker_addresses.size();
  Progress progress("step", config.steps, config.log_every, m.step);
  data::EventWriter events(config.out_dir);
  const double tokens_per_step = static_cast<double>(config.batch_size * config.sequence_length);
  int recoveries = 0;  // in a row, without a step between them
  auto recover = [&](std::string reason) {
    while (true) {  // a ps task may fail again while the others are reloaded
      check(++recoveries <= 5, "giving up after 5 recoveries in a row: {}", reason);
      try {
        m.recover(reason);
        return;
      } catch (const PeerError& e) {
        reason = e.what();
      }
    }
  };
  std::filesystem::path checkpoint;
  bool stopping = false;
  while (checkpoint.empty()) {
    try {
      while (m.step < last_step && !(stopping = stop && stop->load())) {
        std::vector<StepMetrics> steps;  // the steps this pass ran, which end at m.step
        if (m.settings.synchronous) {
          steps.push_back(m.synchronous_step());
        } else {
          // Windows of 8 steps per worker keep every worker busy; one ends early at a checkpoint.
          int64_t count = std::min<int64_t>(last_step - m.step, 8 * static_cast<int64_t>(workers));
          if (config.checkpoint_every > 0) {
            count = std::min(count, config.checkpoint_every - m.step % config.checkpoint_every);
          }
          steps = m.asynchronous_steps(count);
        }
        recoveries = 0;
        // Each step logged on its own, as train.log_every asks, in either mode.
        int64_t ended = m.step - static_cast<int64_t>(steps.size());
        for (const StepMetrics& metrics : steps) {
          ++ended;
          m.stale_pushes += metrics.stale_pushes;
          m.log(events, metrics, ended);
          std::string line = fmt::format("loss {:.4f} | lr {:.2e} | {:.0f} tok/s | pull {:.3f}s compute {:.3f}s push "
                                         "{:.3f}s | {:.1f} MB/step", metrics.loss, metrics.lr,
                                         tokens_per_step / metrics.seconds, metrics.pull_seconds,
                                         metrics.compute_seconds, metrics.push_seconds,
                                         static_cast<double>(metrics.bytes) / 1e6);
          if (!m.settings.synchronous) line += fmt::format(" | stale pushes {}", m.stale_pushes);
          progress.update(ended, line);
        }
        if (config.checkpoint_every > 0 && m.step % config.checkpoint_every == 0 && m.step < config.steps) {
          m.save_checkpoint();
        }
      }
      checkpoint = m.save_checkpoint();
    } catch (const ShardFailure& e) {
      recover(e.what());
    } catch (const PeerError& e) {  // a call of the chief's own to a ps task (reduce, apply, snapshot)
      recover(e.what());
    }
  }
  progress.finish();
  if (stopping) fmt::print(stderr, "stop requested at step {}: saved a checkpoint\n", m.step);
  const std::filesystem::path export_dir = config.out_dir / "export";
  // Streamed from the checkpoint just saved, one tensor at a time.
  model::SliceReader reader = train::CheckpointManager::open(checkpoint, m.model_config);
  model::export_model_dir(export_dir, m.model_config, reader);
  if (!config.tokenizer_dir.empty()) {
    data::Tokenizer::load(config.tokenizer_dir).export_to(config.tokenizer_dir, export_dir);
  }
  fmt::print(stderr, "checkpoint {} ; model exported to {}\n", checkpoint.string(), export_dir.string());
}

}  // namespace paraflow::ps
