// TF Serving's batching parameters for Predict: the file of `--enable_batching
// --batching_parameters_file=FILE`, a tensorflow.serving.BatchingParameters message in protobuf
// text format (serve/proto/tensorflow_serving/servables/tensorflow/session_bundle_config.proto), e.g.
//   max_batch_size { value: 32 }
//   batch_timeout_micros { value: 100000 }
//   num_batch_threads { value: 4 }
// Fields left out take TF Serving's defaults, those of its batch scheduler (tensorflow/core/kernels/
// batching_util/shared_batch_scheduler.h: SharedBatchScheduler::Options and QueueOptions, which
// TF Serving's bundle_factory_util.h GetQueueOptions / CreateBatchScheduler fill from the file).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace paraflow::serve {

// The number of CPUs this process may run on (its affinity mask): TF's port::MaxParallelism().
int64_t schedulable_cpus();

struct BatchingOptions {
  int64_t max_batch_size = 1000;       // QueueOptions::input_batch_size_limit
  int64_t batch_timeout_micros = 0;    // QueueOptions::batch_timeout_micros
  int64_t max_enqueued_batches = 10;   // QueueOptions::max_enqueued_batches
  int64_t num_batch_threads = schedulable_cpus();     // Options::num_batch_threads
  std::string thread_pool_name = "batch_threads";     // Options::thread_pool_name
  // Batch sizes TF Serving pads a batch up to (empty: none). The engine runs a batch of any size,
  // so nothing is padded: the batcher records the size TF Serving would have run.
  std::vector<int64_t> allowed_batch_sizes;
  // TF Serving pads inputs of different lengths to one shape so that they can batch together.
  // The engine runs rows of different lengths together as they are, so requests of any length
  // share batches whichever the value: it changes nothing here (read so that a server can log
  // the file's settings as they are).
  bool pad_variable_length_inputs = false;
};

// Throws InputError naming the field when a value is out of range, with TF Serving's rules:
// sizes, timeout and thread count in range; allowed_batch_sizes increasing, its last entry equal
// to max_batch_size.
void validate(const BatchingOptions& options);

// Parses BatchingParameters text (`source` names it in errors: "FILE:LINE:COLUMN: ..."), applies
// the defaults and validates. enable_large_batch_splitting is refused: a request's rows always
// run in one batch here (max_execution_batch_size, read by TF Serving only with splitting, is
// ignored as it does).
BatchingOptions parse_batching_parameters(const std::string& text, const std::string& source);
// The same for a file: IoError when it cannot be read.
BatchingOptions read_batching_parameters(const std::string& path);

}  // namespace paraflow::serve
