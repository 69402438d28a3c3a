// TF Serving's dynamic batching (`--enable_batching`) for Predict, in front of the engine, with
// the semantics of TF Serving's batch scheduler (tensorflow/core/kernels/batching_util/
// shared_batch_scheduler.h, one queue):
//   - a request's rows are its size. It joins the open batch while that batch stays within
//     max_batch_size rows, else it closes that batch and opens a new one; a request of more than
//     max_batch_size rows is refused (InputError), as TF Serving does without batch splitting;
//   - the batches waiting, the open one included, are at most max_enqueued_batches: a request
//     that needs a new batch beyond that is refused at once (BatchQueueFull);
//   - up to num_batch_threads batches run at once. A free slot takes the oldest batch when it is
//     closed, full, or batch_timeout_micros have passed since its first request. Until a slot is
//     free, the open batch keeps taking requests (so a lone request waits batch_timeout_micros
//     when a slot is free, longer only while num_batch_threads batches are running).
// Running a batch submits the rows of all its requests to the engine together (start_predict for
// each request), so they share the engine's steps; the batch holds its slot until every row has
// finished. The engine runs rows of different lengths together: requests of any prompt length
// share a batch, and nothing is padded (serve/batching_parameters.h: allowed_batch_sizes,
// pad_variable_length_inputs).
//
// Metrics, in the registry given:
//   paraflow_predict_batch_size             histogram: rows per batch run
//   paraflow_predict_batch_padded_size      histogram: the allowed batch size TF Serving would have
//                                           padded each batch to (only with allowed_batch_sizes)
//   paraflow_predict_batch_wait_seconds     histogram: time from predict() to the request's batch run
//   paraflow_predict_batch_refused_total    counter by reason: too_large, queue_full
//   paraflow_predict_enqueued_batches       gauge: batches waiting, the open one included
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "base/error.h"
#include "base/metrics.h"
#include "infer/engine.h"
#include "serve/batching_parameters.h"
#include "serve/predict.h"

namespace paraflow::serve {

// Thrown by PredictBatcher::predict: max_enqueued_batches batches are waiting. TF Serving answers
// UNAVAILABLE: HTTP 503, gRPC UNAVAILABLE.
class BatchQueueFull : public Error {
 public:
  using Error::Error;
};

class PredictBatcher {
 public:
  // Validates `options` (InputError) and starts the scheduler thread. `engine` and `metrics` must
  // outlive the batcher.
  PredictBatcher(infer::Engine& engine, BatchingOptions options, MetricsRegistry& metrics);
  ~PredictBatcher();  // stop()
  PredictBatcher(const PredictBatcher&) = delete;
  PredictBatcher& operator=(const PredictBatcher&) = delete;

  // Queues a Predict. Throws before queueing: InputError for inputs that do not fit the model
  // (check_predict_inputs) or more rows than max_batch_size; BatchQueueFull; infer::Draining once
  // stop() has begun. Otherwise `done` is called exactly once: on the engine's thread when the
  // rows have finished, or on the batcher's thread with `error` set when the engine refused them
  // (QueueFull, Draining).
  void predict(PredictInputs inputs, std::function<void(PredictOutcome)> done);

  // Refuses new requests (infer::Draining) and runs the batches waiting without waiting for
  // their timeouts (still num_batch_threads at a time); returns at once.
  void stop_accepting();
  // stop_accepting(), then waits until every request's `done` has been called or `deadline`
  // passes; true when none is left.
  bool finish_until(std::chrono::steady_clock::time_point deadline);
  // finish_until() without a deadline, and the scheduler thread joined. Not to be called from a
  // `done` callback, nor from two threads at once.
  void stop();

 private:
  using Clock = std::chrono::steady_clock;
  struct Task {
    PredictInputs inputs;
    std::function<void(PredictOutcome)> done;
    Clock::time_point arrived;
  };
  struct Batch {
    std::vector<Task> tasks;
    int64_t rows = 0;
  };

  bool idle() const { return batches_.empty() && running_ == 0; }  // mutex_ held
  void schedule();  // the scheduler thread
  void run(Batch batch);
  void batch_finished();

  infer::Engine& engine_;
  const BatchingOptions options_;
  Histogram& batch_size_;
  Histogram* padded_size_;  // null without allowed_batch_sizes
  Histogram& wait_seconds_;
  Counter& refused_too_large_;
  Counter& refused_queue_full_;
  // Read by the gauge at scrape time, which may come after the batcher is gone.
  std::shared_ptr<std::atomic<int64_t>> enqueued_;

  std::mutex mutex_;
  std::condition_variable wake_;  // a request queued, a batch finished, stop()
  std::deque<Batch> batches_;     // waiting, oldest first; the last one is open
  int64_t running_ = 0;           // batches submitted whose rows have not all finished
  bool stopping_ = false;
  std::thread scheduler_;
};

}  // namespace paraflow::serve
