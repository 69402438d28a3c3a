#include "serve/predict.h"

#include <memory>
#include <mutex>

#include "base/error.h"

namespace paraflow::serve {

namespace {

// Why the rows stop before they are done (their client left, or their deadline passed);
// nullopt while they run on.
std::optional<PredictOutcome> stop_reason(const PredictInputs& inputs) {
  if (inputs.abandoned && inputs.abandoned->load()) {
    return PredictOutcome{.error = "the client went away before the answer", .failure = PredictFailure::unavailable};
  }
  if (inputs.deadline && std::chrono::steady_clock::now() >= *inputs.deadline) {
    return PredictOutcome{.error = "deadline exceeded: the answer was not ready within the request's time limit "
                                   "(--rest_api_timeout_in_ms)",
                          .failure = PredictFailure::deadline_exceeded};
  }
  return std::nullopt;
}

// The rows of one Predict call: each row's tokens, and `done` once the last row finishes.
class PredictCall {
 public:
  // `inputs`: the call's, its rows taken.
  PredictCall(size_t rows, std::function<void(PredictOutcome)> done, PredictInputs inputs)
      : done_(std::move(done)), inputs_(std::move(inputs)) {
    outcome_.output_ids.resize(rows);
    remaining_ = rows;
  }

  bool stopped() const { return stop_reason(inputs_).has_value(); }

  void add_token(size_t row, int32_t token) {
    std::lock_guard lock(mutex_);
    outcome_.output_ids[row].push_back(token);
  }

  void finish_row(size_t row, const infer::Outcome& outcome) {
    std::function<void(PredictOutcome)> done;
    PredictOutcome result;
    {
      std::lock_guard lock(mutex_);
      if (const std::optional<PredictOutcome> stop = stop_reason(inputs_); stop && outcome_.error.empty()) {
        outcome_.error = stop->error;
        outcome_.failure = stop->failure;
      }
      if (!outcome.error.empty() && outcome_.error.empty()) {
        outcome_.error = "row " + std::to_string(row) + ": " + outcome.error;
        outcome_.failure = outcome.cancelled ? PredictFailure::unavailable : PredictFailure::failed;
      }
      if (--remaining_ > 0) return;
      done.swap(done_);
      result = std::move(outcome_);
    }
    if (done) done(std::move(result));
  }

 private:
  std::mutex mutex_;
  size_t remaining_ = 0;
  PredictOutcome outcome_;
  std::function<void(PredictOutcome)> done_;
  PredictInputs inputs_;
};

class RowSink : public infer::RequestSink {
 public:
  RowSink(std::shared_ptr<PredictCall> call, size_t row) : call_(std::move(call)), row_(row) {}
  bool on_token(const infer::TokenEvent& event) override {
    if (call_->stopped()) return false;  // ends the row: its client is gone, or its time is up
    call_->add_token(row_, event.token);
    return true;
  }
  void on_finish(const infer::Outcome& outcome) override { call_->finish_row(row_, outcome); }

 private:
  std::shared_ptr<PredictCall> call_;
  size_t row_;
};

}  // namespace

void check_predict_inputs(const infer::Engine& engine, const PredictInputs& inputs) {
  const model::GptConfig& config = engine.config();
  const std::vector<std::vector<int32_t>>& rows = inputs.input_ids;
  check(!rows.empty(), "input_ids: needs at least one row");
  const int64_t at_once = engine.options().max_num_seqs + engine.options().max_waiting;
  check(static_cast<int64_t>(rows.size()) <= at_once,
        "input_ids: {} rows are more than this server runs at once ({} = --max-num-seqs {} + --max-waiting {}); "
        "send at most {} rows per call", rows.size(), at_once, engine.options().max_num_seqs,
        engine.options().max_waiting, at_once);
  for (size_t i = 1; i < rows.size(); ++i) {
    check(rows[i].size() == rows[0].size(), "input_ids: row {} has {} ids, row 0 has {}: a tensor's rows are equal",
          i, rows[i].size(), rows[0].size());
  }
  check(!rows[0].empty(), "input_ids: rows must hold at least one id");
  check(inputs.max_new_tokens >= 1, "max_new_tokens: must be at least 1 (got {})", inputs.max_new_tokens);
  check(inputs.temperature >= 0 && inputs.temperature <= 2, "temperature: must be in [0, 2] (got {})",
        inputs.temperature);
  check(inputs.max_new_tokens <= config.n_positions - static_cast<int64_t>(rows[0].size()),
        "max_new_tokens: {} ids per row plus max_new_tokens {} exceed the model's context of {} positions",
        rows[0].size(), inputs.max_new_tokens, config.n_positions);
  for (size_t row = 0; row < rows.size(); ++row) {
    for (size_t i = 0; i < rows[row].size(); ++i) {
      check(rows[row][i] >= 0 && rows[row][i] < config.vocab_size,
            "input_ids: id {} at [{}, {}] is outside the model's vocabulary of {} tokens", rows[row][i], row, i,
            config.vocab_size);
    }
  }
}

void start_predict(infer::Engine& engine, PredictInputs inputs, std::function<void(PredictOutcome)> done) {
  check_predict_inputs(engine, inputs);
  const std::vector<std::vector<int32_t>>& rows = inputs.input_ids;
  if (std::optional<PredictOutcome> stop = stop_reason(inputs)) {  // while the rows waited for a batch
    done(std::move(*stop));
    return;
  }
  auto call = std::make_shared<PredictCall>(rows.size(), std::move(done),
                                            PredictInputs{.abandoned = inputs.abandoned, .deadline = inputs.deadline});
  std::vector<uint64_t> submitted;
  try {
    for (size_t row = 0; row < rows.size(); ++row) {
      infer::Request request{.prompt = rows[row],
                             .max_tokens = inputs.max_new_tokens,
                             .sampling = {.temperature = inputs.temperature, .seed = inputs.seed + row}};
      submitted.push_back(engine.submit(std::move(request), std::make_shared<RowSink>(call, row)));
    }
  } catch (...) {
    for (uint64_t id : submitted) engine.cancel(id);
    throw;
  }
}

}  // namespace paraflow::serve
