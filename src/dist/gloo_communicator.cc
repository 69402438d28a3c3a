#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <string>
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

// What every group of a job shares: the chief's rendezvous (the server on rank 0) and this
// process's TCP device.
struct GlooConnection {
  std::unique_ptr<RendezvousServer> server;
  std::unique_ptr<RendezvousClient> client;
  std::unique_ptr<RendezvousStore> store;
  std::shared_ptr<gloo::transport::Device> device;
  std::string peers;  // the training group, for error messages
  std::chrono::milliseconds timeout;
};

class GlooCommunicator final : public Communicator {
 public:
  // Connects `rank` of `size` through `store` (the rendezvous, or a prefix of it for a split group).
  GlooCommunicator(std::shared_ptr<GlooConnection> connection, gloo::rendezvous::Store& store, int rank, int size)
      : connection_(std::move(connection)), timeout_(connection_->timeout), rank_(rank), size_(size) {
    try {
      context_ = std::make_shared<gloo::rendezvous::Context>(rank_, size_);
      context_->setTimeout(timeout_);
      context_->connectFullMesh(store, connection_->device);
    } catch (const gloo::Exception& e) {
      fail("gloo: rank {} could not connect to the training group ({}): {}", rank_, connection_->peers, e.what());
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
  void send_recv(const void* send_data, size_t send_bytes, int send_peer, void* recv_data, size_t recv_bytes,
                 int recv_peer) override {
    guarded("send_recv", [&] {
      auto outgoing = context_->createUnboundBuffer(const_cast<void*>(send_data), send_bytes);
      auto incoming = context_->createUnboundBuffer(recv_data, recv_bytes);
      incoming->recv(recv_peer, kPointToPointSlot);
      outgoing->send(send_peer, kPointToPointSlot);
      outgoing->waitSend(timeout_);
      incoming->waitRecv(timeout_);
    });
  }
  // Every rank learns every rank's (color, key) through an all-gather; the members of this rank's
  // color then connect under a key prefix of their own in the chief's rendezvous.
  std::unique_ptr<Communicator> split(int color, int key) override {
    const float mine[2] = {static_cast<float>(color), static_cast<float>(key)};
    std::vector<float> all(2 * static_cast<size_t>(size_));
    all_gather(mine, all.data(), 2);
    std::vector<std::pair<float, int>> members;  // (key, rank) of this color
    for (int r = 0; r < size_; ++r) {
      if (all[2 * static_cast<size_t>(r)] == mine[0]) members.push_back({all[2 * static_cast<size_t>(r) + 1], r});
    }
    std::sort(members.begin(), members.end());
    int new_rank = 0;
    while (members[static_cast<size_t>(new_rank)].second != rank_) ++new_rank;
    const std::string prefix = fmt::format("{}/split{}/color{}", prefix_, splits_++, color);
    gloo::rendezvous::PrefixStore store(prefix, *connection_->store);
    auto group = std::make_unique<GlooCommunicator>(connection_, store, new_rank, static_cast<int>(members.size()));
    group->prefix_ = prefix;
    return group;
  }
  void barrier() override { barrier_within(timeout_); }
  void barrier_within(std::chrono::milliseconds limit) override {
    guarded("barrier", [&] {
      gloo::BarrierOptions options(context_);
      options.setTimeout(std::max(limit, timeout_));
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

  // Gloo's I/O failures are gloo::Exception; its checks (GLOO_ENFORCE) throw EnforceNotMet, which
  // is not one. (A check that fails on Gloo's own I/O thread, such as a message longer than the
  // receiver expects, aborts the process; the trainer checks first that every rank runs the same settings.)
  template <typename F>
  void guarded(const char* what, F&& body) {
    try {
      body();
    } catch (const gloo::Exception& e) {
      failed(what, "a peer died or timed out", e);
    } catch (const gloo::EnforceNotMet& e) {
      failed(what, "a check failed", e);
    }
  }
  [[noreturn]] void failed(const char* what, const char* why, const std::exception& e) const {
    throw Error(fmt::format("gloo {} on rank {} of {} failed ({}; timeout {} ms): {}", what, rank_, size_, why,
                            timeout_.count(), e.what()));
  }

  std::shared_ptr<GlooConnection> connection_;
  std::chrono::milliseconds timeout_;
  int rank_ = 0, size_ = 1;
  std::shared_ptr<gloo::rendezvous::Context> context_;
  std::string prefix_ = "world";  // this group's keys in the rendezvous
  int splits_ = 0;                // groups split from this one so far (the same count on every rank)
};

// A task of the training group, as TF_CONFIG lists it.
struct TrainingTask {
  std::string job;
  size_t index;
  std::string address;
};

std::vector<TrainingTask> training_tasks(const ClusterSpec& spec) {
  std::vector<TrainingTask> tasks;
  for (const char* job : {"chief", "worker"}) {
    if (!spec.jobs.count(job)) continue;
    for (size_t i = 0; i < spec.jobs.at(job).size(); ++i) tasks.push_back({job, i, spec.jobs.at(job)[i]});
  }
  return tasks;
}

// Whether `host`'s first address (the one Gloo binds) is a loopback one: 127.0.0.0/8 or ::1.
// A name that does not resolve (yet) is not.
bool resolves_to_loopback(const std::string& host) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0 || found == nullptr) return false;
  bool loopback = false;
  if (found->ai_family == AF_INET) {
    loopback = (ntohl(reinterpret_cast<const sockaddr_in*>(found->ai_addr)->sin_addr.s_addr) >> 24) == 127;
  } else if (found->ai_family == AF_INET6) {
    loopback = IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6*>(found->ai_addr)->sin6_addr);
  }
  freeaddrinfo(found);
  return loopback;
}

// Gloo listens on (and tells its peers) the address this task's TF_CONFIG host resolves to. A
// loopback one in a job that spans hosts (Debian maps the machine's own name to 127.0.1.1 in
// /etc/hosts) would leave the other hosts failing to connect after the timeout: refused now.
void check_reachable_address(const ClusterSpec& spec) {
  const std::string host = split_host_port(spec.address(), "TF_CONFIG").first;
  if (!resolves_to_loopback(host)) return;
  for (const TrainingTask& peer : training_tasks(spec)) {
    if (resolves_to_loopback(split_host_port(peer.address, "TF_CONFIG").first)) continue;
    fail("TF_CONFIG: this task's host \"{}\" resolves to a loopback address, but the job spans other hosts ({} {} "
         "at {}), which could not reach it: give this task's routable address or a name that resolves to it "
         "(check /etc/hosts)", host, peer.job, peer.index, peer.address);
  }
}

}  // namespace

std::unique_ptr<Communicator> make_gloo_communicator(const ClusterSpec& spec, std::chrono::milliseconds timeout) {
  check_reachable_address(spec);
  auto connection = std::make_shared<GlooConnection>();
  connection->timeout = timeout;
  const int rank = spec.training_rank();
  for (const TrainingTask& task : training_tasks(spec)) {
    connection->peers += fmt::format("{}{}:{} at {}", connection->peers.empty() ? "" : ", ", task.job, task.index,
                                     task.address);
  }
  if (rank == 0) connection->server = std::make_unique<RendezvousServer>(split_host_port(spec.address(), "TF_CONFIG").second);
  connection->client = std::make_unique<RendezvousClient>(spec.chief_address(), timeout);
  connection->store = std::make_unique<RendezvousStore>(*connection->client, connection->peers);
  gloo::transport::tcp::attr attr;
  attr.hostname = split_host_port(spec.address(), "TF_CONFIG").first;
  try {
    connection->device = gloo::transport::tcp::CreateDevice(attr);
  } catch (const gloo::Exception& e) {
    fail("gloo: rank {} could not open a TCP device on {}: {}", rank, attr.hostname, e.what());
  }
  gloo::rendezvous::Store& store = *connection->store;
  return std::make_unique<GlooCommunicator>(std::move(connection), store, rank, spec.training_size());
}

}  // namespace paraflow::dist
