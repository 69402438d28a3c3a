#include "ps/worker_pool.h"

#include <fmt/format.h>

#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>

#include "ps/parameter_server.grpc.pb.h"

namespace paraflow::ps {

namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

struct WorkerPool::Impl {
  ChannelSecurity security;
  std::chrono::milliseconds timeout;
  std::vector<std::string> names, addresses;
  int64_t max_message_bytes = 0;
  std::vector<std::unique_ptr<Worker::Stub>> stubs;
  std::vector<std::thread> threads;

  std::mutex mutex;
  std::condition_variable changed;
  bool closing = false;
  std::deque<size_t> queue;  // indices into steps
  const std::vector<StepRequest>* steps = nullptr;
  std::vector<std::optional<StepReply>> replies;
  std::vector<int> timed_out;  // by step: how often it ran past its deadline
  size_t done = 0;
  int in_flight = 0;
  uint64_t round = 0;  // run() calls so far: a late answer from an earlier one is dropped
  std::vector<bool> down;
  std::optional<std::string> shard_failure, fatal;
  bool refused = false;  // `fatal` is a worker's refusal of the step (INVALID_ARGUMENT): bad input
  Clock::time_point last_progress = Clock::now();

  // A step pulls, computes and pushes, each of the worker's calls to a ps task bounded by the
  // timeout: the step's own deadline leaves room for all three, so a hung ps task is reported by
  // the worker (and the chief recovers) before the chief gives up on the worker.
  std::chrono::milliseconds step_deadline() const { return 3 * timeout; }

  void stop_threads() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      closing = true;
    }
    changed.notify_all();
    for (std::thread& thread : threads) {
      if (thread.joinable()) thread.join();
    }
  }

  void serve(size_t worker) {
    std::unique_lock<std::mutex> lock(mutex);
    while (true) {
      if (down[worker]) {
        // Poll it (outside the lock) until it answers again.
        lock.unlock();
        bool back = reachable(worker);
        if (!back) std::this_thread::sleep_for(std::chrono::milliseconds(200));
        lock.lock();
        if (back) {
          down[worker] = false;
          fmt::print(stderr, "{} answers again: it takes steps\n", names[worker]);
        }
        if (closing) return;
        continue;
      }
      changed.wait(lock, [&] { return closing || (!queue.empty() && !shard_failure && !fatal); });
      if (closing) return;
      const size_t index = queue.front();
      queue.pop_front();
      const StepRequest request = (*steps)[index];
      const uint64_t my_round = round;
      ++in_flight;
      lock.unlock();
      std::optional<StepReply> reply;
      std::optional<PeerError> error;
      try {
        reply = call_peer(names[worker], "RunStep", *stubs[worker], &Worker::Stub::RunStep, request, step_deadline(),
                          security);
      } catch (const PeerError& e) {
        error = e;
      }
      lock.lock();
      --in_flight;
      if (my_round != round) {
        changed.notify_all();
        continue;
      }
      if (reply) {
        replies[index] = std::move(*reply);
        ++done;
        last_progress = Clock::now();
      } else if (error->code() == grpc::StatusCode::UNAVAILABLE) {  // the worker is gone
        down[worker] = true;
        queue.push_front(index);
        fmt::print(stderr, "{} is unreachable ({}): batch {} slice {} goes to another worker\n", names[worker],
                   error->what(), request.batch_index(), request.slice());
      } else if (error->code() == grpc::StatusCode::DEADLINE_EXCEEDED && !timed_out[index]++) {
        // Hung, or cut off: once, the step goes to another worker and this one is polled.
        down[worker] = true;
        queue.push_front(index);
        fmt::print(stderr, "{} did not finish batch {} slice {} within {} ms: it goes to another worker\n",
                   names[worker], request.batch_index(), request.slice(), step_deadline().count());
      } else if (error->code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
        if (!fatal) {
          fatal = fmt::format("batch {} slice {} ran past {} ms on two workers (the last: {}): a step takes longer "
                              "than 3 x dist.timeout_seconds, or its workers hang", request.batch_index(),
                              request.slice(), step_deadline().count(), names[worker]);
        }
      } else if (error->code() == grpc::StatusCode::ABORTED || error->code() == grpc::StatusCode::FAILED_PRECONDITION) {
        if (!shard_failure) shard_failure = error->what();
      } else if (!fatal) {
        fatal = error->what();
        refused = error->code() == grpc::StatusCode::INVALID_ARGUMENT;
      }
      changed.notify_all();
    }
  }

  // Through a new channel, kept when it answers: an old one to a worker that died keeps failing
  // for as long as gRPC's reconnect backoff lasts, after the worker is back. Only the worker's
  // own thread calls it (and uses stubs[worker]), without the lock.
  bool reachable(size_t worker) {
    auto stub = Worker::NewStub(open_channel(addresses[worker], security, max_message_bytes));
    try {
      call_peer(names[worker], "Status", *stub, &Worker::Stub::Status, StatusRequest(),
                std::chrono::milliseconds(1000), security);
      stubs[worker] = std::move(stub);
      return true;
    } catch (const PeerError&) {
      return false;
    }
  }
};

WorkerPool::WorkerPool(const std::vector<std::string>& addresses, ChannelSecurity security,
                       std::chrono::milliseconds timeout, int64_t max_message_bytes)
    : impl_(std::make_unique<Impl>()) {
  impl_->security = std::move(security);
  impl_->timeout = timeout;
  impl_->down.assign(addresses.size(), false);
  impl_->addresses = addresses;
  impl_->max_message_bytes = max_message_bytes;
  for (size_t worker = 0; worker < addresses.size(); ++worker) {
    impl_->names.push_back(peer_name("worker", worker, addresses[worker]));
    impl_->stubs.push_back(Worker::NewStub(open_channel(addresses[worker], impl_->security, max_message_bytes)));
  }
  for (size_t worker = 0; worker < addresses.size(); ++worker) {
    impl_->threads.emplace_back([this, worker] { impl_->serve(worker); });
  }
}

WorkerPool::~WorkerPool() { impl_->stop_threads(); }

std::vector<StepReply> WorkerPool::run(const std::vector<StepRequest>& steps) {
  Impl& m = *impl_;
  std::unique_lock<std::mutex> lock(m.mutex);
  m.steps = &steps;
  ++m.round;
  m.replies.assign(steps.size(), std::nullopt);
  m.timed_out.assign(steps.size(), 0);
  m.done = 0;
  m.queue.clear();
  for (size_t index = 0; index < steps.size(); ++index) m.queue.push_back(index);
  m.shard_failure.reset();
  m.fatal.reset();
  m.refused = false;
  m.last_progress = Clock::now();
  m.changed.notify_all();
  auto all_down = [&] { return std::count(m.down.begin(), m.down.end(), false) == 0; };
  while (true) {
    m.changed.wait_for(lock, std::chrono::milliseconds(200));
    const bool failed = m.shard_failure || m.fatal;
    if (failed && m.in_flight == 0) break;
    if (!failed && m.done == steps.size()) break;
    if (!failed && all_down() && Clock::now() - m.last_progress > m.timeout) {
      m.fatal = fmt::format("no worker answered for {} ms: {}", m.timeout.count(), fmt::join(m.names, ", "));
      break;
    }
  }
  m.queue.clear();
  m.steps = nullptr;
  if (m.fatal && m.refused) throw InputError(*m.fatal);
  if (m.fatal) throw Error(*m.fatal);
  if (m.shard_failure) throw ShardFailure(*m.shard_failure);
  std::vector<StepReply> replies;
  for (auto& reply : m.replies) replies.push_back(std::move(*reply));
  return replies;
}

std::vector<int64_t> WorkerPool::peak_rss_grown() {
  const Impl& m = *impl_;
  return for_each_task(m.addresses.size(), [&](size_t worker) -> int64_t {
    // A channel of this call's own: the pool's threads may be replacing theirs.
    auto stub = Worker::NewStub(open_channel(m.addresses[worker], m.security, m.max_message_bytes));
    try {
      return call_peer(m.names[worker], "Status", *stub, &Worker::Stub::Status, StatusRequest(),
                       std::chrono::milliseconds(1000), m.security)
          .peak_rss_grown();
    } catch (const PeerError&) {
      return -1;
    }
  });
}

void WorkerPool::shut_down_workers(bool wait_for_starting) {
  impl_->stop_threads();  // the stubs are this call's from here on
  shut_down_tasks(impl_->names, impl_->stubs, &Worker::Stub::Shutdown, ShutdownRequest(), wait_for_starting,
                  impl_->timeout, impl_->security);
}

}  // namespace paraflow::ps
