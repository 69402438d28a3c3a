#include "infer/engine.h"

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <numeric>
#include <omp.h>
#include <set>
#include <thread>
#include <unordered_set>

#include "graph/executor.h"
#include "infer/kv_blocks.h"
#include "model/gpt_graph.h"

namespace paraflow::infer {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

// One request's life in the engine: its tokens so far (prompt, then generated), how many of
// them have keys and values in its blocks, and its timing.
struct Sequence {
  uint64_t id = 0;
  Request request;
  std::shared_ptr<RequestSink> sink;
  Sampler sampler;
  std::vector<int32_t> tokens;
  std::vector<int32_t> blocks;     // block table: position p lives in blocks[p / block_size]
  std::vector<uint64_t> hashes;    // chained hash of each full block, as far as known
  int64_t computed = 0;            // tokens[0, computed) have their KV in `blocks`
  int64_t generated = 0;
  int64_t cached_prompt_tokens = 0;
  int64_t prompt_scored = 1;       // prompt_logprobs: tokens[1, prompt_scored) have been scored
  Clock::time_point arrived, last_token;
  bool admitted = false;  // once: a preempted sequence is admitted again

  Sequence(uint64_t id, Request request, std::shared_ptr<RequestSink> sink)
      : id(id), request(std::move(request)), sink(std::move(sink)), sampler(this->request.sampling),
        tokens(this->request.prompt), arrived(Clock::now()) {}
  int64_t pending() const { return static_cast<int64_t>(tokens.size()) - computed; }
};

// A sequence's share of one step: `count` tokens from `first`; sampled when it reaches the end.
struct Chunk {
  Sequence* sequence;
  int64_t first;
  int64_t count;
  bool samples() const { return first + count == static_cast<int64_t>(sequence->tokens.size()); }
};

// Log-probabilities of the raw logits (OpenAI's logprobs): the chosen token's and the likeliest n.
void add_logprobs(const float* logits, int64_t vocab_size, int64_t top, TokenEvent& event) {
  const float max_logit = *std::max_element(logits, logits + vocab_size);
  double sum = 0;
  for (int64_t v = 0; v < vocab_size; ++v) sum += std::exp(static_cast<double>(logits[v] - max_logit));
  const double log_normalizer = max_logit + std::log(sum);
  event.logprob = static_cast<float>(logits[event.token] - log_normalizer);
  if (top <= 0) return;
  std::vector<int32_t> order(static_cast<size_t>(vocab_size));
  std::iota(order.begin(), order.end(), 0);
  const auto n = static_cast<std::ptrdiff_t>(std::min(top, vocab_size));
  std::partial_sort(order.begin(), order.begin() + n, order.end(),
                    [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
  for (std::ptrdiff_t i = 0; i < n; ++i) {
    event.top.push_back({order[static_cast<size_t>(i)], static_cast<float>(logits[order[static_cast<size_t>(i)]] - log_normalizer)});
  }
}

}  // namespace

struct Engine::Impl {
  Impl(const model::GptConfig& config, const model::ParameterSet& parameters, Backend& backend,
       const EngineOptions& options);

  void loop();
  // Moves submitted requests in and applies cancellations; false when the engine is stopping and idle.
  bool collect();
  void schedule(std::vector<Chunk>& batch);
  // Blocks for `count` more tokens of `sequence` (a private copy of a shared block it writes into
  // included), preempting later-admitted running sequences if it may and must.
  bool reserve_blocks(Sequence& sequence, int64_t count, bool may_preempt = true);
  std::optional<int32_t> take_block(const Sequence& sequence, bool may_preempt);
  void copy_on_write(Sequence& sequence, size_t index);
  void match_prefix(Sequence& sequence);
  void preempt(Sequence& sequence);
  void run(const std::vector<Chunk>& batch);
  // The logits of `rows` rows of the decoder's hidden state (at most max_num_seqs), at `logits`.
  void head_forward(const std::vector<int64_t>& rows);
  void score_prompts(const std::vector<Chunk>& batch);
  // Streams `token`, chosen by the sequence's sampler from `row` (its row of the step's logits).
  void emit(Sequence& sequence, const float* row, int32_t token);
  void finish(Sequence& sequence, const Outcome& outcome);
  void finish_by_id(uint64_t id, const std::string& error);
  void release_blocks(Sequence& sequence);
  void publish_full_blocks(Sequence& sequence);
  void update_stats();
  // With EngineOptions::profile: adds the time since `since` to the host work `part`, and
  // restarts `since`; publish_profile() copies the ops' and host times for Engine::profile().
  void time_host(const char* part, Clock::time_point& since);
  void publish_profile();
  EngineStats stats_snapshot() const {
    std::lock_guard lock(mutex);
    return stats;
  }

  const model::GptConfig& config;
  const model::ParameterSet& parameters;
  Backend& backend;
  EngineOptions options;
  int64_t max_blocks_per_sequence;
  KvBlockPool pool;
  // What decoding reads beside `parameters` (model::decoding_copy): the 16-bit or quantized
  // weights, or in f32 those stored in another layout; either way the linear layers' weights
  // [out, in], interleaved or tiled where the backend prefers it (model::StoredLayouts).
  model::ParameterSet decoding_parameters;
  model::GptGraph decoder_graph, head_graph;
  std::unique_ptr<graph::Executor> decoder, head;
  std::vector<std::pair<Tensor, Tensor>> pools;  // per layer (keys, values)
  // One step's logit rows: the head's output itself where the host can read it, else a copy.
  const float* logits = nullptr;
  std::vector<float> logits_copy;
  // run()'s sampling: the sequences that sample this step (null: finished already), their tokens
  // and failures; kept across steps (no allocation per token).
  std::vector<Sequence*> sampling;
  std::vector<int32_t> sampled_tokens;
  std::vector<std::exception_ptr> sampling_errors;
  std::map<std::string, double> host_profile;    // the engine thread's (EngineOptions::profile)

  // Owned by the engine thread.
  std::deque<std::unique_ptr<Sequence>> waiting;
  std::vector<std::unique_ptr<Sequence>> running;  // in admission order

  // Shared with other threads, under `mutex`.
  mutable std::mutex mutex;
  std::condition_variable wake, idle;
  std::deque<std::unique_ptr<Sequence>> incoming;
  std::unordered_set<uint64_t> live;       // submitted and not yet finished
  std::vector<std::pair<uint64_t, std::string>> cancels;
  uint64_t next_id = 1;
  int64_t steps = 0;  // forward passes run (the engine thread's; copied into stats)
  std::map<std::string, double> profile;  // publish_profile()'s copy
  int64_t queued_at_update = 0;  // incoming.size() when stats were last updated (counted in stats.waiting)
  bool draining = false, stopping = false;
  EngineStats stats;
  std::thread thread;

  MetricsRegistry metrics;
  Histogram &queue_time, &time_to_first_token, &inter_token_latency, &request_latency, &batch_tokens;
  Counter &prompt_tokens_total, &cached_prompt_tokens_total, &generated_tokens_total, &preemptions_total, &finished_total;
};

namespace {

int64_t pool_blocks(const model::GptConfig& config, const EngineOptions& options) {
  const double bytes_per_block = 2.0 * static_cast<double>(config.n_layer * config.kv_width() * options.block_size) *
                                 static_cast<double>(dtype_size(options.kv_cache_dtype));
  return static_cast<int64_t>(options.kv_cache_gb * 1024 * 1024 * 1024 / bytes_per_block);
}

EngineOptions with_token_budgets(EngineOptions options) {
  if (options.max_batched_tokens == 0) options.max_batched_tokens = std::max<int64_t>(128, options.max_num_seqs);
  if (options.max_decoding_step_tokens == 0) {
    options.max_decoding_step_tokens = std::min<int64_t>(32, options.max_batched_tokens);
  }
  return options;
}

std::vector<double> size_buckets() { return {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048}; }

}  // namespace

Engine::Impl::Impl(const model::GptConfig& config, const model::ParameterSet& parameters, Backend& backend,
                   const EngineOptions& options_in)
    : config(config),
      parameters(parameters),
      backend(backend),
      options(with_token_budgets(options_in)),
      max_blocks_per_sequence((config.n_positions + options.block_size - 1) / std::max<int64_t>(options.block_size, 1)),
      pool(std::max<int64_t>(pool_blocks(config, options), 1), std::max<int64_t>(options.block_size, 1)),
      queue_time(metrics.histogram("paraflow_request_queue_seconds", "Time from arrival to the first scheduled step",
                                   latency_buckets())),
      time_to_first_token(metrics.histogram("paraflow_time_to_first_token_seconds",
                                            "Time from arrival to the first generated token", latency_buckets())),
      inter_token_latency(metrics.histogram("paraflow_inter_token_latency_seconds",
                                            "Time between consecutive generated tokens of a request", latency_buckets())),
      request_latency(metrics.histogram("paraflow_request_latency_seconds", "Time from arrival to the last token",
                                        latency_buckets())),
      batch_tokens(metrics.histogram("paraflow_batch_tokens", "Tokens (prefill and decode) per engine step",
                                     size_buckets())),
      prompt_tokens_total(metrics.counter("paraflow_prompt_tokens_total", "Prompt tokens computed (prefix cache hits excluded)")),
      cached_prompt_tokens_total(metrics.counter("paraflow_prompt_tokens_cached_total",
                                                 "Prompt tokens whose keys and values came from shared prefix blocks")),
      generated_tokens_total(metrics.counter("paraflow_generation_tokens_total", "Tokens generated")),
      preemptions_total(metrics.counter("paraflow_preemptions_total", "Sequences preempted (recomputed later) for KV blocks")),
      finished_total(metrics.counter("paraflow_requests_finished_total", "Requests finished, failed or cancelled")) {
  check(options.block_size >= 1, "block_size must be at least 1 (got {})", options.block_size);
  check(options.max_num_seqs >= 1, "max_num_seqs must be at least 1 (got {})", options.max_num_seqs);
  check(options.max_batched_tokens >= options.max_num_seqs,
        "max_batched_tokens ({}) must be at least max_num_seqs ({}): each running sequence decodes a token per step",
        options.max_batched_tokens, options.max_num_seqs);
  check(options.max_decoding_step_tokens >= 1 && options.max_decoding_step_tokens <= options.max_batched_tokens,
        "max_decoding_step_tokens ({}) must be between 1 and max_batched_tokens ({})", options.max_decoding_step_tokens,
        options.max_batched_tokens);
  check(options.max_waiting >= 0, "max_waiting must not be negative (got {})", options.max_waiting);
  check(pool.total() >= max_blocks_per_sequence,
        "kv_cache_gb {} holds {} blocks of {} tokens; one sequence of the model's context ({}) needs {}",
        options.kv_cache_gb, pool_blocks(config, options), options.block_size, config.n_positions,
        max_blocks_per_sequence);
  check(options.kv_cache_dtype == DType::f32 || options.kv_cache_dtype == DType::bf16,
        "kv_cache_dtype must be float32 or bfloat16 (got {})", dtype_name(options.kv_cache_dtype));
  decoder_graph = model::build_gpt_serving_decoder(config, options.max_batched_tokens, pool.total(), options.block_size,
                                                   options.kv_cache_dtype);
  // The weights' copy for decoding, as the generator makes it (model::use_weights_for_decoding).
  const bool half = options.weights != DType::f32;
  auto lay_out = [&](model::GptGraph& g) { return model::use_weights_for_decoding(g, backend, options.weights, &parameters); };
  model::StoredLayouts layouts = lay_out(decoder_graph);
  head_graph = model::build_gpt_serving_head(config, options.max_num_seqs,
                                             decoder_graph.graph.value(decoder_graph.hidden).dtype);
  // The two graphs read one copy of each weight, so a weight both read needs one layout in both
  // (in f32 the decoder's embedding and the head share wte; with 16-bit weights the head's 16-bit
  // wte is its own, the embedding reading the f32 table).
  const model::StoredLayouts head_layouts = lay_out(head_graph);
  auto reads = [&](const model::GptGraph& g, const std::string& name) {
    return half ? g.half_parameters.count(name) > 0 : g.parameters.count(name) > 0;
  };
  using Names = std::set<std::string> model::StoredLayouts::*;
  const Names stored_for_decoding[] = {&model::StoredLayouts::interleaved, &model::StoredLayouts::tiled};
  auto check_agree = [&](const model::StoredLayouts& mine, const model::StoredLayouts& theirs,
                         const model::GptGraph& other) {
    for (Names layout : stored_for_decoding) {
      for (const std::string& name : mine.*layout) {
        check(!reads(other, name) || (theirs.*layout).count(name),
              "engine: the decoder and the head would store {} in different layouts", name);
      }
    }
  };
  check_agree(layouts, head_layouts, head_graph);
  check_agree(head_layouts, layouts, decoder_graph);
  for (Names layout : {&model::StoredLayouts::transposed, &model::StoredLayouts::interleaved, &model::StoredLayouts::tiled}) {
    (layouts.*layout).insert((head_layouts.*layout).begin(), (head_layouts.*layout).end());
  }
  // With 16-bit or quantized weights, a copy of those the two graphs read in that type only.
  std::set<std::string> copied = model::half_parameter_names(decoder_graph);
  copied.merge(model::half_parameter_names(head_graph));
  decoding_parameters = model::decoding_copy(parameters, backend, options.weights, layouts, copied);
  decoder = std::make_unique<graph::Executor>(decoder_graph.graph, backend);
  head = std::make_unique<graph::Executor>(head_graph.graph, backend);
  model::bind_decoding_parameters(*decoder, decoder_graph, parameters, decoding_parameters);
  model::bind_decoding_parameters(*head, head_graph, parameters, decoding_parameters);
  const Shape pool_shape{pool.total(), config.kv_heads(), options.block_size, config.head_size()};
  for (const auto& [keys, values] : decoder_graph.caches) {
    pools.emplace_back(backend.empty(pool_shape, options.kv_cache_dtype), backend.empty(pool_shape, options.kv_cache_dtype));
    decoder->bind(keys, pools.back().first);
    decoder->bind(values, pools.back().second);
  }
  decoder->keep(decoder_graph.hidden);
  head->keep(head_graph.logits);
  decoder->memory_plan();
  head->memory_plan();
  decoder->set_profiling(options.profile);
  head->set_profiling(options.profile);
  if (!head->tensor(head_graph.logits).host_accessible()) {
    logits_copy.resize(static_cast<size_t>(options.max_num_seqs * config.vocab_size));
  }

  metrics.gauge("paraflow_requests_running", "Requests with a sequence in the running batch",
                [this] { return static_cast<double>(stats_snapshot().running); });
  metrics.gauge("paraflow_requests_waiting", "Requests queued for admission",
                [this] { return static_cast<double>(stats_snapshot().waiting); });
  metrics.gauge("paraflow_kv_blocks_total", "KV cache blocks in the pool",
                [this] { return static_cast<double>(stats_snapshot().blocks_total); });
  metrics.gauge("paraflow_kv_blocks_free", "KV cache blocks no sequence holds (cached prefixes included)",
                [this] { return static_cast<double>(stats_snapshot().blocks_free); });
  metrics.gauge("paraflow_kv_blocks_used", "KV cache blocks held by sequences", [this] {
    EngineStats s = stats_snapshot();
    return static_cast<double>(s.blocks_total - s.blocks_free);
  });
  update_stats();
  thread = std::thread([this] {
    if (options.threads > 0) omp_set_num_threads(options.threads);  // a per-thread setting in OpenMP
    loop();
  });
}

void Engine::Impl::loop() {
  while (collect()) {
    std::vector<Chunk> batch;
    try {
      Clock::time_point since = Clock::now();
      schedule(batch);
      time_host("step: scheduling", since);
      if (!batch.empty()) {
        run(batch);
        // The step's tokens went to the front end's threads (HTTP writes): let them run on this
        // core now, between steps, rather than preempt a compute thread in the next step, which
        // all of the step's threads would then wait for (when the compute threads take every core).
        std::this_thread::yield();
      }
      publish_profile();
    } catch (const std::exception& error) {
      // A failed step fails its requests, not the server: the running ones, which every step
      // (or its scheduling, when that failed) takes whole.
      const std::string message = std::string("engine step failed: ") + error.what();
      for (const auto& sequence : running) {
        if (sequence->sink) finish(*sequence, Outcome{.error = message});
      }
    }
    std::erase_if(running, [](const std::unique_ptr<Sequence>& sequence) { return !sequence->sink; });
    update_stats();
  }
}

bool Engine::Impl::collect() {
  std::vector<std::pair<uint64_t, std::string>> cancelled;
  {
    std::unique_lock lock(mutex);
    wake.wait(lock, [&] { return stopping || !incoming.empty() || !cancels.empty() || !running.empty() || !waiting.empty(); });
    while (!incoming.empty()) {
      waiting.push_back(std::move(incoming.front()));
      incoming.pop_front();
    }
    cancelled.swap(cancels);
  }
  for (const auto& [id, error] : cancelled) finish_by_id(id, error);
  std::erase_if(waiting, [](const std::unique_ptr<Sequence>& sequence) { return !sequence->sink; });
  std::erase_if(running, [](const std::unique_ptr<Sequence>& sequence) { return !sequence->sink; });
  update_stats();  // the requests moved to `waiting` count there now (submit's queue check reads them)
  std::lock_guard lock(mutex);
  return !(stopping && running.empty() && waiting.empty() && incoming.empty());
}

void Engine::Impl::finish_by_id(uint64_t id, const std::string& error) {
  for (auto& sequence : waiting) {
    if (sequence->id == id && sequence->sink) finish(*sequence, Outcome{.cancelled = true, .error = error});
  }
  for (auto& sequence : running) {
    if (sequence->id == id && sequence->sink) finish(*sequence, Outcome{.cancelled = true, .error = error});
  }
}

void Engine::Impl::schedule(std::vector<Chunk>& batch) {
  // A step that streams tokens keeps to the decoding budget; one of prompts alone may fill the graph.
  const bool decoding = std::any_of(running.begin(), running.end(), [](const auto& sequence) {
    return sequence->generated > 0;
  });
  int64_t budget = decoding ? std::max(options.max_decoding_step_tokens, static_cast<int64_t>(running.size()))
                            : options.max_batched_tokens;
  // Running sequences in admission order: a decode token each, or a prefill chunk that leaves
  // one token of budget for every sequence after it (decodes never wait behind a long prompt).
  for (size_t i = 0; i < running.size(); ++i) {
    Sequence& sequence = *running[i];
    const int64_t later = static_cast<int64_t>(running.size() - i - 1);
    const int64_t count = std::min(sequence.pending(), budget - later);
    if (!reserve_blocks(sequence, count)) {
      preempt(sequence);  // it was the last one left to give up blocks
      --i;
      continue;
    }
    batch.push_back(Chunk{&sequence, sequence.computed, count});
    budget -= count;
  }
  // Admit waiting requests, first come first served, while sequences, budget and blocks last.
  while (!waiting.empty() && budget > 0 && static_cast<int64_t>(running.size()) < options.max_num_seqs) {
    Sequence& sequence = *waiting.front();
    match_prefix(sequence);
    const int64_t count = std::min(sequence.pending(), budget);
    if (!reserve_blocks(sequence, count, /*may_preempt=*/false)) {
      release_blocks(sequence);
      sequence.computed = 0;
      break;
    }
    // Counted at the first admission only (a refused admission is tried again; a preempted
    // sequence is admitted again).
    if (!sequence.admitted) {
      sequence.cached_prompt_tokens = sequence.computed;
      cached_prompt_tokens_total.add(static_cast<double>(sequence.computed));
      queue_time.observe(seconds_between(sequence.arrived, Clock::now()));
    }
    sequence.admitted = true;
    batch.push_back(Chunk{&sequence, sequence.computed, count});
    budget -= count;
    running.push_back(std::move(waiting.front()));
    waiting.pop_front();
  }
  update_stats();  // admitted and preempted sequences, before the step runs
}

std::optional<int32_t> Engine::Impl::take_block(const Sequence& sequence, bool may_preempt) {
  while (true) {
    if (std::optional<int32_t> block = pool.allocate()) return block;
    if (!may_preempt || running.empty() || running.back().get() == &sequence) return std::nullopt;
    preempt(*running.back());
  }
}

bool Engine::Impl::reserve_blocks(Sequence& sequence, int64_t count, bool may_preempt) {
  const int64_t block_size = options.block_size;
  const auto first_written = static_cast<size_t>(sequence.computed / block_size);
  // A block another sequence holds, or one the prefix cache may hand out: its keys and values
  // must not change under a reader (the last prompt token is computed again into a cached block).
  if (first_written < sequence.blocks.size() && (pool.ref_count(sequence.blocks[first_written]) > 1 ||
                                                 pool.cached(sequence.blocks[first_written]))) {
    std::optional<int32_t> copy = take_block(sequence, may_preempt);
    if (!copy) return false;
    // Copy-on-write: the shared block's keys and values so far, then this sequence's own writes.
    const int64_t block_elements = config.kv_heads() * block_size * config.head_size();
    for (const auto& [keys, values] : pools) {
      for (const Tensor& tensor : {keys, values}) {
        backend.copy(tensor.slice_flat(sequence.blocks[first_written] * block_elements, block_elements),
                     tensor.slice_flat(*copy * block_elements, block_elements));
      }
    }
    pool.release(sequence.blocks[first_written]);
    sequence.blocks[first_written] = *copy;
    sequence.hashes.resize(std::min(sequence.hashes.size(), first_written));
  }
  const auto needed = static_cast<size_t>((sequence.computed + count + block_size - 1) / block_size);
  while (sequence.blocks.size() < needed) {
    std::optional<int32_t> block = take_block(sequence, may_preempt);
    if (!block) return false;
    sequence.blocks.push_back(*block);
  }
  return true;
}

void Engine::Impl::match_prefix(Sequence& sequence) {
  // A prompt to score is computed whole: its logits at every position are needed.
  if (!sequence.blocks.empty() || sequence.request.prompt_logprobs) return;
  const int64_t block_size = options.block_size;
  const int64_t full = static_cast<int64_t>(sequence.tokens.size()) / block_size;
  uint64_t hash = 0;
  for (int64_t b = 0; b < full; ++b) {
    const int32_t* tokens = sequence.tokens.data() + b * block_size;
    hash = pool.chain_hash(hash, tokens, block_size);
    std::optional<int32_t> block = pool.lookup(hash, tokens);
    if (!block) break;
    sequence.blocks.push_back(*block);
    sequence.hashes.push_back(hash);
  }
  // At least the last token is computed again: its logits choose the next token.
  sequence.computed = std::min<int64_t>(static_cast<int64_t>(sequence.blocks.size()) * block_size,
                                        static_cast<int64_t>(sequence.tokens.size()) - 1);
}

void Engine::Impl::preempt(Sequence& sequence) {
  release_blocks(sequence);
  sequence.computed = 0;
  preemptions_total.add();
  auto at = std::find_if(running.begin(), running.end(), [&](const auto& held) { return held.get() == &sequence; });
  waiting.push_front(std::move(*at));
  running.erase(at);
}

void Engine::Impl::release_blocks(Sequence& sequence) {
  for (int32_t block : sequence.blocks) pool.release(block);
  sequence.blocks.clear();
  sequence.hashes.clear();
}

void Engine::Impl::publish_full_blocks(Sequence& sequence) {
  const int64_t block_size = options.block_size;
  for (auto b = static_cast<int64_t>(sequence.hashes.size()); b < sequence.computed / block_size; ++b) {
    const int32_t* tokens = sequence.tokens.data() + b * block_size;
    const uint64_t hash = pool.chain_hash(b == 0 ? 0 : sequence.hashes.back(), tokens, block_size);
    sequence.hashes.push_back(hash);
    pool.publish(sequence.blocks[static_cast<size_t>(b)], hash, tokens);
  }
}

void Engine::Impl::time_host(const char* part, Clock::time_point& since) {
  if (!options.profile) return;
  const Clock::time_point now = Clock::now();
  host_profile[part] += seconds_between(since, now);
  since = now;
}

void Engine::Impl::publish_profile() {
  if (!options.profile) return;
  std::map<std::string, double> total = host_profile;
  for (const graph::Executor* executor : {decoder.get(), head.get()}) {
    for (const auto& [key, seconds] : executor->profile()) total[key] += seconds;
  }
  std::lock_guard lock(mutex);
  profile = std::move(total);
}

void Engine::Impl::run(const std::vector<Chunk>& batch) {
  Clock::time_point since = Clock::now();
  const int64_t capacity = options.max_batched_tokens, V = config.vocab_size;
  int64_t rows = 0;
  for (const Chunk& chunk : batch) rows += chunk.count;
  std::vector<int32_t> tokens(static_cast<size_t>(rows));
  int32_t* positions = decoder->tensor(decoder_graph.position).data<int32_t>();    // host memory
  int32_t* tables = decoder->tensor(decoder_graph.block_tables).data<int32_t>();  // host memory
  int64_t row = 0;
  for (const Chunk& chunk : batch) {
    const Sequence& sequence = *chunk.sequence;
    for (int64_t t = 0; t < chunk.count; ++t, ++row) {
      tokens[static_cast<size_t>(row)] = sequence.tokens[static_cast<size_t>(chunk.first + t)];
      positions[row] = static_cast<int32_t>(chunk.first + t);
      std::copy(sequence.blocks.begin(), sequence.blocks.end(), tables + row * max_blocks_per_sequence);
    }
  }
  ++steps;
  decoder->set_rows(capacity, rows);
  backend.upload(tokens.data(), decoder->tensor(decoder_graph.tokens).slice_flat(0, rows));
  time_host("step: batch setup", since);
  decoder->forward();
  batch_tokens.observe(static_cast<double>(rows));

  score_prompts(batch);
  // The hidden state of each sequence's last token of the step, where it samples, to the head.
  std::vector<int64_t> sampled_rows;
  row = 0;
  for (const Chunk& chunk : batch) {
    row += chunk.count;
    if (chunk.samples()) sampled_rows.push_back(row - 1);
  }
  if (!sampled_rows.empty()) head_forward(sampled_rows);
  since = Clock::now();
  for (const Chunk& chunk : batch) {
    if (!chunk.sequence->sink) continue;  // finished in score_prompts: its blocks are back in the pool
    chunk.sequence->computed += chunk.count;
    if (chunk.sequence->generated == 0) prompt_tokens_total.add(static_cast<double>(chunk.count));
    publish_full_blocks(*chunk.sequence);
  }
  // Each sampling sequence's next token, the rows shared among the threads (a sequence's sampler
  // is its own: the same token whatever thread draws it), then the tokens streamed in order; a
  // row that fails (overflowed logits) fails the step where its token would have been streamed.
  sampling.clear();
  for (const Chunk& chunk : batch) {
    if (!chunk.samples()) continue;  // (asked before emit adds the sequence's next token)
    sampling.push_back(chunk.sequence->sink ? chunk.sequence : nullptr);  // (a sink that failed on a prompt token has finished)
  }
  const auto samples = static_cast<int64_t>(sampling.size());
  sampled_tokens.resize(sampling.size());
  sampling_errors.assign(sampling.size(), nullptr);
#pragma omp parallel for schedule(dynamic, 1) if (samples > 1)
  for (int64_t i = 0; i < samples; ++i) {
    if (sampling[static_cast<size_t>(i)] == nullptr) continue;
    try {
      sampled_tokens[static_cast<size_t>(i)] = sampling[static_cast<size_t>(i)]->sampler.sample(logits + i * V, V);
    } catch (...) {
      sampling_errors[static_cast<size_t>(i)] = std::current_exception();
    }
  }
  for (int64_t i = 0; i < samples; ++i) {
    Sequence* sequence = sampling[static_cast<size_t>(i)];
    if (sequence == nullptr) continue;
    if (sampling_errors[static_cast<size_t>(i)]) std::rethrow_exception(sampling_errors[static_cast<size_t>(i)]);
    emit(*sequence, logits + i * V, sampled_tokens[static_cast<size_t>(i)]);
  }
  time_host("step: sampling and streaming", since);
}

void Engine::Impl::head_forward(const std::vector<int64_t>& rows) {
  const int64_t C = config.n_embd, count = static_cast<int64_t>(rows.size());
  const Tensor& hidden = decoder->tensor(decoder_graph.hidden);
  const Tensor& head_input = head->tensor(head_graph.hidden);
  for (int64_t i = 0; i < count; ++i) {
    backend.copy(hidden.slice_flat(rows[static_cast<size_t>(i)] * C, C), head_input.slice_flat(i * C, C));
  }
  head->set_rows(options.max_num_seqs, count);
  head->forward();
  const Tensor produced = head->tensor(head_graph.logits).slice_flat(0, count * config.vocab_size);
  if (produced.host_accessible()) {
    backend.synchronize();  // (download waits for the head's kernels itself)
    logits = produced.data<float>();
  } else {
    Clock::time_point since = Clock::now();
    backend.download(produced, logits_copy.data());
    time_host("step: logits download", since);
    logits = logits_copy.data();
  }
}

// Prompt tokens to score in this step: the logits at position p score prompt token p + 1. The
// head runs over them max_num_seqs rows at a time, before the step's sampling pass.
void Engine::Impl::score_prompts(const std::vector<Chunk>& batch) {
  struct Scored {
    Sequence* sequence;
    int64_t row;       // of the decoder's hidden state
    int64_t position;  // of the prompt token scored
  };
  std::vector<Scored> pending;
  int64_t row = 0;
  for (const Chunk& chunk : batch) {
    Sequence& sequence = *chunk.sequence;
    const auto prompt_length = static_cast<int64_t>(sequence.request.prompt.size());
    for (int64_t t = 0; t < chunk.count && sequence.request.prompt_logprobs; ++t) {
      const int64_t position = chunk.first + t + 1;
      if (position >= sequence.prompt_scored && position < prompt_length) pending.push_back({&sequence, row + t, position});
    }
    row += chunk.count;
  }
  for (size_t begin = 0; begin < pending.size(); begin += static_cast<size_t>(options.max_num_seqs)) {
    const size_t end = std::min(pending.size(), begin + static_cast<size_t>(options.max_num_seqs));
    std::vector<int64_t> rows;
    for (size_t i = begin; i < end; ++i) rows.push_back(pending[i].row);
    head_forward(rows);
    for (size_t i = begin; i < end; ++i) {
      Sequence& sequence = *pending[i].sequence;
      if (!sequence.sink) continue;  // its sink failed on an earlier token
      TokenEvent event{.token = sequence.request.prompt[static_cast<size_t>(pending[i].position)]};
      add_logprobs(logits + (i - begin) * config.vocab_size, config.vocab_size, sequence.request.top_logprobs,
                   event);
      sequence.prompt_scored = pending[i].position + 1;
      try {
        sequence.sink->on_prompt_token(event);
      } catch (const std::exception& error) {
        finish(sequence, Outcome{.error = std::string("the request's stream failed: ") + error.what()});
      }
    }
  }
}


void Engine::Impl::emit(Sequence& sequence, const float* row, int32_t token) {
  TokenEvent event{.token = token};
  if (sequence.request.top_logprobs >= 0) add_logprobs(row, config.vocab_size, sequence.request.top_logprobs, event);
  sequence.tokens.push_back(event.token);
  ++sequence.generated;
  const Clock::time_point now = Clock::now();
  if (sequence.generated == 1) {
    time_to_first_token.observe(seconds_between(sequence.arrived, now));
  } else {
    inter_token_latency.observe(seconds_between(sequence.last_token, now));
  }
  sequence.last_token = now;
  generated_tokens_total.add();
  bool go_on = false;
  try {
    go_on = sequence.sink->on_token(event);
  } catch (const std::exception& error) {
    finish(sequence, Outcome{.error = std::string("the request's stream failed: ") + error.what()});
    return;
  }
  const std::vector<int32_t>& stops = sequence.request.stop_tokens;
  if (!go_on || std::find(stops.begin(), stops.end(), event.token) != stops.end()) {
    finish(sequence, Outcome{.reason = FinishReason::stop});
  } else if (sequence.generated >= sequence.request.max_tokens ||
             static_cast<int64_t>(sequence.tokens.size()) >= config.n_positions) {
    finish(sequence, Outcome{.reason = FinishReason::length});
  }
}

void Engine::Impl::finish(Sequence& sequence, const Outcome& outcome_in) {
  release_blocks(sequence);
  Outcome outcome = outcome_in;
  outcome.prompt_tokens = static_cast<int64_t>(sequence.request.prompt.size());
  outcome.generated_tokens = sequence.generated;
  outcome.cached_prompt_tokens = sequence.cached_prompt_tokens;
  request_latency.observe(seconds_between(sequence.arrived, Clock::now()));
  finished_total.add();
  std::shared_ptr<RequestSink> sink = std::move(sequence.sink);  // marks the sequence finished
  update_stats();  // before the sink hears of it: whoever waits on it sees the blocks back
  try {
    sink->on_finish(outcome);
  } catch (const std::exception&) {
    // The front end's failure to report is its own; the engine has released everything.
  }
  std::lock_guard lock(mutex);
  live.erase(sequence.id);
  idle.notify_all();
}

void Engine::Impl::update_stats() {
  std::lock_guard lock(mutex);
  auto unfinished = [](const auto& sequences) {
    return std::count_if(sequences.begin(), sequences.end(), [](const auto& sequence) { return sequence->sink != nullptr; });
  };
  stats.running = unfinished(running);
  stats.waiting = unfinished(waiting) + static_cast<int64_t>(incoming.size());
  queued_at_update = static_cast<int64_t>(incoming.size());
  stats.blocks_total = pool.total();
  stats.blocks_free = pool.free_blocks();
  stats.blocks_cached = pool.cached_blocks();
  stats.steps = steps;
  stats.preemptions = static_cast<int64_t>(preemptions_total.value());
  stats.prompt_tokens = static_cast<int64_t>(prompt_tokens_total.value());
  stats.generated_tokens = static_cast<int64_t>(generated_tokens_total.value());
  stats.cached_prompt_tokens = static_cast<int64_t>(cached_prompt_tokens_total.value());
}

Engine::Engine(const model::GptConfig& config, const model::ParameterSet& parameters, Backend& backend,
               const EngineOptions& options)
    : impl_(std::make_unique<Impl>(config, parameters, backend, options)) {}

Engine::~Engine() {
  {
    std::lock_guard lock(impl_->mutex);
    impl_->stopping = true;
    for (uint64_t id : impl_->live) impl_->cancels.emplace_back(id, "the engine is shutting down");
  }
  impl_->wake.notify_all();
  impl_->thread.join();
}

uint64_t Engine::submit(Request request, std::shared_ptr<RequestSink> sink) {
  const model::GptConfig& config = impl_->config;
  check(!request.prompt.empty(), "prompt: must hold at least one token");
  for (size_t i = 0; i < request.prompt.size(); ++i) {
    check(request.prompt[i] >= 0 && request.prompt[i] < config.vocab_size,
          "prompt: token id {} at index {} is outside the vocabulary of {}", request.prompt[i], i, config.vocab_size);
  }
  check(request.max_tokens >= 1, "max_tokens: must be at least 1 (got {})", request.max_tokens);
  const auto prompt_tokens = static_cast<int64_t>(request.prompt.size());
  check(request.max_tokens <= config.n_positions - prompt_tokens,
        "max_tokens: the prompt's {} tokens plus max_tokens {} exceed the model's context of {} tokens", prompt_tokens,
        request.max_tokens, config.n_positions);
  check(request.top_logprobs >= -1 && request.top_logprobs <= 20, "logprobs: must be between 0 and 20 (got {})",
        request.top_logprobs);
  check(!request.prompt_logprobs || request.top_logprobs >= 0, "prompt_logprobs: needs top_logprobs >= 0");
  const SamplingConfig& sampling = request.sampling;
  check(std::isfinite(sampling.temperature) && sampling.temperature >= 0,
        "temperature: must be a finite number >= 0 (got {})", sampling.temperature);
  check(sampling.top_p > 0 && sampling.top_p <= 1, "top_p: must be in (0, 1] (got {})", sampling.top_p);
  check(sampling.top_k >= 0, "top_k: must be >= 0 (got {})", sampling.top_k);
  for (const auto& [token, bias] : sampling.logit_bias) {
    check(token >= 0 && token < config.vocab_size, "logit_bias: token id {} is outside the vocabulary of {}", token,
          config.vocab_size);
  }
  check(sink != nullptr, "submit: a request needs a sink");

  std::lock_guard lock(impl_->mutex);
  if (impl_->draining || impl_->stopping) throw Draining("the server is shutting down and accepts no new requests");
  // Requests that will wait for a sequence slot, this one included: those queued (stats.waiting
  // counts the ones submitted since the last step too) and this one, beyond the slots now free.
  const int64_t free_slots = std::max<int64_t>(0, impl_->options.max_num_seqs - impl_->stats.running);
  const int64_t queued = impl_->stats.waiting + static_cast<int64_t>(impl_->incoming.size()) - impl_->queued_at_update;
  if (std::max<int64_t>(0, queued + 1 - free_slots) > impl_->options.max_waiting) {
    throw QueueFull(fmt::format("the queue is full ({} requests waiting); retry later", queued - free_slots));
  }
  const uint64_t id = impl_->next_id++;
  auto sequence = std::make_unique<Sequence>(id, std::move(request), std::move(sink));
  impl_->live.insert(id);
  impl_->incoming.push_back(std::move(sequence));
  impl_->wake.notify_all();
  return id;
}

void Engine::cancel(uint64_t id) {
  std::lock_guard lock(impl_->mutex);
  if (impl_->live.count(id) == 0) return;
  impl_->cancels.emplace_back(id, "cancelled");
  impl_->wake.notify_all();
}

void Engine::drain(std::chrono::milliseconds grace) {
  std::unique_lock lock(impl_->mutex);
  impl_->draining = true;
  if (!impl_->idle.wait_for(lock, grace, [&] { return impl_->live.empty(); })) {
    for (uint64_t id : impl_->live) {
      impl_->cancels.emplace_back(id, "the server is shutting down: the request did not finish within the grace period");
    }
    impl_->wake.notify_all();
    impl_->idle.wait(lock, [&] { return impl_->live.empty(); });
  }
}

EngineStats Engine::stats() const { return impl_->stats_snapshot(); }

std::map<std::string, double> Engine::profile() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->profile;
}
MetricsRegistry& Engine::metrics() { return impl_->metrics; }
const model::GptConfig& Engine::config() const { return impl_->config; }
const EngineOptions& Engine::options() const { return impl_->options; }

}  // namespace paraflow::infer
