#include "ps/worker.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <mutex>

#include "base/clock.h"
#include "graph/executor.h"
#include "ps/parameter_server.grpc.pb.h"
#include "ps/wire.h"
#include "train/optimizer.h"
#include "train/trainer.h"
#include "train/training_graph.h"

namespace paraflow::ps {

void check_synchronous_batch(int64_t batch_size, int workers) {
  check(batch_size % workers == 0,
        "train.batch_size ({}) must be a multiple of the worker tasks ({}) in synchronous parameter-server mode",
        batch_size, workers);
}

namespace {

class WorkerService final : public Worker::Service {
 public:
  WorkerService(const model::GptConfig& model_config, const train::TrainConfig& config, train::BatchSource& data,
                Backend& backend, Placement placement, WorkerSettings settings)
      : config_(config), data_(data), backend_(backend), placement_(std::move(placement)),
        placement_digest_(placement_.digest()), settings_(std::move(settings)) {
    check_synchronous_batch(config_.batch_size, settings_.slices);
    train::check_tokens_fit(data_, model_config.vocab_size);
    const int64_t micro_batch = config_.batch_size / settings_.slices;
    graph_ = train::build_training_graph(model_config, micro_batch, config_.sequence_length, config_.recompute,
                                         config_.precision, backend_);
    parameters_ = model::ParameterSet(model::gpt_tensor_specs(model_config, config_.decay_embeddings), backend_);
    gradients_ = model::ParameterSet(parameters_.specs(), backend_);
    half_parameters_ =
        model::make_half_parameters(graph_, parameters_, backend_, graph::storage_dtype(config_.precision));
    executor_ = std::make_unique<graph::Executor>(graph_.graph, backend_);
    model::bind_parameters(*executor_, graph_, parameters_, &gradients_, &half_parameters_);
    // d(mean loss over the step's whole batch)/d(each position's loss): the ps sums the slices.
    loss_grad_ = backend_.empty(graph_.graph.value(graph_.losses).shape, DType::f32);
    const float weight = 1.0f / static_cast<float>(micro_batch * config_.sequence_length * settings_.slices);
    backend_.upload(std::vector<float>(static_cast<size_t>(loss_grad_.numel()), weight).data(), loss_grad_);
    executor_->bind(graph_.graph.value(graph_.losses).grad, loss_grad_);
    for (size_t task = 0; task < settings_.ps_addresses.size(); ++task) {
      ps_names_.push_back(peer_name("ps", task, settings_.ps_addresses[task]));
    }
    open_channels();
  }

  grpc::Status RunStep(grpc::ServerContext* context, const StepRequest* request, StepReply* reply) override {
    if (auto status = settings_.security.authenticate(*context); !status.ok()) return status;
    std::lock_guard<std::mutex> lock(step_mutex_);
    if (request->placement() != placement_digest_) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          fmt::format("the chief places the variables as {}, this worker as {}: every task must run "
                                      "the same model config with the same ps tasks", request->placement(),
                                      placement_digest_));
    }
    // First: another cluster is the cause of any difference below (the worker count sets the slices).
    if (const std::string difference = cluster_difference("worker " + settings_.address, settings_.cluster,
                                                          request->cluster());
        !difference.empty()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, difference);
    }
    if (request->synchronous() != settings_.synchronous || request->slices() != settings_.slices ||
        request->slice() < 0 || request->slice() >= request->slices() || request->batch_index() < 0) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          fmt::format("RunStep: {} slice {} of {} of batch {}, but this worker runs {} steps in {} "
                                      "slices (dist.ps_mode)", request->synchronous() ? "synchronous" : "asynchronous",
                                      request->slice(), request->slices(), request->batch_index(),
                                      settings_.synchronous ? "synchronous" : "asynchronous", settings_.slices));
    }
    try {
      run_step(*request, *reply);
    } catch (const PeerError& e) {
      // A ps task died: new channels for the next step (an old one would keep failing for as long
      // as gRPC's reconnect backoff lasts, after the task is back).
      if (e.unreachable()) open_channels();
      return grpc::Status(grpc::StatusCode::ABORTED, e.what());  // the chief recovers
    } catch (const std::exception& e) {
      return grpc::Status(grpc::StatusCode::INTERNAL, fmt::format("worker {}: {}", settings_.address, e.what()));
    }
    return grpc::Status::OK;
  }

  // The chief's pool polls Status before it hands a worker that missed a deadline steps again: a
  // worker still in its earlier step (a slow or hung ps call) says so, rather than taking a step
  // that would wait behind the old one and miss its deadline too.
  grpc::Status Status(grpc::ServerContext* context, const StatusRequest*, StatusReply* reply) override {
    if (auto status = settings_.security.authenticate(*context); !status.ok()) return status;
    std::unique_lock<std::mutex> idle(step_mutex_, std::try_to_lock);
    if (!idle.owns_lock()) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                          fmt::format("worker {}: still in an earlier step", settings_.address));
    }
    reply->set_peak_rss_grown(train::peak_rss_bytes() - settings_.rss_before);
    return grpc::Status::OK;
  }

  grpc::Status Shutdown(grpc::ServerContext* context, const ShutdownRequest*, ShutdownReply*) override {
    if (auto status = settings_.security.authenticate(*context); !status.ok()) return status;
    latch_.request();
    return grpc::Status::OK;
  }

  ShutdownLatch& latch() { return latch_; }

 private:
  void open_channels() {
    stubs_.clear();
    for (const std::string& address : settings_.ps_addresses) {
      stubs_.push_back(ParameterServer::NewStub(open_channel(address, settings_.security, settings_.max_message_bytes)));
    }
  }

  void run_step(const StepRequest& request, StepReply& reply) {
    const size_t tasks = stubs_.size();
    auto start = std::chrono::steady_clock::now();
    float* parameters = parameters_.flat().data<float>();
    // Each shard moves in chunks. Synchronously every chunk is of the step's version; an
    // asynchronous step takes each chunk as it is, and its push names the first chunk's version,
    // the oldest (the staleness bound then holds for every value it was computed on).
    const int64_t chunk = chunk_elements(settings_.max_message_bytes);
    std::vector<int64_t> versions = for_each_task(tasks, [&](size_t task) {
      const int64_t elements = placement_.shard_elements(task);
      int64_t version = 0;
      for (int64_t first = 0; first < elements; first += chunk) {
        PullRequest pull;
        pull.set_generation(request.generation());
        pull.set_version(request.synchronous() ? request.version() : -1);
        pull.set_offset(first);
        pull.set_count(std::min(chunk, elements - first));
        PullReply pulled = call_peer(ps_names_[task], "Pull", *stubs_[task], &ParameterServer::Stub::Pull, pull,
                                     settings_.timeout, settings_.security);
        scatter_range(pulled.parameters(), placement_.shards[task], first, parameters, ps_names_[task] + ": Pull");
        if (first == 0) version = pulled.version();
      }
      return version;
    });
    if (!half_parameters_.specs().empty()) half_parameters_.assign_converted(parameters_);
    reply.set_pull_seconds(seconds_since(start));
    reply.set_bytes_pulled(parameters_.numel() * static_cast<int64_t>(sizeof(float)));

    start = std::chrono::steady_clock::now();
    reply.set_loss(train::forward_batch(*executor_, graph_, data_,
                                        {request.batch_index(), config_.seed, false, request.slice(), request.slices()}));
    backend_.fill_zero(gradients_.flat());
    executor_->backward();
    float grad_scale = 1.0f;
    if (!request.synchronous()) {  // each step is an update of its own: clipped by its own norm
      double squares = 0;
      backend_.launch(SumSquares{.x = gradients_.flat(), .result = &squares});
      grad_scale = static_cast<float>(train::clip_factor(config_.adamw.grad_clip, std::sqrt(squares)));
    }
    reply.set_compute_seconds(seconds_since(start));

    start = std::chrono::steady_clock::now();
    const float* gradients = gradients_.flat().data<float>();
    std::vector<bool> stale = for_each_task(tasks, [&](size_t task) {
      const int64_t elements = placement_.shard_elements(task);
      bool refused = false;
      for (int64_t first = 0; first < elements; first += chunk) {
        PushRequest push;
        push.set_generation(request.generation());
        push.set_version(request.synchronous() ? request.version() : versions[task]);
        push.set_slice(request.slice());
        push.set_closure(request.batch_index());
        push.set_lr(request.lr());
        push.set_grad_scale(grad_scale);
        push.set_offset(first);
        push.set_gradients(gather_range(gradients, placement_.shards[task], first, std::min(chunk, elements - first)));
        refused = call_peer(ps_names_[task], "Push", *stubs_[task], &ParameterServer::Stub::Push, push,
                            settings_.timeout, settings_.security)
                      .stale();
      }
      return refused;
    });
    reply.set_push_seconds(seconds_since(start));
    reply.set_bytes_pushed(parameters_.numel() * static_cast<int64_t>(sizeof(float)));
    reply.set_stale_pushes(static_cast<int>(std::count(stale.begin(), stale.end(), true)));
  }

  const train::TrainConfig& config_;
  train::BatchSource& data_;
  Backend& backend_;
  Placement placement_;
  const std::string placement_digest_;
  WorkerSettings settings_;
  model::GptGraph graph_;
  model::ParameterSet parameters_, gradients_, half_parameters_;
  std::unique_ptr<graph::Executor> executor_;
  Tensor loss_grad_;
  std::vector<std::string> ps_names_;
  std::vector<std::unique_ptr<ParameterServer::Stub>> stubs_;
  std::mutex step_mutex_;
  ShutdownLatch latch_;
};

}  // namespace

struct WorkerTask::Impl {
  std::unique_ptr<WorkerService> service;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
};

WorkerTask::WorkerTask(const model::GptConfig& model_config, const train::TrainConfig& config,
                       train::BatchSource& data, Backend& backend, Placement placement, WorkerSettings settings)
    : impl_(std::make_unique<Impl>()) {
  const std::string address = settings.address;
  const ChannelSecurity security = settings.security;
  const int64_t max_message_bytes = settings.max_message_bytes;
  impl_->service = std::make_unique<WorkerService>(model_config, config, data, backend, std::move(placement),
                                                   std::move(settings));
  impl_->server = start_server(address, security, max_message_bytes, {impl_->service.get()}, &impl_->port);
}

WorkerTask::~WorkerTask() { impl_->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1)); }

int WorkerTask::port() const { return impl_->port; }

void WorkerTask::serve(const std::atomic<bool>* stop, std::chrono::milliseconds grace) { impl_->service->latch().wait(stop, grace); }

}  // namespace paraflow::ps
