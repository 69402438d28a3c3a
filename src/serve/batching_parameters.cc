#include "serve/batching_parameters.h"

#include <sched.h>

#include <thread>

#include "base/error.h"
#include "base/file_io.h"
#include "serve/tf_serving_config.h"
#include "tensorflow_serving/servables/tensorflow/session_bundle_config.pb.h"

namespace paraflow::serve {

int64_t schedulable_cpus() {
  cpu_set_t cpus;
  if (sched_getaffinity(0, sizeof(cpus), &cpus) == 0) return CPU_COUNT(&cpus);
  return std::max(1u, std::thread::hardware_concurrency());
}

void validate(const BatchingOptions& options) {
  // The upper bounds are far past any useful setting; past them arithmetic on the values overflows.
  constexpr int64_t kMaxRows = int64_t{1} << 30, kMaxTimeoutMicros = int64_t{3600} * 1000 * 1000;
  check(options.max_batch_size >= 1, "max_batch_size: must be positive (got {})", options.max_batch_size);
  check(options.max_batch_size <= kMaxRows, "max_batch_size: must be at most {} (got {})", kMaxRows,
        options.max_batch_size);
  check(options.batch_timeout_micros >= 0, "batch_timeout_micros: must be non-negative (got {})",
        options.batch_timeout_micros);
  check(options.batch_timeout_micros <= kMaxTimeoutMicros, "batch_timeout_micros: must be at most {} (an hour; got {})",
        kMaxTimeoutMicros, options.batch_timeout_micros);
  check(options.max_enqueued_batches >= 1, "max_enqueued_batches: must be positive (got {})",
        options.max_enqueued_batches);
  check(options.num_batch_threads >= 1, "num_batch_threads: must be positive (got {})", options.num_batch_threads);
  const std::vector<int64_t>& allowed = options.allowed_batch_sizes;
  if (allowed.empty()) return;
  check(allowed[0] >= 1, "allowed_batch_sizes: entries must be positive (the first is {})", allowed[0]);
  for (size_t i = 1; i < allowed.size(); ++i) {
    check(allowed[i] > allowed[i - 1], "allowed_batch_sizes: entries must be increasing ({} follows {})", allowed[i],
          allowed[i - 1]);
  }
  check(allowed.back() == options.max_batch_size,
        "allowed_batch_sizes: the last entry must equal max_batch_size; it is {}, max_batch_size is {}", allowed.back(),
        options.max_batch_size);
}

BatchingOptions parse_batching_parameters(const std::string& text, const std::string& source) {
  tensorflow::serving::BatchingParameters parameters;
  parse_text_proto(text, source, parameters);
  check(!parameters.enable_large_batch_splitting().value(),
        "{}: enable_large_batch_splitting: not supported; a request's rows always run in one batch "
        "(a request may have up to max_batch_size rows)",
        source);
  BatchingOptions options;
  if (parameters.has_max_batch_size()) options.max_batch_size = parameters.max_batch_size().value();
  if (parameters.has_batch_timeout_micros()) options.batch_timeout_micros = parameters.batch_timeout_micros().value();
  if (parameters.has_max_enqueued_batches()) options.max_enqueued_batches = parameters.max_enqueued_batches().value();
  if (parameters.has_num_batch_threads()) options.num_batch_threads = parameters.num_batch_threads().value();
  if (parameters.has_thread_pool_name()) options.thread_pool_name = parameters.thread_pool_name().value();
  options.allowed_batch_sizes.assign(parameters.allowed_batch_sizes().begin(), parameters.allowed_batch_sizes().end());
  options.pad_variable_length_inputs = parameters.pad_variable_length_inputs();
  try {
    validate(options);
  } catch (const InputError& error) {
    fail("{}: {}", source, error.what());
  }
  return options;
}

BatchingOptions read_batching_parameters(const std::string& path) {
  return parse_batching_parameters(read_file(path), path);
}

}  // namespace paraflow::serve
