// The serving engine: continuous (iteration-level) batching over a paged KV cache. Requests are
// queued from any thread; one engine thread runs steps that each admit waiting requests while KV
// blocks last, run bounded prefill chunks together with one decode token of every running
// sequence in a single forward pass, and stream each new token to its request's sink.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "infer/generator.h"
#include "infer/sampler.h"
#include "model/gpt_config.h"
#include "model/parameters.h"
#include "base/metrics.h"

namespace paraflow::infer {

struct EngineOptions {
  double kv_cache_gb = 0.5;         // memory for the pool of KV blocks (all layers, keys and values)
  int64_t block_size = 16;          // tokens per KV block
  int64_t max_num_seqs = 64;        // sequences running at once
  // Tokens per step at most: decode tokens plus prefill chunks; 0: max(128, max_num_seqs). A step
  // with no sequence decoding (prompts only) may fill it: bigger chunks read the weights fewer times.
  int64_t max_batched_tokens = 0;
  // Tokens per step at most while any sequence is decoding (never fewer than the sequences
  // running: each decodes a token every step); 0: min(32, max_batched_tokens). A step's time grows
  // with its tokens once the matmuls are bound by arithmetic (a few dozen rows on a CPU), and every
  // decoding stream waits for the whole step: this budget holds inter-token latency near a
  // single stream's, at some throughput, and prompts wait longer for their first token instead.
  int64_t max_decoding_step_tokens = 0;
  int64_t max_waiting = 1024;       // queued requests beyond this are refused (QueueFull)
  DType weights = DType::f32;       // f32, bf16 where the backend multiplies bf16, or f16 (model::use_weights_for_decoding)
  // Keys and values: f32, or bf16 (half the bytes, twice the blocks; exact for bf16 weights,
  // whose keys and values are bf16 values already).
  DType kv_cache_dtype = DType::f32;
  int threads = 0;                  // OpenMP threads for the engine thread's compute; 0: OpenMP's default
  // Time each step's ops (graph::Executor's profiling: the backend is synchronised around every
  // node, so steps run a little slower) and its host work; read with Engine::profile().
  bool profile = false;
};

struct Request {
  std::vector<int32_t> prompt;      // at least one token; prompt + max_tokens <= n_positions
  int64_t max_tokens = 16;          // >= 1
  infer::SamplingConfig sampling;   // greedy when temperature is 0; `seed` makes sampling reproducible
  int64_t top_logprobs = -1;        // -1: no log-probabilities; 0: the chosen token's; n (<= 20): plus the n likeliest
  // Also score the prompt: each prompt token after the first gets its log-probability given
  // the ones before it (and top_logprobs alternatives, which must then be >= 0), through
  // RequestSink::on_prompt_token, before any generated token. Such a request computes its whole
  // prompt (no shared prefix blocks).
  bool prompt_logprobs = false;
  std::vector<int32_t> stop_tokens; // finish (reason stop) when one is generated; it is streamed, then the request ends
};

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0;
};

struct TokenEvent {
  int32_t token = 0;
  float logprob = 0;                  // log-softmax of the raw logits (when requested)
  std::vector<TokenLogprob> top;      // the likeliest tokens, most likely first (when requested)
};

struct Outcome {
  infer::FinishReason reason = infer::FinishReason::length;
  bool cancelled = false;  // cancel() or a drain ran out of time; `error` says which
  std::string error;       // non-empty when the request failed or was cancelled
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;
  int64_t cached_prompt_tokens = 0;  // prompt tokens whose KV came from shared prefix blocks
};

// Implemented by a front end. Called on the engine's thread: keep the work short (post to your
// own executor). on_token returning false ends the request with reason `stop` (a stop string,
// a client gone). on_finish is called exactly once, last.
class RequestSink {
 public:
  virtual ~RequestSink() = default;
  // Request::prompt_logprobs: prompt tokens 1, 2, ... in order, each once (a preempted request's
  // prompt, computed again, is not scored again).
  virtual void on_prompt_token(const TokenEvent& event) { (void)event; }
  virtual bool on_token(const TokenEvent& event) = 0;
  virtual void on_finish(const Outcome& outcome) = 0;
};

// Thrown by submit(): the waiting queue is full (HTTP 429 / 503), or the engine is draining.
class QueueFull : public Error {
 public:
  using Error::Error;
};
class Draining : public Error {
 public:
  using Error::Error;
};

struct EngineStats {
  int64_t running = 0;
  int64_t waiting = 0;
  int64_t blocks_total = 0;
  int64_t blocks_free = 0;  // includes cached prefix blocks no sequence holds (reclaimable)
  int64_t blocks_cached = 0;
  int64_t steps = 0;
  int64_t preemptions = 0;
  int64_t prompt_tokens = 0;     // prompt tokens computed
  int64_t cached_prompt_tokens = 0;  // prompt tokens served from prefix blocks
  int64_t generated_tokens = 0;
};

class Engine {
 public:
  // Starts the engine thread. `parameters` must outlive the engine.
  Engine(const model::GptConfig& config, const model::ParameterSet& parameters, Backend& backend,
         const EngineOptions& options);
  ~Engine();  // cancels what is left and joins the engine thread
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Queues a request. Throws InputError for an invalid request (naming the field), QueueFull or
  // Draining. Returns an id for cancel().
  uint64_t submit(Request request, std::shared_ptr<RequestSink> sink);
  // Ends a request (its sink gets on_finish with cancelled = true); unknown or finished ids are ignored.
  void cancel(uint64_t id);
  // Stops accepting requests, lets running and waiting ones finish for up to `grace`, then cancels
  // the rest with an error saying the server is shutting down. Returns when none is left.
  void drain(std::chrono::milliseconds grace);

  EngineStats stats() const;
  // Seconds spent so far per op kind ("<op kind> forward"; "<node name> forward" for a node
  // marked profile_apart, as the head's "lm_head forward") and per timed part of a step's host
  // work ("step: ..."), summed over the steps (published after each); empty unless
  // EngineOptions::profile.
  std::map<std::string, double> profile() const;
  // Prometheus metrics the engine records (queue time, time to first token, inter-token latency,
  // end-to-end latency, batch size per step, token counters); the front end adds its own.
  MetricsRegistry& metrics();
  const model::GptConfig& config() const;
  const EngineOptions& options() const;  // as resolved: the token budgets never 0

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace paraflow::infer
