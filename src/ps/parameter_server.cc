#include "ps/parameter_server.h"

#include <fmt/format.h>

#include <array>
#include <cstring>
#include <map>
#include <mutex>
#include <set>

#include "base/system_memory.h"
#include "model/parameters.h"
#include "ps/parameter_server.grpc.pb.h"
#include "ps/wire.h"
#include "train/optimizer.h"
#include "train/trainer.h"

namespace paraflow::ps {

namespace {

grpc::Status refuse(grpc::StatusCode code, const std::string& message) { return grpc::Status(code, message); }

// What a loaded element costs a ps task: its value, gradient and two moments.
constexpr int64_t kBytesPerElement = 4 * sizeof(float);

// An asynchronous push whose chunks are still coming: its gradients so far.
struct PartialPush {
  std::vector<float> gradients;  // the whole shard's
  int64_t progress = 0;          // elements received
  int64_t version = 0;           // the oldest its chunks were computed on
  int64_t started = 0;           // the order pushes started in: the oldest is dropped first
};

// The shard as the chief last loaded it, and the step in progress.
struct Shard {
  uint64_t generation = 0;  // 0: nothing loaded yet
  bool synchronous = true;
  int slices = 1;
  int workers = 1;
  int64_t max_staleness = 0;
  model::ParameterSet parameters, gradients;  // one spec per piece, in piece order
  std::unique_ptr<train::AdamW> optimizer;
  int64_t version = 0;
  // Synchronous: each slice's gradients kept apart and summed in slice order, so the result does
  // not depend on which worker pushed first (slice 0's are the sum's start: `gradients`, the
  // others' each a buffer of their own). A slice comes in chunks, in order; `progress`: its
  // elements received so far. A complete slice ignores repeats (a rescheduled step: same values).
  std::vector<std::vector<float>> slice_gradients;
  std::vector<int64_t> progress;
  std::vector<bool> received;
  bool reduced = false;
  double squares = 0;  // of the last reduced sum
  std::set<int64_t> applied_closures;  // asynchronous
  // Asynchronous pushes in chunks, by closure: at most one per worker (a push of a worker that
  // failed halfway is dropped when a new one would exceed that).
  std::map<int64_t, PartialPush> partial_pushes;
  int64_t pushes_started = 0;
  int64_t stale_pushes = 0;
  int64_t bytes_received = 0, bytes_sent = 0;
  // Each piece's elements filled so far, by field; the pieces not filled yet (nothing but Fill is
  // answered until every piece is).
  std::vector<std::array<int64_t, 3>> filled;
  int64_t unfilled = 0;

  int64_t elements() const { return parameters.numel(); }
  size_t pieces() const { return filled.size(); }
  bool piece_filled(size_t piece) const {
    const int64_t count = parameters.at(piece).numel();
    return filled[piece][0] == count && filled[piece][1] == count && filled[piece][2] == count;
  }
  float* values(Field field) {
    switch (field) {
      case FIRST_MOMENT: return optimizer->first_moment().data<float>();
      case SECOND_MOMENT: return optimizer->second_moment().data<float>();
      default: return parameters.flat().data<float>();
    }
  }
};

class ParameterServerService final : public ParameterServer::Service {
 public:
  ParameterServerService(const ChannelSecurity& security, int64_t max_message_bytes, Backend& backend,
                         std::string cluster, int64_t rss_before)
      : security_(security), chunk_(chunk_elements(max_message_bytes)), backend_(backend), cluster_(std::move(cluster)),
        rss_before_(rss_before) {}

  grpc::Status Load(grpc::ServerContext* context, const LoadRequest* request, LoadReply*) override {
    if (auto status = security_.authenticate(*context); !status.ok()) return status;
    if (request->generation() == 0 || request->pieces().empty() || request->version() < 0 ||
        request->optimizer_steps() < 0 || request->slices() < 1 || request->slices() > 65536 ||
        request->max_staleness() < 0) {
      return refuse(grpc::StatusCode::INVALID_ARGUMENT, "Load: generation, pieces, version, slices or "
                    "max_staleness out of range");
    }
    // Sizes first, against the memory there is: a forged count must not allocate anything.
    int64_t total = 0;
    const int64_t limit = available_memory_bytes() / kBytesPerElement;
    for (const auto& piece : request->pieces()) {
      if (piece.count() <= 0 || piece.offset() < 0 || piece.count() > limit - total) {
        return refuse(grpc::StatusCode::INVALID_ARGUMENT, fmt::format("Load: piece '{}' has offset {} and count {}",
                                                                      piece.tensor(), piece.offset(), piece.count()));
      }
      total += piece.count();
    }
    auto shard = std::make_unique<Shard>();
    std::vector<model::TensorSpec> specs;
    for (const auto& piece : request->pieces()) {
      specs.push_back({piece.tensor(), Shape{piece.count()}, model::Init::zeros, piece.weight_decay()});
    }
    shard->parameters = model::ParameterSet(specs, backend_);
    shard->gradients = model::ParameterSet(specs, backend_);
    const OptimizerSettings& settings = request->optimizer();
    train::AdamWConfig adamw{settings.beta1(), settings.beta2(), settings.eps(), settings.weight_decay(), 0.0};
    shard->optimizer = std::make_unique<train::AdamW>(adamw, shard->parameters, backend_);
    shard->filled.assign(specs.size(), {0, 0, 0});
    shard->unfilled = static_cast<int64_t>(specs.size());
    shard->optimizer->set_steps_taken(request->optimizer_steps());
    shard->generation = request->generation();
    shard->synchronous = request->synchronous();
    shard->slices = request->synchronous() ? request->slices() : 1;
    shard->workers = request->slices();
    shard->max_staleness = request->max_staleness();
    shard->version = request->version();
    shard->slice_gradients.resize(static_cast<size_t>(shard->slices));
    shard->progress.assign(static_cast<size_t>(shard->slices), 0);
    shard->received.assign(static_cast<size_t>(shard->slices), false);
    std::lock_guard<std::mutex> lock(mutex_);
    shard->bytes_received = shard_ ? shard_->bytes_received : 0;
    shard->bytes_sent = shard_ ? shard_->bytes_sent : 0;
    shard->bytes_received += static_cast<int64_t>(request->ByteSizeLong());
    shard_ = std::move(shard);
    return grpc::Status::OK;
  }

  grpc::Status Fill(grpc::ServerContext* context, const FillRequest* request, FillReply*) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto status = check_call(*context, request->generation(), "Fill", /*needs_values=*/false); !status.ok()) {
      return status;
    }
    Shard& shard = *shard_;
    const size_t bytes = request->values().size();
    // (Bytes that are not whole floats count as none: refused below.)
    const auto count = bytes % sizeof(float) == 0 ? static_cast<int64_t>(bytes / sizeof(float)) : 0;
    if (auto status = check_piece_range(shard, "Fill", request->piece(), request->field(), request->offset(), count);
        !status.ok()) {
      return status;
    }
    const auto piece = static_cast<size_t>(request->piece());
    int64_t& progress = shard.filled[piece][static_cast<size_t>(request->field())];
    if (request->offset() != 0 && request->offset() != progress) {
      return refuse(grpc::StatusCode::FAILED_PRECONDITION,
                    fmt::format("Fill: {} bytes of piece {} ('{}') {} at element {}, but its next chunk starts at {}",
                                bytes, piece, shard.parameters.specs()[piece].name, Field_Name(request->field()),
                                request->offset(), progress));
    }
    const bool was_filled = shard.piece_filled(piece);
    std::memcpy(shard.values(request->field()) + shard.parameters.offset_of(piece) + request->offset(),
                request->values().data(), bytes);
    progress = request->offset() + count;  // a chunk at 0 fills the field again
    shard.unfilled += static_cast<int64_t>(was_filled) - static_cast<int64_t>(shard.piece_filled(piece));
    shard.bytes_received += static_cast<int64_t>(request->ByteSizeLong());
    return grpc::Status::OK;
  }

  grpc::Status Pull(grpc::ServerContext* context, const PullRequest* request, PullReply* reply) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto status = check_call(*context, request->generation(), "Pull"); !status.ok()) return status;
    if (request->version() >= 0 && request->version() != shard_->version) {
      return refuse(grpc::StatusCode::FAILED_PRECONDITION,
                    fmt::format("Pull: the step needs version {}, this shard is at {}", request->version(),
                                shard_->version));
    }
    const int64_t elements = shard_->elements(), count = request->count();
    if (request->offset() < 0 || request->offset() >= elements || count <= 0 || count > elements - request->offset() ||
        count > chunk_) {
      return refuse(grpc::StatusCode::INVALID_ARGUMENT, fmt::format("Pull: elements [{}, {} + {}) of a shard of {} "
                    "(at most {} a message)", request->offset(), request->offset(), count, elements, chunk_));
    }
    reply->set_version(shard_->version);
    reply->set_parameters(to_bytes(shard_->parameters.flat().data<float>() + request->offset(), count));
    shard_->bytes_sent += static_cast<int64_t>(reply->parameters().size());
    return grpc::Status::OK;
  }

  grpc::Status Push(grpc::ServerContext* context, const PushRequest* request, PushReply* reply) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto status = check_call(*context, request->generation(), "Push"); !status.ok()) return status;
    Shard& shard = *shard_;
    const int64_t elements = shard.elements();
    const size_t bytes = request->gradients().size();
    const auto count = static_cast<int64_t>(bytes / sizeof(float));
    if (bytes % sizeof(float) != 0 || count == 0 || request->offset() < 0 || count > elements - request->offset()) {
      return refuse(grpc::StatusCode::INVALID_ARGUMENT, fmt::format("Push: {} bytes of gradients at element {} where "
                    "this shard's {} float32 values ({} bytes) belong", bytes, request->offset(), elements,
                    elements * static_cast<int64_t>(sizeof(float))));
    }
    shard.bytes_received += static_cast<int64_t>(bytes);
    reply->set_version(shard.version);
    if (shard.synchronous) {
      if (request->version() != shard.version || request->slice() < 0 || request->slice() >= shard.slices) {
        return refuse(grpc::StatusCode::FAILED_PRECONDITION,
                      fmt::format("Push: slice {} of step {}, but this shard takes slices 0..{} of step {}",
                                  request->slice(), request->version(), shard.slices - 1, shard.version));
      }
      const auto slice = static_cast<size_t>(request->slice());
      reply->set_applied(true);
      if (shard.received[slice]) return grpc::Status::OK;
      if (request->offset() != 0 && request->offset() != shard.progress[slice]) {
        return refuse(grpc::StatusCode::FAILED_PRECONDITION,
                      fmt::format("Push: a chunk of slice {} at element {}, but the slice's next chunk starts at {}",
                                  slice, request->offset(), shard.progress[slice]));
      }
      std::vector<float>& buffer = shard.slice_gradients[slice];
      if (slice > 0) buffer.resize(static_cast<size_t>(elements));
      float* values = slice == 0 ? shard.gradients.flat().data<float>() : buffer.data();
      std::memcpy(values + request->offset(), request->gradients().data(), bytes);
      shard.progress[slice] = request->offset() + count;
      shard.received[slice] = shard.progress[slice] == elements;
      return grpc::Status::OK;
    }
    // (A closure is a step's id: never negative, and far from int64's end, where the window
    // below, closure - 2^16, would overflow.)
    if (request->version() < 0 || request->version() > shard.version || !std::isfinite(request->lr()) ||
        !std::isfinite(request->grad_scale()) || request->closure() < 0 || request->closure() > (int64_t{1} << 62)) {
      return refuse(grpc::StatusCode::INVALID_ARGUMENT, fmt::format("Push: version {} (this shard is at {}), lr {}, "
                    "grad_scale {} or closure {} out of range", request->version(), shard.version, request->lr(),
                    request->grad_scale(), request->closure()));
    }
    if (shard.applied_closures.count(request->closure())) return grpc::Status::OK;  // a rescheduled step's repeat
    // The whole push: this chunk when it is all of it, else the chunks gathered so far.
    const float* gradients = reinterpret_cast<const float*>(request->gradients().data());
    int64_t computed_on = request->version();
    std::vector<float> gathered;
    if (request->offset() != 0 || count != elements) {
      auto partial = shard.partial_pushes.find(request->closure());
      if (request->offset() == 0) {
        if (partial == shard.partial_pushes.end()) partial = start_partial_push(shard, request->closure());
        partial->second.progress = 0;
        partial->second.version = request->version();
      } else if (partial == shard.partial_pushes.end() || request->offset() != partial->second.progress) {
        return refuse(grpc::StatusCode::FAILED_PRECONDITION,
                      fmt::format("Push: a chunk of step {} at element {}, but {}", request->closure(), request->offset(),
                                  partial == shard.partial_pushes.end()
                                      ? std::string("no push of it is in progress")
                                      : fmt::format("its next chunk starts at {}", partial->second.progress)));
      }
      PartialPush& push = partial->second;
      std::memcpy(push.gradients.data() + request->offset(), gradients, bytes);
      push.progress = request->offset() + count;
      push.version = std::min(push.version, request->version());
      if (push.progress < elements) return grpc::Status::OK;
      gathered = std::move(push.gradients);
      computed_on = push.version;
      shard.partial_pushes.erase(partial);
      gradients = gathered.data();
    }
    if (shard.version - computed_on > shard.max_staleness) {
      ++shard.stale_pushes;
      reply->set_stale(true);
      return grpc::Status::OK;
    }
    std::memcpy(shard.gradients.flat().data<float>(), gradients, static_cast<size_t>(elements) * sizeof(float));
    shard.optimizer->update(shard.parameters.flat(), shard.gradients.flat(), Tensor(), request->lr(),
                            request->grad_scale());
    shard.applied_closures.insert(request->closure());
    // A step is repeated only within the chief's window of steps: old ids need not be kept.
    shard.applied_closures.erase(shard.applied_closures.begin(),
                                 shard.applied_closures.lower_bound(request->closure() - (1 << 16)));
    reply->set_version(++shard.version);
    reply->set_applied(true);
    return grpc::Status::OK;
  }

  grpc::Status Reduce(grpc::ServerContext* context, const ReduceRequest* request, ReduceReply* reply) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto status = check_call(*context, request->generation(), "Reduce"); !status.ok()) return status;
    Shard& shard = *shard_;
    if (auto status = check_synchronous_step(shard, request->version(), "Reduce"); !status.ok()) return status;
    if (!shard.reduced) {
      std::vector<int> missing;
      for (int slice = 0; slice < shard.slices; ++slice) {
        if (!shard.received[static_cast<size_t>(slice)]) missing.push_back(slice);
      }
      if (!missing.empty()) {
        return refuse(grpc::StatusCode::FAILED_PRECONDITION,
                      fmt::format("Reduce: step {} lacks the gradients of slice(s) {}", shard.version,
                                  fmt::join(missing, ", ")));
      }
      float* sum = shard.gradients.flat().data<float>();  // slice 0's
      const size_t n = static_cast<size_t>(shard.elements());
      for (size_t slice = 1; slice < shard.slice_gradients.size(); ++slice) {
        const float* part = shard.slice_gradients[slice].data();
        for (size_t i = 0; i < n; ++i) sum[i] += part[i];
      }
      double squares = 0;
      backend_.launch(SumSquares{.x = shard.gradients.flat(), .result = &squares});
      shard.squares = squares;
      shard.reduced = true;
    }
    reply->set_squares(shard.squares);
    return grpc::Status::OK;
  }

  grpc::Status Apply(grpc::ServerContext* context, const ApplyRequest* request, ApplyReply* reply) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto status = check_call(*context, request->generation(), "Apply"); !status.ok()) return status;
    Shard& shard = *shard_;
    if (shard.synchronous && request->version() == shard.version - 1) {  // applied; the answer was lost
      reply->set_version(shard.version);
      return grpc::Status::OK;
    }
    if (auto status = check_synchronous_step(shard, request->version(), "Apply"); !status.ok()) return status;
    if (!shard.reduced || !std::isfinite(request->lr()) || !std::isfinite(request->grad_scale())) {
      return refuse(grpc::StatusCode::FAILED_PRECONDITION, fmt::format("Apply: step {} is not reduced, or lr {} / "
                    "grad_scale {} is not finite", shard.version, request->lr(), request->grad_scale()));
    }
    shard.optimizer->update(shard.parameters.flat(), shard.gradients.flat(), Tensor(), request->lr(),
                            request->grad_scale());
    shard.received.assign(shard.received.size(), false);
    shard.progress.assign(shard.progress.size(), 0);
    shard.reduced = false;
    reply->set_version(++shard.version);
    return grpc::Status::OK;
  }

  grpc::Status Snapshot(grpc::ServerContext* context, const SnapshotRequest* request, SnapshotReply* reply) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto status = check_call(*context, request->generation(), "Snapshot"); !status.ok()) return status;
    Shard& shard = *shard_;
    if (auto status = check_piece_range(shard, "Snapshot", request->piece(), request->field(), request->offset(),
                                        request->count());
        !status.ok()) {
      return status;
    }
    const auto piece = static_cast<size_t>(request->piece());
    reply->set_values(to_bytes(shard.values(request->field()) + shard.parameters.offset_of(piece) + request->offset(),
                               request->count()));
    reply->set_version(shard.version);
    reply->set_optimizer_steps(shard.optimizer->steps_taken());
    reply->set_stale_pushes(shard.stale_pushes);
    return grpc::Status::OK;
  }

  grpc::Status Status(grpc::ServerContext* context, const StatusRequest*, StatusReply* reply) override {
    if (auto status = security_.authenticate(*context); !status.ok()) return status;
    reply->set_cluster(cluster_);
    reply->set_peak_rss_grown(train::peak_rss_bytes() - rss_before_);
    std::lock_guard<std::mutex> lock(mutex_);
    if (shard_) {
      reply->set_generation(shard_->generation);
      reply->set_version(shard_->version);
      reply->set_stale_pushes(shard_->stale_pushes);
      reply->set_bytes_received(shard_->bytes_received);
      reply->set_bytes_sent(shard_->bytes_sent);
    }
    return grpc::Status::OK;
  }

  grpc::Status Shutdown(grpc::ServerContext* context, const ShutdownRequest*, ShutdownReply*) override {
    if (auto status = security_.authenticate(*context); !status.ok()) return status;
    latch_.request();
    return grpc::Status::OK;
  }

  ShutdownLatch& latch() { return latch_; }

 private:
  // `needs_values`: refused while a streamed load has pieces left to fill.
  grpc::Status check_call(const grpc::ServerContext& context, uint64_t generation, const char* method,
                          bool needs_values = true) const {
    if (auto status = security_.authenticate(context); !status.ok()) return status;
    if (!shard_) {
      return refuse(grpc::StatusCode::FAILED_PRECONDITION, fmt::format("{}: this ps task holds nothing yet (it "
                    "started or restarted; the chief must load it)", method));
    }
    if (generation != shard_->generation) {
      return refuse(grpc::StatusCode::FAILED_PRECONDITION, fmt::format("{}: generation {} is not this shard's ({}): "
                    "the chief reloaded it", method, generation, shard_->generation));
    }
    if (needs_values && shard_->unfilled > 0) {
      return refuse(grpc::StatusCode::FAILED_PRECONDITION, fmt::format("{}: {} of this shard's {} pieces are not "
                    "filled yet (the chief is loading it)", method, shard_->unfilled, shard_->pieces()));
    }
    return grpc::Status::OK;
  }

  // Elements [offset, offset + count) of `field` of piece `piece`: at most a chunk, within the piece.
  grpc::Status check_piece_range(const Shard& shard, const char* method, int32_t piece, int field, int64_t offset,
                                 int64_t count) const {
    if (piece < 0 || static_cast<size_t>(piece) >= shard.pieces() || !Field_IsValid(field)) {
      return refuse(grpc::StatusCode::INVALID_ARGUMENT, fmt::format("{}: piece {} field {}, but this shard has pieces "
                    "0..{} of fields 0..2", method, piece, field, shard.pieces() - 1));
    }
    const int64_t elements = shard.parameters.at(static_cast<size_t>(piece)).numel();
    if (offset < 0 || count <= 0 || count > chunk_ || count > elements - offset) {
      return refuse(grpc::StatusCode::INVALID_ARGUMENT, fmt::format("{}: elements [{}, {} + {}) of piece {} ('{}'), "
                    "which holds {} values (at most {} a message)", method, offset, offset, count, piece,
                    shard.parameters.specs()[static_cast<size_t>(piece)].name, elements, chunk_));
    }
    return grpc::Status::OK;
  }

  // A new asynchronous push in chunks; when every worker has one already, the one started first
  // (its worker failed halfway: the chief hands its step to another) is dropped.
  static std::map<int64_t, PartialPush>::iterator start_partial_push(Shard& shard, int64_t closure) {
    if (static_cast<int64_t>(shard.partial_pushes.size()) >= shard.workers) {
      shard.partial_pushes.erase(std::min_element(shard.partial_pushes.begin(), shard.partial_pushes.end(),
                                                  [](const auto& a, const auto& b) {
                                                    return a.second.started < b.second.started;
                                                  }));
    }
    PartialPush push;
    push.gradients.resize(static_cast<size_t>(shard.elements()));
    push.started = shard.pushes_started++;
    return shard.partial_pushes.emplace(closure, std::move(push)).first;
  }

  static grpc::Status check_synchronous_step(const Shard& shard, int64_t version, const char* method) {
    if (!shard.synchronous || version != shard.version) {
      return refuse(grpc::StatusCode::FAILED_PRECONDITION, fmt::format("{}: step {}, but this shard is {} at "
                    "version {}", method, version, shard.synchronous ? "synchronous" : "asynchronous", shard.version));
    }
    return grpc::Status::OK;
  }

  const ChannelSecurity& security_;
  const int64_t chunk_;  // the most elements a message carries
  Backend& backend_;
  const std::string cluster_;
  const int64_t rss_before_;
  std::mutex mutex_;
  std::unique_ptr<Shard> shard_;
  ShutdownLatch latch_;
};

}  // namespace

struct ParameterServerTask::Impl {
  ChannelSecurity security;
  std::unique_ptr<ParameterServerService> service;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
};

ParameterServerTask::ParameterServerTask(const std::string& address, ChannelSecurity security,
                                         int64_t max_message_bytes, Backend& backend, std::string cluster,
                                         int64_t rss_before)
    : impl_(std::make_unique<Impl>()) {
  impl_->security = std::move(security);
  impl_->service =
      std::make_unique<ParameterServerService>(impl_->security, max_message_bytes, backend, std::move(cluster), rss_before);
  impl_->server = start_server(address, impl_->security, max_message_bytes, {impl_->service.get()}, &impl_->port);
}

ParameterServerTask::~ParameterServerTask() {
  impl_->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
}

int ParameterServerTask::port() const { return impl_->port; }

void ParameterServerTask::serve(const std::atomic<bool>* stop, std::chrono::milliseconds grace) { impl_->service->latch().wait(stop, grace); }

}  // namespace paraflow::ps
