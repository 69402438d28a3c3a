#include "serve/predict_batcher.h"

#include <pthread.h>

#include <algorithm>

namespace paraflow::serve {

namespace {

// Powers of two below `max`, then `max`: the buckets of a histogram of batch sizes.
std::vector<double> size_buckets(int64_t max) {
  std::vector<double> bounds;
  for (int64_t size = 1; size < max; size *= 2) bounds.push_back(static_cast<double>(size));
  bounds.push_back(static_cast<double>(max));
  return bounds;
}

// Waits can be far below the latency buckets' first millisecond when batch_timeout_micros is 0.
std::vector<double> wait_buckets() {
  std::vector<double> bounds{0.0001, 0.00025, 0.0005};
  for (double bound : latency_buckets()) bounds.push_back(bound);
  return bounds;
}

Histogram* padded_size_histogram(const BatchingOptions& options, MetricsRegistry& metrics) {
  if (options.allowed_batch_sizes.empty()) return nullptr;
  return &metrics.histogram("paraflow_predict_batch_padded_size",
                            "The allowed batch size TF Serving would pad each batch to (nothing is padded here)",
                            {options.allowed_batch_sizes.begin(), options.allowed_batch_sizes.end()});
}

const BatchingOptions& validated(const BatchingOptions& options) {
  validate(options);
  return options;
}

}  // namespace

PredictBatcher::PredictBatcher(infer::Engine& engine, BatchingOptions options, MetricsRegistry& metrics)
    : engine_(engine),
      options_(validated(options)),
      batch_size_(metrics.histogram("paraflow_predict_batch_size", "Rows per Predict batch run",
                                    size_buckets(options_.max_batch_size))),
      padded_size_(padded_size_histogram(options_, metrics)),
      wait_seconds_(metrics.histogram("paraflow_predict_batch_wait_seconds",
                                      "Time a Predict waited in the batcher before its batch ran", wait_buckets())),
      refused_too_large_(metrics.counter("paraflow_predict_batch_refused_total", "Predicts the batcher refused",
                                         {{"reason", "too_large"}})),
      refused_queue_full_(metrics.counter("paraflow_predict_batch_refused_total", "Predicts the batcher refused",
                                          {{"reason", "queue_full"}})),
      enqueued_(std::make_shared<std::atomic<int64_t>>(0)) {
  metrics.gauge("paraflow_predict_enqueued_batches", "Predict batches waiting to run, the open one included",
                [enqueued = enqueued_] { return static_cast<double>(enqueued->load()); });
  scheduler_ = std::thread([this] { schedule(); });
  // Linux names threads with at most 15 characters.
  pthread_setname_np(scheduler_.native_handle(), options_.thread_pool_name.substr(0, 15).c_str());
}

PredictBatcher::~PredictBatcher() { stop(); }

void PredictBatcher::predict(PredictInputs inputs, std::function<void(PredictOutcome)> done) {
  check_predict_inputs(engine_, inputs);
  const auto rows = static_cast<int64_t>(inputs.input_ids.size());
  if (rows > options_.max_batch_size) {
    refused_too_large_.add();
    fail("input_ids: {} rows are more than the batch size limit, max_batch_size {}", rows, options_.max_batch_size);
  }
  std::lock_guard lock(mutex_);
  if (stopping_) throw infer::Draining("the server is shutting down and accepts no new requests");
  if (batches_.empty() || batches_.back().rows + rows > options_.max_batch_size) {
    if (static_cast<int64_t>(batches_.size()) >= options_.max_enqueued_batches) {
      refused_queue_full_.add();
      throw BatchQueueFull(fmt::format(
          "the batch queue is full: {} batches enqueued and max_enqueued_batches is {}; retry later", batches_.size(),
          options_.max_enqueued_batches));
    }
    batches_.emplace_back();
    enqueued_->store(static_cast<int64_t>(batches_.size()));
  }
  Batch& open = batches_.back();
  open.tasks.push_back({std::move(inputs), std::move(done), Clock::now()});
  open.rows += rows;
  wake_.notify_all();
}

void PredictBatcher::stop_accepting() {
  std::lock_guard lock(mutex_);
  stopping_ = true;
  wake_.notify_all();
}

bool PredictBatcher::finish_until(Clock::time_point deadline) {
  stop_accepting();
  std::unique_lock lock(mutex_);
  return wake_.wait_until(lock, deadline, [&] { return idle(); });
}

void PredictBatcher::stop() {
  stop_accepting();
  {
    std::unique_lock lock(mutex_);
    wake_.wait(lock, [&] { return idle(); });
  }
  if (scheduler_.joinable()) scheduler_.join();
}

void PredictBatcher::schedule() {
  const auto timeout = std::chrono::microseconds(options_.batch_timeout_micros);
  std::unique_lock lock(mutex_);
  while (!(stopping_ && batches_.empty())) {
    if (batches_.empty() || running_ >= options_.num_batch_threads) {
      wake_.wait(lock);
      continue;
    }
    const Batch& oldest = batches_.front();
    const Clock::time_point due = oldest.tasks.front().arrived + timeout;
    const bool ready =
        batches_.size() > 1 || oldest.rows >= options_.max_batch_size || stopping_ || Clock::now() >= due;
    if (!ready) {
      wake_.wait_until(lock, due);
      continue;
    }
    Batch batch = std::move(batches_.front());
    batches_.pop_front();
    enqueued_->store(static_cast<int64_t>(batches_.size()));
    ++running_;
    lock.unlock();
    run(std::move(batch));
    lock.lock();
  }
}

void PredictBatcher::run(Batch batch) {
  const Clock::time_point now = Clock::now();
  batch_size_.observe(static_cast<double>(batch.rows));
  if (padded_size_) {
    const std::vector<int64_t>& allowed = options_.allowed_batch_sizes;
    padded_size_->observe(static_cast<double>(*std::lower_bound(allowed.begin(), allowed.end(), batch.rows)));
  }
  auto remaining = std::make_shared<std::atomic<size_t>>(batch.tasks.size());
  for (Task& task : batch.tasks) {
    wait_seconds_.observe(std::chrono::duration<double>(now - task.arrived).count());
    auto finish = [this, remaining, done = std::move(task.done)](PredictOutcome outcome) {
      done(std::move(outcome));
      if (remaining->fetch_sub(1) == 1) batch_finished();
    };
    // The engine refused the rows; start_predict drops its `done`.
    try {
      start_predict(engine_, std::move(task.inputs), finish);
    } catch (const infer::QueueFull& error) {
      finish(PredictOutcome{.error = error.what(), .failure = PredictFailure::queue_full});
    } catch (const infer::Draining& error) {
      finish(PredictOutcome{.error = error.what(), .failure = PredictFailure::unavailable});
    } catch (const std::exception& error) {
      finish(PredictOutcome{.error = error.what(), .failure = PredictFailure::failed});
    }
  }
}

void PredictBatcher::batch_finished() {
  // Notified under the lock: stop() may destroy the batcher as soon as it sees the last batch end.
  std::lock_guard lock(mutex_);
  --running_;
  wake_.notify_all();
}

}  // namespace paraflow::serve
