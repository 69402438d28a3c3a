// TF Serving's Predict on the serving engine, shared by the REST (`:predict`) and gRPC
// (PredictionService/Predict) front ends. The signature, as GetModelMetadata describes it:
//   inputs   input_ids       int32/int64 [batch, length]  the prompts, one per row
//            max_new_tokens  int32/int64 scalar, optional  tokens generated per row (default 16)
//            temperature     float scalar, optional        0 (the default) is greedy
//            seed            int64 scalar, optional        row i samples with seed + i
//   outputs  output_ids      int32 [batch, max_new_tokens] the generated tokens
// Every row runs as its own engine request, so the rows batch with each other and with
// everything else the engine runs; the end-of-text token does not stop a row (the output stays
// rectangular, as a tensor must).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "infer/engine.h"

namespace paraflow::serve {

struct PredictInputs {
  std::vector<std::vector<int32_t>> input_ids;  // rows of equal length
  int64_t max_new_tokens = 16;
  double temperature = 0;
  uint64_t seed = 0;
  // Set by the front end when its client has gone: rows not started are not run, running ones
  // stop at their next token, and `done` reports the request as cancelled.
  std::shared_ptr<const std::atomic<bool>> abandoned;
  // When the answer is due (REST's --rest_api_timeout_in_ms): past it, as for a client gone,
  // and `done` reports deadline_exceeded.
  std::optional<std::chrono::steady_clock::time_point> deadline;
};

// Why a Predict failed, for the status each API answers with.
enum class PredictFailure {
  none,
  queue_full,   // the engine's queue was full (retry later)
  unavailable,  // the server is shutting down (the rows were refused or cancelled), or the client left
  deadline_exceeded,  // the answer was not ready by the inputs' deadline
  failed,       // a row failed
};

struct PredictOutcome {
  std::vector<std::vector<int32_t>> output_ids;  // [batch][max_new_tokens] when `error` is empty
  std::string error;                             // a row failed or was cancelled
  PredictFailure failure = PredictFailure::none;
};

// Throws InputError naming the input ("input_ids", ...) when the inputs do not fit the model, or
// have more rows than the engine takes at once (--max-num-seqs running + --max-waiting queued:
// such a call could never run, where one that finds the queue busy is told to retry later).
void check_predict_inputs(const infer::Engine& engine, const PredictInputs& inputs);

// Checks the inputs (check_predict_inputs), submits the rows and calls `done` on the engine's
// thread once every row has finished. Throws what Engine::submit throws (QueueFull, Draining)
// before any row runs; rows already submitted are then cancelled.
void start_predict(infer::Engine& engine, PredictInputs inputs, std::function<void(PredictOutcome)> done);

}  // namespace paraflow::serve
