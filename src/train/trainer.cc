#include "train/trainer.h"

#include <fmt/format.h>

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <optional>

#include "base/clock.h"
#include "base/json.h"
#include "base/progress.h"
#include "base/system_memory.h"
#include "data/events.h"
#include "data/tokenizer.h"
#include "dist/collective_group.h"
#include "graph/op.h"
#include "train/training_graph.h"
#include "model/model_files.h"
#include "model/part_slices.h"

namespace paraflow::train {

TrainConfig TrainConfig::from_config(const Config& config) {
  // Types, ranges and defaults are the config schema's; what is checked here relates two keys.
  TrainConfig c;
  c.batch_size = config.get<int64_t>("train.batch_size");
  c.sequence_length = config.get<int64_t>("train.sequence_length");
  c.steps = config.get<int64_t>("train.steps");
  c.stop_at_step = config.get<int64_t>("train.stop_at_step");
  c.grad_accumulation = config.get<int64_t>("train.grad_accumulation");
  c.schedule.peak = config.get<double>("train.lr");
  c.schedule.floor = config.has("train.min_lr") ? config.get<double>("train.min_lr") : c.schedule.peak * 0.1;
  check(c.schedule.floor <= c.schedule.peak, "{}: train.min_lr ({}) exceeds train.lr ({})", config.origin(),
        c.schedule.floor, c.schedule.peak);
  c.schedule.warmup = config.get<int64_t>("train.warmup_steps");
  c.schedule.total = c.steps;
  c.adamw.beta1 = config.get<double>("train.beta1");
  c.adamw.beta2 = config.get<double>("train.beta2");
  c.adamw.eps = config.get<double>("train.eps");
  c.adamw.weight_decay = config.get<double>("train.weight_decay");
  c.adamw.grad_clip = config.get<double>("train.grad_clip");
  c.seed = config.get<uint64_t>("train.seed");
  c.out_dir = config.path("train.out_dir");
  c.checkpoint_every = config.get<int64_t>("train.checkpoint_every");
  c.keep_checkpoints = config.get<int>("train.keep_checkpoints");
  c.log_every = config.get<int64_t>("train.log_every");
  c.eval_every = config.get<int64_t>("train.eval_every");
  c.eval_batches = config.get<int64_t>("train.eval_batches");
  c.sync.bucket_bytes = static_cast<int64_t>(config.get<double>("dist.bucket_mb") * (1 << 20));
  c.sync.overlap = config.get<bool>("dist.overlap");
  c.sync.zero = config.get<int>("dist.zero");
  c.sync.exact = config.get<bool>("dist.exact_reduction");
  check(!(c.sync.zero > 0 && c.sync.exact), "{}: dist.exact_reduction does not combine with dist.zero: {} yet",
        config.origin(), c.sync.zero);
  c.tensor_parallel = config.get<int>("dist.tensor_parallel");
  c.pipeline_parallel = config.get<int>("dist.pipeline_parallel");
  c.micro_batches = config.get<int64_t>("dist.micro_batches");
  c.pipeline_schedule = parse_pipeline_schedule(config.get<std::string>("dist.schedule"));
  c.stage_layers = parse_layers_per_stage(config.get<std::string>("dist.stage_layers"), "dist.stage_layers");
  c.precision = graph::parse_precision_policy(config.get<std::string>("train.precision"));
  // A pipeline stage sums every micro-batch's gradients in its whole gradient buffer before they
  // are reduced: there is nothing for ZeRO-2 to shard (DeepSpeed refuses the same pair).
  check(c.sync.zero < 2 || c.pipeline_parallel == 1,
        "{}: dist.zero: {} (sharded gradient accumulation) does not combine with dist.pipeline_parallel: {}; use "
        "dist.zero: 1 with a pipeline", config.origin(), c.sync.zero, c.pipeline_parallel);
  // ZeRO-3 gathers the f32 parameters of one replica layer by layer: not yet the shards of a
  // tensor-parallel layer, nor the 16-bit copies a mixed policy reads.
  check(c.sync.zero < 3 || c.tensor_parallel == 1, "{}: dist.zero: 3 does not combine with dist.tensor_parallel: {} "
        "yet; use dist.zero: 2", config.origin(), c.tensor_parallel);
  check(c.sync.zero < 3 || c.precision == graph::PrecisionPolicy::float32,
        "{}: dist.zero: 3 does not combine with train.precision: {} yet; use dist.zero: 2", config.origin(),
        graph::precision_policy_name(c.precision));
  c.recompute = config.get<std::string>("train.recompute");
  c.decay_embeddings = config.get<bool>("train.decay_embeddings");
  c.initial_loss_scale = config.get<double>("train.initial_loss_scale");
  c.force_resume = config.get<std::string>("train.resume") == "force";
  return c;
}

void TrainConfig::check_batch_split(int ranks) const {
  check(batch_size % (replicas(ranks) * micro_batches_per_step()) == 0,
        "train.batch_size ({}) must be a multiple of data-parallel replicas ({}) x {} ({})", batch_size,
        replicas(ranks), pipeline_parallel > 1 ? "dist.micro_batches" : "train.grad_accumulation",
        micro_batches_per_step());
}

Trainer::Trainer(model::GptConfig model_config, TrainConfig config, BatchSource& data, Backend& backend,
                 dist::Communicator& communicator)
    : model_config_(model_config),
      config_(std::move(config)),
      data_(data),
      backend_(backend),
      communicator_(communicator),
      whole_specs_(model::gpt_tensor_specs(model_config_, config_.decay_embeddings)),
      checkpoints_(config_.out_dir, config_.keep_checkpoints),
      rss_at_start_(peak_rss_bytes()) {
  nlohmann::json settings = group_settings(model_config_, config_);
  settings["data"] = data_.state();  // the corpus and its split, or the TFRecord files' fingerprint
  check_group_settings(communicator_, settings);
  const int stages = config_.pipeline_parallel;
  check(stages == 1 || config_.grad_accumulation == 1,
        "train.grad_accumulation ({}) with dist.pipeline_parallel ({}): a pipeline accumulates over "
        "dist.micro_batches instead", config_.grad_accumulation, stages);
  if (stages > 1 || config_.tensor_parallel > 1) {
    mesh_ = std::make_unique<dist::MeshGroups>(dist::split_mesh(
        communicator_, dist::mesh_shape(communicator_.size(), config_.tensor_parallel, stages)));
    stage_ranges_ = partition_layers(model_config_, stages, config_.sequence_length, config_.stage_layers);
    range_ = stage_ranges_[static_cast<size_t>(mesh_->me.stage)];
    shard_ = {mesh_->me.tensor, config_.tensor_parallel};
    if (tensor_parallel()) tensor_group_ = dist::as_collective_group(*mesh_->tensor);
  }
  config_.check_batch_split(communicator_.size());
  micro_batch_ = config_.micro_batch(communicator_.size());
  check(config_.sequence_length <= model_config_.n_positions,
        "train.sequence_length ({}) exceeds model.n_positions ({})", config_.sequence_length, model_config_.n_positions);
  check_tokens_fit(data_, model_config_.vocab_size);
  // The graph first: it checks that the shards divide the heads.
  graph_ = build_training_graph(model_config_, micro_batch_, config_.sequence_length, config_.recompute,
                                config_.precision, backend_, range_, shard_);
  parameters_ = model::ParameterSet(model::part_tensor_specs(whole_specs_, range_, shard_), backend_);
  gradients_ = model::ParameterSet(parameters_.specs(), backend_);
  // ZeRO-2 holds its shard and the buckets in flight only (GradientSync): the buffer, allocated
  // zeroed, gives its pages back until backward writes them.
  if (shards_gradients()) zero_releasing_pages(gradients_.flat().device_data<float>(), gradients_.numel());
  half_parameters_ =
      model::make_half_parameters(graph_, parameters_, backend_, graph::storage_dtype(config_.precision));
  if (stages > 1) {
    pipeline_ = std::make_unique<PipelineStage>(
        graph_, PipelineLayout{stages, mesh_->me.stage, config_.pipeline_schedule, config_.micro_batches}, backend_,
        *mesh_->pipeline, tensor_group_.get());
    pipeline_->bind(parameters_, gradients_, half_parameters_);
  } else {
    executor_ = std::make_unique<graph::Executor>(graph_.graph, backend_);
    executor_->set_collective_group(tensor_group_.get());
    model::bind_parameters(*executor_, graph_, parameters_, &gradients_, &half_parameters_);
    loss_grad_ = backend_.empty(graph_.graph.value(graph_.losses).shape, DType::f32);
    executor_->bind(graph_.graph.value(graph_.losses).grad, loss_grad_);
  }
  if (config_.grad_accumulation > 1 && !shards_gradients()) accumulated_ = model::ParameterSet(gradients_.specs(), backend);
  if (partitioned() && mesh_->me.data == 0 && mesh_->me.tensor == 0) {
    fmt::print(stderr, "stage {} of {}, {} shard(s) x {} replica(s): blocks [{}, {}){}{}\n", mesh_->me.stage, stages,
               config_.tensor_parallel, replicas().size(), range_.first_layer,
               range_.end_layer, range_.first ? ", embeddings" : "",
               range_.last ? ", head" : "");
  }

  dist::GradientSyncConfig sync_config = config_.sync;
  sync_config.zero = shards_optimizer_state() ? config_.sync.zero : 0;
  // A pipeline stage's gradients are complete only after its last micro-batch's backward, and
  // MPI calls from the gradient thread must not overlap the stage transfers or the tensor-parallel
  // all-reduces of the main thread.
  sync_config.overlap = config_.sync.overlap && !partitioned();
  sync_ = std::make_unique<dist::GradientSync>(
      replicas(), graph_.graph, gradient_slices(graph_, parameters_.specs()), gradients_.flat().device_data<float>(),
      accumulated_.specs().empty() ? nullptr : accumulated_.flat().device_data<float>(), sync_config);
  if (executor_) executor_->set_backward_hook([this](size_t node) { sync_->on_backward_node(node); });
  if (shards_parameters()) {
    sharded_parameters_ = std::make_unique<ShardedParameters>(graph_, parameters_, *sync_);
    executor_->set_node_hooks([this](size_t node) { sharded_parameters_->before_node(node); },
                              [this](size_t node) { sharded_parameters_->after_node(node); });
  }
  // With ZeRO this rank's optimizer holds the moments of its shard only.
  loss_scaler_.scale = config_.initial_loss_scale;
  optimizer_ = shards_optimizer_state()
                   ? std::make_unique<AdamW>(config_.adamw, parameters_, backend_, sync_->shard_begin(), sync_->shard_end())
                   : std::make_unique<AdamW>(config_.adamw, parameters_, backend_);
}

nlohmann::json run_settings(const model::GptConfig& model_config, const TrainConfig& config) {
  return {{"model", model_config.to_hf_json()},
          {"train",
           {{"batch_size", config.batch_size},
            {"sequence_length", config.sequence_length},
            {"steps", config.steps},
            {"lr", config.schedule.peak},
            {"min_lr", config.schedule.floor},
            {"warmup_steps", config.schedule.warmup},
            {"beta1", config.adamw.beta1},
            {"beta2", config.adamw.beta2},
            {"eps", config.adamw.eps},
            {"weight_decay", config.adamw.weight_decay},
            {"grad_clip", config.adamw.grad_clip},
            {"decay_embeddings", config.decay_embeddings},
            {"precision", graph::precision_policy_name(config.precision)},
            {"seed", config.seed}}}};
}

nlohmann::json group_settings(const model::GptConfig& model_config, const TrainConfig& config) {
  nlohmann::json settings = run_settings(model_config, config);
  settings["train"].update({{"grad_accumulation", config.grad_accumulation},
                            {"stop_at_step", config.stop_at_step},
                            {"checkpoint_every", config.checkpoint_every},
                            {"log_every", config.log_every},
                            {"eval_every", config.eval_every},
                            {"eval_batches", config.eval_batches},
                            {"recompute", config.recompute},
                            {"initial_loss_scale", config.initial_loss_scale}});
  settings["dist"] = {{"tensor_parallel", config.tensor_parallel},
                      {"pipeline_parallel", config.pipeline_parallel},
                      {"micro_batches", config.micro_batches},
                      {"schedule", pipeline_schedule_name(config.pipeline_schedule)},
                      {"stage_layers", config.stage_layers},
                      {"bucket_mb", static_cast<double>(config.sync.bucket_bytes) / (1 << 20)},
                      {"overlap", config.sync.overlap},
                      {"zero", config.sync.zero},
                      {"exact_reduction", config.sync.exact}};
  return settings;
}

void check_group_settings(dist::Communicator& communicator, const nlohmann::json& settings) {
  if (communicator.size() == 1) return;
  const nlohmann::json chief = parse_json(dist::broadcast_text(communicator, settings.dump(), 0), "the chief's settings");
  std::string differences;
  for (const auto& [section, values] : settings.items()) {
    for (const auto& [key, value] : values.items()) {
      const bool known = chief.contains(section) && chief[section].contains(key);
      if (known && chief[section][key] == value) continue;
      differences += fmt::format("{}{}.{} {} here, {} on the chief", differences.empty() ? "" : "; ", section, key,
                                 value.dump(), known ? chief[section][key].dump() : "(absent)");
    }
  }
  // Every rank learns which ranks differ, so that all of them stop here rather than some waiting
  // in the next collective for ranks that have left.
  std::vector<int64_t> differs(static_cast<size_t>(communicator.size()), 0);
  differs[static_cast<size_t>(communicator.rank())] = differences.empty() ? 0 : 1;
  communicator.all_reduce_sum(differs.data(), differs.size());
  check(differences.empty(), "this rank's settings differ from the chief's (rank 0): {}: every rank of a job must run "
        "the same config and --set overrides", differences);
  std::string ranks;
  for (size_t rank = 0; rank < differs.size(); ++rank) {
    if (differs[rank] != 0) ranks += fmt::format("{}{}", ranks.empty() ? "" : ", ", rank);
  }
  check(ranks.empty(), "the settings of rank(s) {} of {} differ from the chief's (rank 0); their messages name the keys",
        ranks, communicator.size());
}

void check_resumable(const std::filesystem::path& checkpoint, const nlohmann::json& state,
                     const model::GptConfig& model_config, const TrainConfig& config) {
  if (!state.contains("run_settings")) return;  // written before settings were recorded
  const nlohmann::json now = run_settings(model_config, config);
  std::string changes;
  for (const char* section : {"model", "train"}) {
    const nlohmann::json& before = state["run_settings"][section];
    for (const auto& [key, value] : now[section].items()) {
      if (before.contains(key) && before[key] == value) continue;
      changes += fmt::format("{}{}.{} {} -> {}", changes.empty() ? "" : ", ", section, key,
                             before.contains(key) ? before[key].dump() : "(absent)", value.dump());
    }
  }
  if (changes.empty()) return;
  check(config.force_resume,
        "{} was made with other settings ({}): use another train.out_dir for a new run, or --set "
        "train.resume=force to continue this one with the new settings",
        checkpoint.string(), changes);
  fmt::print(stderr, "warning: train.resume=force: resuming {} with changed settings: {}\n", checkpoint.string(),
             changes);
}

bool Trainer::initialize_or_resume() {
  // The chief picks the newest valid checkpoint and checks its settings; then every rank reads its
  // own slices of it, or initialises its own part from the seed: no rank holds more than its part.
  int64_t resumed_step = 0;
  int64_t optimizer_steps = 0;
  std::string data_state = "{}";
  std::string chosen;
  if (is_chief()) {
    if (auto checkpoint = checkpoints_.latest_valid()) {
      const nlohmann::json state = CheckpointManager::read_state(*checkpoint);
      check_resumable(*checkpoint, state, model_config_, config_);
      chosen = checkpoint->string();
      resumed_step = state.at("step").get<int64_t>();
      optimizer_steps = state.at("optimizer_steps").get<int64_t>();
      if (state.contains("data") && state["data"].contains("pipeline")) data_state = state["data"]["pipeline"].dump();
      if (state.contains("loss_scale")) {
        loss_scaler_.scale = state["loss_scale"].at("scale").get<double>();
        loss_scaler_.finite_steps = state["loss_scale"].at("finite_steps").get<int64_t>();
        loss_scaler_.skipped_steps = state["loss_scale"].at("skipped_steps").get<int64_t>();
      }
    }
  }
  wait_for_checkpoint_io();  // verifying the checkpoint's checksums can outlast a collective's timeout
  chosen = broadcast_text(chosen);
  // This rank's moments: its ZeRO-1 range of its part's flat buffer, or all of it.
  const int64_t begin = optimizer_->begin(), end = optimizer_->end();
  // Its weights: its part, or with ZeRO-3 the same range as its moments (the rest is gathered
  // layer by layer when a step needs it).
  const int64_t weights_begin = sharded_parameters_ ? begin : 0;
  const int64_t weights_end = sharded_parameters_ ? end : parameters_.numel();
  if (chosen.empty()) {
    model::initialize_gpt(parameters_, model_config_, config_.seed, shard_, weights_begin, weights_end);
    backend_.fill_zero(optimizer_->first_moment());
    backend_.fill_zero(optimizer_->second_moment());
  } else {
    model::SliceReader reader = CheckpointManager::open(chosen, model_config_);
    parameters_.write_on_host([&](model::ParameterSet& host) {
      model::read_part(reader, host, whole_specs_, shard_, "", host.flat().data<float>() + weights_begin,
                       weights_begin, weights_end);
    });
    for (const auto& [prefix, moment] : {std::pair<const char*, Tensor>{"m.", optimizer_->first_moment()},
                                         {"v.", optimizer_->second_moment()}}) {
      Tensor host = backend_.on_host(moment);
      model::read_part(reader, parameters_, whole_specs_, shard_, prefix, host.data<float>(), begin, end);
      if (!moment.host_accessible()) backend_.upload(host.raw(), moment);
    }
    if (is_chief()) fmt::print(stderr, "resumed from {} at step {}\n", chosen, resumed_step);
  }
  // The step counts and the loss scale travel as JSON text (integers and doubles arrive exactly).
  nlohmann::json counters = nlohmann::json::parse(broadcast_text(
      nlohmann::json{{"step", resumed_step}, {"optimizer_steps", optimizer_steps}, {"scale", loss_scaler_.scale},
                     {"finite", loss_scaler_.finite_steps}, {"skipped", loss_scaler_.skipped_steps}}.dump()));
  optimizer_->set_steps_taken(counters["optimizer_steps"].get<int64_t>());
  loss_scaler_.scale = counters["scale"].get<double>();
  loss_scaler_.finite_steps = counters["finite"].get<int64_t>();
  loss_scaler_.skipped_steps = counters["skipped"].get<int64_t>();
  data_.restore(nlohmann::json::parse(broadcast_text(data_state)));
  step_ = counters["step"].get<int64_t>();
  refresh_half_parameters();
  if (sharded_parameters_) sharded_parameters_->release_all();  // the layers' gathers start from the shards
  return step_ > 0;
}

std::string Trainer::broadcast_text(const std::string& text) {
  return partitioned() ? dist::broadcast_text(communicator_, text, 0) : sync_->broadcast(text, 0);
}

float Trainer::job_sum(float value) {
  if (!partitioned()) return sync_->all_reduce_sum(value);
  communicator_.all_reduce_sum(&value, 1);
  return value;
}

float Trainer::job_max(float value) {
  if (!partitioned()) return sync_->all_reduce_max(value);
  communicator_.all_reduce_max(&value, 1);
  return value;
}

double Trainer::forward_backward(int64_t index, int64_t micro) {
  const int64_t slice = replicas().rank() * config_.grad_accumulation + micro;
  const int64_t slices = replicas().size() * config_.grad_accumulation;
  const double loss = forward_batch(*executor_, graph_, data_, {index, config_.seed, false, slice, slices});
  backend_.upload(std::vector<float>(static_cast<size_t>(loss_grad_.numel()), loss_weight()).data(), loss_grad_);
  if (shards_gradients()) {
    // Without touching a page: a rank holds only its shard and the buckets in flight (GradientSync).
    zero_releasing_pages(gradients_.flat().device_data<float>(), gradients_.numel());
  } else {
    backend_.fill_zero(gradients_.flat());
  }
  sync_->begin_backward(micro + 1 == config_.grad_accumulation);
  executor_->backward();
  sum_partial_gradients();
  sync_->end_backward();
  return loss;
}

float Trainer::loss_weight() const {
  // d(mean loss over the global batch)/d(loss at each position of one micro-batch)
  const int64_t positions = micro_batch_ * config_.sequence_length;
  float weight = 1.0f / static_cast<float>(positions * replicas().size() * config_.micro_batches_per_step());
  if (scales_loss()) weight *= static_cast<float>(loss_scaler_.scale);
  return weight;
}

double Trainer::pipeline_step() {
  backend_.fill_zero(gradients_.flat());
  const int64_t m = config_.micro_batches;
  const BatchPosition first{step_, config_.seed, false, replicas().rank() * m, replicas().size() * m};
  const double loss = pipeline_->train(data_, first, loss_weight()) / static_cast<double>(m);
  sum_tied_embedding_gradients();
  sum_partial_gradients();
  sync_->begin_backward(true);
  sync_->end_backward();
  return loss;
}

void Trainer::sum_tied_embedding_gradients() {
  if (!(range_.first || range_.last) || range_.whole_model() || !model_config_.tie_word_embeddings) return;
  const Tensor& mine = gradients_.get(model::embedding_table_name(model_config_));
  std::vector<float> theirs(static_cast<size_t>(mine.numel()));
  const int peer = range_.first ? config_.pipeline_parallel - 1 : 0;
  mesh_->pipeline->send_recv(mine.device_address(), mine.nbytes(), peer, theirs.data(), mine.nbytes(), peer);
  // Both stages compute first + last (float addition commutes), so the two copies stay equal.
  float* gradient = mine.device_data<float>();
  for (size_t i = 0; i < theirs.size(); ++i) gradient[i] += theirs[i];
}

void Trainer::sum_partial_gradients() {
  if (!tensor_parallel()) return;
  // Packed into one buffer, each tensor's partial elements at their places in the whole tensor
  // (shards that do not hold an element add zero to it): one all-reduce per step.
  struct Partial {
    const Tensor* gradient;
    std::vector<model::ShardRun> runs;
    size_t at;  // the whole tensor's place in the buffer
  };
  std::vector<Partial> partial;
  size_t size = 0;
  for (size_t i = 0; i < gradients_.specs().size(); ++i) {
    const model::TensorSpec& spec = gradients_.specs()[i];
    std::vector<model::ShardRun> runs = model::partial_gradient_runs(spec, shard_);
    if (runs.empty()) continue;
    partial.push_back({&gradients_.at(i), std::move(runs), size});
    size += static_cast<size_t>(model::whole_numel(spec));
  }
  std::vector<float> packed(size, 0.0f);
  for (const Partial& p : partial) {
    const float* gradient = p.gradient->device_data<float>();
    for (const model::ShardRun& run : p.runs) {
      std::copy(gradient + run.in_shard, gradient + run.in_shard + run.count, packed.begin() + p.at + run.in_whole);
    }
  }
  mesh_->tensor->all_reduce_sum(packed.data(), packed.size());
  for (const Partial& p : partial) {
    float* gradient = p.gradient->device_data<float>();
    for (const model::ShardRun& run : p.runs) {
      std::copy(packed.begin() + p.at + run.in_whole, packed.begin() + p.at + run.in_whole + run.count,
                gradient + run.in_shard);
    }
  }
}

bool Trainer::holds_tied_copy(const std::string& name) const {
  // The first stage's copy counts (and is written); the last stage's is a copy of it.
  return model_config_.tie_word_embeddings && name == model::embedding_table_name(model_config_) && range_.last &&
         !range_.first;
}

double Trainer::counted_squares(const Tensor& gradients) const {
  const int64_t begin = optimizer_->begin(), end = optimizer_->end();
  double squares = 0;
  if (!partitioned()) {
    backend_.launch(SumSquares{.x = gradients.slice_flat(begin, end - begin), .result = &squares});
    return squares;
  }
  for (size_t i = 0; i < gradients_.specs().size(); ++i) {
    const model::TensorSpec& spec = gradients_.specs()[i];
    // Each element counts on the first shard holding it.
    if (holds_tied_copy(spec.name)) continue;
    for (const auto& [within, count] : model::counted_runs(spec, shard_)) {
      const int64_t from = std::max(begin, gradients_.offset_of(i) + within);
      const int64_t to = std::min(end, gradients_.offset_of(i) + within + count);
      if (to <= from) continue;
      double part = 0;
      backend_.launch(SumSquares{.x = gradients.slice_flat(from, to - from), .result = &part});
      squares += part;
    }
  }
  return squares;
}

StepStats Trainer::step() {
  auto start = std::chrono::steady_clock::now();
  StepStats stats;
  const int64_t tensor_bytes_before = tensor_group_ ? tensor_group_->bytes_reduced() : 0;
  const double tensor_seconds_before = tensor_group_ ? tensor_group_->seconds_reducing() : 0;
  double local_loss = 0;
  if (pipelined()) {
    local_loss = pipeline_step();  // the last stage's; 0 on the others
    stats.pipeline = pipeline_->last_timing();
  } else {
    for (int64_t micro = 0; micro < config_.grad_accumulation; ++micro) {
      local_loss += forward_backward(step_, micro) / static_cast<double>(config_.grad_accumulation);
    }
  }
  stats.communication_wait = sync_->last_wait_seconds();
  if (tensor_group_) {
    stats.tensor_parallel_bytes = tensor_group_->bytes_reduced() - tensor_bytes_before;
    stats.tensor_parallel_seconds = tensor_group_->seconds_reducing() - tensor_seconds_before;
  }
  if (shard_.rank != 0) local_loss = 0;  // every shard computed the same loss
  stats.loss = job_sum(static_cast<float>(local_loss)) / static_cast<double>(replicas().size());
  stats.lr = config_.schedule.at(step_);
  // The global gradient norm: over this rank's ZeRO-1 shard and summed, or over everything; for
  // a partitioned model, summed over its parts too, each tensor counted once.
  const Tensor& grads = final_gradients().flat();
  double squares = counted_squares(grads);
  if (partitioned()) {
    squares = job_sum(static_cast<float>(squares)) / (shards_optimizer_state() ? 1.0 : static_cast<double>(replicas().size()));
  } else if (shards_optimizer_state()) {
    squares = sync_->all_reduce_sum(static_cast<float>(squares));
  }
  const double unscale = scales_loss() ? 1.0 / loss_scaler_.scale : 1.0;
  stats.grad_norm = std::sqrt(squares) * unscale;
  // Without a loss scale to lower, non-finite gradients mean the run has diverged: applying them
  // would make every weight NaN, and the checkpoints that follow would push the good ones out.
  // Every rank sees the same (reduced) sum, so every rank stops here, before the update.
  check(scales_loss() || std::isfinite(squares),
        "step {}: the gradients are not finite (loss {:g}){}: the update was not applied and the run stops, its last "
        "checkpoint intact; resume with a lower train.lr or train.warmup_steps, or another train.precision", step_,
        stats.loss, config_.sync.exact ? " (with dist.exact_reduction, a gradient of magnitude 2^20 or more reads as "
        "not finite)" : "");
  const bool apply = !scales_loss() || loss_scaler_.update(std::isfinite(squares));
  stats.skipped = !apply;
  if (apply) {
    optimizer_->update(parameters_.flat(), grads, half_parameters_.flat(), stats.lr,
                       static_cast<float>(optimizer_->clip_factor(stats.grad_norm) * unscale));
    if (sharded_parameters_) {
      sharded_parameters_->release_all();  // the next forward gathers the updated layers
    } else if (shards_optimizer_state()) {
      sync_->all_gather_shards(parameters_.flat().device_data<float>());
      refresh_half_parameters();  // the optimizer wrote this rank's shard of them only
    }
  }
  ++step_;
  stats.seconds = seconds_since(start);
  return stats;
}

void Trainer::refresh_half_parameters() {
  if (half_parameters_.specs().empty()) return;
  half_parameters_.assign_converted(parameters_);
}

double Trainer::evaluate(int64_t batches) {
  // Every replica evaluates its slices of each validation batch; the mean goes through all-reduce.
  const int64_t per_step = config_.micro_batches_per_step();
  const int64_t slices = replicas().size() * per_step;
  double total = 0;
  for (int64_t index = 0; index < batches; ++index) {
    if (pipelined()) {
      total += pipeline_->evaluate(data_, {index, config_.seed, true, replicas().rank() * per_step, slices});
      continue;
    }
    for (int64_t micro = 0; micro < per_step; ++micro) {
      const int64_t slice = replicas().rank() * per_step + micro;
      total += forward_batch(*executor_, graph_, data_, {index, config_.seed, true, slice, slices});
    }
  }
  if (shard_.rank != 0) total = 0;  // every shard computed the same losses
  return job_sum(static_cast<float>(total)) / static_cast<double>(batches * slices);
}

std::filesystem::path Trainer::save_checkpoint() {
  // Every rank writes the slices it holds into the chief's temporary directory: its part's weights
  // and moments (replicas hold the same part: the first writes it; copies held by other stages or
  // shards too are written once), or with ZeRO-1 its own range of the moments, with ZeRO-3 its own
  // range of the weights too (at most three boxes a tensor: no rank gathers the model). The chief
  // commits once every rank's files are durable.
  const std::filesystem::path temporary = broadcast_text(is_chief() ? checkpoints_.begin_save(step_).string() : "");
  std::exception_ptr error;
  try {
    const model::ParameterSet host = parameters_.on_host();
    const Tensor first = backend_.on_host(optimizer_->first_moment()), second = backend_.on_host(optimizer_->second_moment());
    const bool writes_part = replicas().rank() == 0;
    std::vector<model::SliceValues> slices;
    auto add = [&](const char* prefix, const float* window, int64_t begin, int64_t end) {
      for (model::SliceValues& slice :
           model::part_slice_values(host, whole_specs_, shard_, prefix, window, begin, end)) {
        if (!holds_tied_copy(slice.name.substr(std::string(prefix).size()))) slices.push_back(std::move(slice));
      }
    };
    if (sharded_parameters_) {
      add("", host.flat().data<float>() + optimizer_->begin(), optimizer_->begin(), optimizer_->end());
    } else if (writes_part) {
      add("", host.flat().data<float>(), 0, host.numel());
    }
    if (writes_part || shards_optimizer_state()) {
      add("m.", first.data<float>(), optimizer_->begin(), optimizer_->end());
      add("v.", second.data<float>(), optimizer_->begin(), optimizer_->end());
    }
    CheckpointManager::write_rank_slices(temporary, communicator_.rank(), slices);
  } catch (const std::exception&) {
    error = std::current_exception();
  }
  // Every rank learns whether all of them wrote, so that none waits for a rank that gave up (after
  // the slowest writer: past the collectives' timeout on slow storage).
  wait_for_checkpoint_io();
  const float failed = job_sum(error ? 1.0f : 0.0f);
  if (failed > 0) {
    if (is_chief()) CheckpointManager::abandon(temporary);  // (else removed at the next start)
    if (error) std::rethrow_exception(error);  // this rank's message ends the job
    // The others wait for a failing rank to end the job with its message, which names the cause.
    communicator_.barrier();
    throw IoError(fmt::format("checkpoint at step {}: {:g} rank(s) could not write their slices; the previous "
                              "checkpoint stays the latest", step_, failed));
  }
  std::filesystem::path path;
  if (is_chief()) {
    nlohmann::json state = {{"run_settings", run_settings(model_config_, config_)},
                            {"data", {{"seed", config_.seed}, {"next_batch", step_}, {"pipeline", data_.state()}}},
                            {"loss_scale", {{"scale", loss_scaler_.scale}, {"finite_steps", loss_scaler_.finite_steps},
                                            {"skipped_steps", loss_scaler_.skipped_steps}}}};
    path = checkpoints_.commit(temporary, step_, model_config_, optimizer_->steps_taken(), state);
    last_checkpoint_ = path;
  }
  wait_for_checkpoint_io();
  return path;
}

void Trainer::wait_for_checkpoint_io() {
  constexpr std::chrono::minutes kChiefIoLimit{30};
  if (communicator_.size() > 1) communicator_.barrier_within(kChiefIoLimit);
}

void Trainer::export_model(const std::filesystem::path& dir) const {
  std::optional<data::Tokenizer> tokenizer;
  if (!config_.tokenizer_dir.empty()) tokenizer = data::Tokenizer::load(config_.tokenizer_dir);
  const int64_t end_of_text = tokenizer ? tokenizer->eot_id() : -1;
  if (partitioned() || sharded_parameters_) {
    // No rank holds the whole model: the export is streamed from the last checkpoint's slices.
    check(!last_checkpoint_.empty(), "export of a partitioned run: it is written from the run's last checkpoint, and "
          "this process has saved none");
    model::SliceReader reader = CheckpointManager::open(last_checkpoint_, model_config_);
    model::export_model_dir(dir, model_config_, reader, end_of_text);
  } else {
    model::save_model_dir(dir, model_config_, parameters_, end_of_text);
  }
  if (tokenizer) tokenizer->export_to(config_.tokenizer_dir, dir);
}

void Trainer::run(const std::atomic<bool>* stop, double peak_flops) {
  const double tokens_per_step = static_cast<double>(config_.batch_size * config_.sequence_length);
  const double flops_per_step = model_config_.flops_per_token(config_.sequence_length) * tokens_per_step;
  Progress progress("step", config_.steps, is_chief() ? config_.log_every : config_.steps + 1, step_);
  // TensorBoard summaries come from the chief only, so no two processes write one file.
  std::unique_ptr<data::EventWriter> events;
  if (is_chief()) events = std::make_unique<data::EventWriter>(config_.out_dir);
  double smoothed_seconds = 0;
  // Every rank must stop at the same step, so the stop request is agreed on by all-reduce.
  auto stop_agreed = [&] { return job_max(stop && stop->load() ? 1.0f : 0.0f) > 0; };
  bool stopping = false;
  const int64_t last_step = config_.stop_at_step > 0 ? std::min(config_.stop_at_step, config_.steps) : config_.steps;
  const double wait_before = data_.wait_seconds();
  const auto run_start = std::chrono::steady_clock::now();
  const int64_t first_step = step_;
  const int64_t rss_before = peak_rss_bytes();
  std::filesystem::path checkpoint;
  int64_t checkpoint_step = -1;  // the step this run last saved
  while (step_ < last_step && !(stopping = stop_agreed())) {
    StepStats stats = step();
    smoothed_seconds = smoothed_seconds == 0 ? stats.seconds : 0.9 * smoothed_seconds + 0.1 * stats.seconds;
    // A peak measured while other processes held the cores reads low, and MFU then read 400% in a
    // user's run; no step beats the real peak, so a step that beats the measured one raises it.
    peak_flops = std::max(peak_flops, flops_per_step / std::min(stats.seconds, smoothed_seconds));
    std::string metrics = fmt::format("loss {:.4f} | lr {:.2e} | norm {:.2f} | {:.0f} tok/s | MFU {:.1f}%", stats.loss,
                                      stats.lr, stats.grad_norm, tokens_per_step / smoothed_seconds,
                                      100.0 * flops_per_step / smoothed_seconds / peak_flops);
    if (scales_loss()) {
      metrics += fmt::format(" | scale {:g} | skipped {}", loss_scaler_.scale, loss_scaler_.skipped_steps);
    }
    if (events) {
      events->add_scalar("train/loss", stats.loss, step_);
      events->add_scalar("train/lr", stats.lr, step_);
      events->add_scalar("train/grad_norm", stats.grad_norm, step_);
      events->add_scalar("train/tokens_per_second", tokens_per_step / stats.seconds, step_);
      events->add_scalar("train/mfu", flops_per_step / stats.seconds / peak_flops, step_);
      if (scales_loss()) {
        events->add_scalar("train/loss_scale", loss_scaler_.scale, step_);
        events->add_scalar("train/skipped_steps", static_cast<double>(loss_scaler_.skipped_steps), step_);
      }
    }
    if (config_.eval_every > 0 && step_ % config_.eval_every == 0) {
      double validation = evaluate(config_.eval_batches);
      metrics += fmt::format(" | val {:.4f}", validation);
      if (events) events->add_scalar("train/val_loss", validation, step_);
    }
    if (is_chief()) progress.update(step_, metrics);
    if (step_ == first_step + 2) report_peak_growth(rss_before);
    if (config_.checkpoint_every > 0 && step_ % config_.checkpoint_every == 0) {
      checkpoint = save_checkpoint();
      checkpoint_step = step_;
    }
  }
  // Every rank saves (ZeRO-1 gathers the moments); not twice for one step.
  if (checkpoint_step != step_) checkpoint = save_checkpoint();
  // The other ranks' peaks are final now; the chief's own is read again after the export.
  std::vector<float> growth = whole_run_peak_growth();
  if (!is_chief()) return;
  progress.finish();
  fmt::print(stderr, "waited for data {:.2f}% of the training time\n",
             100.0 * (data_.wait_seconds() - wait_before) / std::max(seconds_since(run_start), 1e-9));
  if (stopping) fmt::print(stderr, "stop requested at step {}: saved a checkpoint\n", step_);
  export_model(config_.out_dir / "export");
  fmt::print(stderr, "checkpoint {} ; model exported to {}\n", checkpoint.string(), (config_.out_dir / "export").string());
  report_whole_run_peaks(std::move(growth));
}

std::vector<float> Trainer::whole_run_peak_growth() {
  const auto mine = static_cast<float>(static_cast<double>(peak_rss_bytes() - rss_at_start_) / (1 << 20));
  std::vector<float> growth(static_cast<size_t>(communicator_.size()));
  // One sum per rank (each rank contributes its own entry): a handful of floats once a run.
  for (int rank = 0; rank < communicator_.size(); ++rank) {
    growth[static_cast<size_t>(rank)] = job_sum(rank == communicator_.rank() ? mine : 0.0f);
  }
  return growth;
}

void Trainer::report_whole_run_peaks(std::vector<float> growth) {
  growth[0] = static_cast<float>(static_cast<double>(peak_rss_bytes() - rss_at_start_) / (1 << 20));
  if (growth.size() == 1) {
    fmt::print(stderr, "memory: whole run (start-up, steps, checkpoints, export), peak RSS grew {:.1f} MiB "
               "(`paraflow plan` predicts it)\n", growth[0]);
    return;
  }
  const auto largest = std::max_element(growth.begin(), growth.end());
  std::string ranks;
  for (size_t rank = 0; rank < growth.size(); ++rank) ranks += fmt::format("{}{}: {:.1f}", rank ? ", " : "", rank, growth[rank]);
  fmt::print(stderr, "memory: whole run (start-up, steps, checkpoints, export), peak RSS grew {:.1f} MiB on rank {}, "
             "the most of {} ranks (`paraflow plan --ranks {}` predicts each rank's); by rank (MiB): {}\n", *largest,
             largest - growth.begin(), growth.size(), growth.size(), ranks);
}

void Trainer::report_peak_growth(int64_t rss_before) {
  const auto grown = static_cast<float>(static_cast<double>(peak_rss_bytes() - rss_before) / (1 << 20));
  // job_max returns one rank's own value, so exactly the largest rank(s) compare equal to it.
  const float largest = job_max(grown);
  const auto rank = static_cast<int>(job_max(grown == largest ? static_cast<float>(communicator_.rank()) : -1.0f));
  if (!is_chief()) return;
  if (communicator_.size() == 1) {
    fmt::print(stderr, "memory: peak RSS grew {:.1f} MiB over the first two steps (`paraflow plan` predicts it)\n",
               largest);
    return;
  }
  // (A rank that held more at start-up than a step needs, as a partitioned run's chief holding the
  // whole model does, grows less than its step allocates.)
  fmt::print(stderr, "memory: peak RSS grew {:.1f} MiB over the first two steps on rank {}, the most of {} ranks "
             "(`paraflow plan --ranks {}` predicts a step's allocations per rank)\n", largest, rank,
             communicator_.size(), communicator_.size());
}

int64_t peak_rss_bytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;
}

dist::Communicator& local_communicator() {
  static std::unique_ptr<dist::Communicator> communicator = dist::make_local_communicator();
  return *communicator;
}

DType gemm_dtype(graph::PrecisionPolicy policy, const Backend& backend) {
  const DType storage = graph::storage_dtype(policy);
  return graph::op_def(graph::OpKind::matmul).runs_in(backend, storage) ? storage : DType::f32;
}

double measure_peak_flops(Backend& backend, int64_t n, DType dtype) {
  Tensor a = backend.empty(Shape{n, n}, dtype), b = backend.empty(Shape{n, n}, dtype);
  Tensor c = backend.empty(Shape{n, n}, DType::f32);
  auto product = [&] {
    backend.launch(MatmulForward{.out = c, .inp = a, .weight = b});
    backend.synchronize();
  };
  product();  // warm-up
  // The best of at least five products and half a second: on a shared machine a shorter window
  // can fall entirely in a slow moment, and MFU would then read above 100%.
  double best = 1e30;
  const auto begin = std::chrono::steady_clock::now();
  for (int repeat = 0; repeat < 5 || seconds_since(begin) < 0.5; ++repeat) {
    auto start = std::chrono::steady_clock::now();
    product();
    best = std::min(best, seconds_since(start));
  }
  return 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n) / best;
}

}  // namespace paraflow::train
