#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "base/error.h"
#include "dist/communicator.h"
#include "dist/rendezvous.h"

namespace paraflow::dist {

namespace {

// Gloo's view of the chief's rendezvous.
class RendezvousStore final : public gloo::rendezvous::Store {
 public:
  RendezvousStore(RendezvousClient& client, std::string peers) : client_(client), peers_(std::move(peers)) {}
  void set(const std::string& key, const std::vector<char>& data) override { client_.set(key, data); }
  std::vector<char> get(const std::string& key) override {
    try {
      return client_.get(key);
    } catch (const Error& e) {
      throw InputError(fmt::format("{}; training group: {}", e.what(), peers_));
    }
  }
  void wait(const std::vector<std::string>& keys) override {
    for (const auto& key : keys) get(key);
  }

 private:
  RendezvousClient& client_;
  std::string peers_;
};

template <typename T>
void sum(void* out, const void* a, const void* b, size_t n) {
  T* o = static_cast<T*>(out);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) o[i] = x[i] + y[i];
}

template <typename T>
void maximum(void* out, const void* a, const void* b, size_t n) {
  T* o = static_cast<T*>(out);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) o[i] = x[i] > y[i] ? x[i] : y[i];
}

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(const ClusterSpec& spec, std::chrono::milliseconds timeout) : timeout_(timeout) {
    rank_ = spec.training_rank();
    size_ = spec.training_size();
    std::string peers;
    for (const char* job : {"chief", "worker"}) {
      if (!spec.jobs.count(job)) continue;
      for (size_t i = 0; i < spec.jobs.at(job).size(); ++i) {
        peers += fmt::format("{}{}:{} at {}", peers.empty() ? "" : ", ", job, i, spec.jobs.at(job)[i]);
      }
    }
    if (rank_ == 0) server_ = std::make_unique<RendezvousServer>(split_host_port(spec.address(), "TF_CONFIG").second);
    client_ = std::make_unique<RendezvousClient>(spec.chief_address(), timeout);
    store_ = std::make_unique<RendezvousStore>(*client_, peers);
    gloo::transport::tcp::attr attr;
    attr.hostname = split_host_port(spec.address(), "TF_CONFIG").first;
    try {
      device_ = gloo::transport::tcp::CreateDevice(attr);
      context_ = std::make_shared<gloo::rendezvous::Context>(rank_, size_);
      context_->setTimeout(timeout);
      context_->connectFullMesh(*store_, device_);
    } catch (const gloo::Exception& e) {
      fail("gloo: rank {} could not connect to the training group ({}): {}", rank_, peers, e.what());
    }
  }

  std::string name() const override { return "gloo"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_reduce_sum(float* data, size_t count) override { all_reduce(data, count, &sum<float>); }
  void all_reduce_max(float* data, size_t count) override { all_reduce(data, count, &maximum<float>); }
  void all_reduce_sum(int64_t* data, size_t count) override { all_reduce(data, count, &sum<int64_t>); }

  // Gloo's packaged version has no typed reduce-scatter with the new API: all-reduce, keep our chunk.
  void reduce_scatter_sum(const float* input, float* output, size_t count) override {
    std::vector<float> buffer(input, input + count * static_cast<size_t>(size_));
    all_reduce_sum(buffer.data(), buffer.size());
    std::memcpy(output, buffer.data() + count * static_cast<size_t>(rank_), count * sizeof(float));
  }
  void all_gather(const float* input, float* output, size_t count) override {
    guarded("allgather", [&] {
      gloo::AllgatherOptions options(context_);
      options.setInput(const_cast<float*>(input), count);
      options.setOutput(output, count * static_cast<size_t>(size_));
      options.setTimeout(timeout_);
      gloo::allgather(options);
    });
  }
  void broadcast(void* data, size_t bytes, int root) override {
    guarded("broadcast", [&] {
      gloo::BroadcastOptions options(context_);
      options.setOutput(static_cast<uint8_t*>(data), bytes);
      options.setRoot(root);
      options.setTimeout(timeout_);
      gloo::broadcast(options);
    });
  }
  void send(const void* data, size_t bytes, int peer) override {
    guarded("send", [&] {
      auto buffer = context_->createUnboundBuffer(const_cast<void*>(data), bytes);
      buffer->send(peer, kPointToPointSlot);
      buffer->waitSend(timeout_);
    });
  }
  void recv(void* data, size_t bytes, int peer) override {
    guarded("recv", [&] {
      auto buffer = context_->createUnboundBuffer(data, bytes);
      buffer->recv(peer, kPointToPointSlot);
      buffer->waitRecv(timeout_);
    });
  }
  void barrier() override {
    guarded("barrier", [&] {
      gloo::BarrierOptions options(context_);
      options.setTimeout(timeout_);
      gloo::barrier(options);
    });
  }
  [[noreturn]] void abort_job(int exit_status) override {
    std::fflush(stderr);
    std::_Exit(exit_status);
  }

 private:
  static constexpr uint64_t kPointToPointSlot = 0x7061726100ull;

  template <typename T>
  void all_reduce(T* data, size_t count, void (*fn)(void*, const void*, const void*, size_t)) {
    guarded("allreduce", [&] {
      gloo::AllreduceOptions options(context_);
      options.setOutput(data, count);
      options.setReduceFunction(fn);
      options.setTimeout(timeout_);
      gloo::allreduce(options);
    });
  }

  template <typename F>
  void guarded(const char* what, F&& body) {
    try {
      body();
    } catch (const gloo::Exception& e) {
      throw Error(fmt::format("gloo {} on rank {} of {} failed (a peer died or timed out after {} ms): {}", what,
                              rank_, size_, timeout_.count(), e.what()));
    }
  }

  std::chrono::milliseconds timeout_;
  int rank_ = 0, size_ = 1;
  std::unique_ptr<RendezvousServer> server_;
  std::unique_ptr<RendezvousClient> client_;
  std::unique_ptr<RendezvousStore> store_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::rendezvous::Context> context_;
};

}  // namespace

std::unique_ptr<Communicator> make_gloo_communicator(const ClusterSpec& spec, std::chrono::milliseconds timeout) {
  return std::make_unique<GlooCommunicator>(spec, timeout);
}

}  // namespace paraflow::dist
