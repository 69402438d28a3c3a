#include "serve/openai_service.h"

#include <fmt/format.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <random>

#include "serve/api_error.h"
#include "serve/completion_job.h"
#include "serve/web_page.h"

namespace paraflow::serve {

namespace {

using nlohmann::json;

uint64_t random_number() {
  thread_local std::mt19937_64 generator{std::random_device{}()};
  return generator();
}

int64_t unix_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

OpenAiService::OpenAiService(ServiceOptions options)
    : options_(std::move(options)), started_at_(unix_seconds()), tf_serving_(ServedModel{.name = options_.model_name}) {}

void OpenAiService::ready(infer::Engine& engine, const infer::TextCodec& codec) {
  engine_ = &engine;
  codec_ = &codec;
  state_.store(State::ready);
}

void OpenAiService::draining() { state_.store(State::draining); }

void OpenAiService::handle(HttpRequest request, std::shared_ptr<Exchange> exchange) {
  try {
    answer(route(request, options_.api_key), request, exchange);
  } catch (const ApiError& error) {
    HttpHeaders headers;
    if (error.status() == 429) headers.emplace_back("Retry-After", "1");
    exchange->respond(error.status(), "application/json", error.body(), headers);
  } catch (const std::exception& error) {
    exchange->respond(500, "application/json", ApiError(500, "server_error", error.what()).body());
  }
}

void OpenAiService::answer(Endpoint endpoint, const HttpRequest& request, const std::shared_ptr<Exchange>& exchange) {
  const State state = state_.load();
  switch (endpoint) {
    case Endpoint::web_page:
      return exchange->respond(200, "text/html; charset=utf-8", std::string(web_page_html()));
    case Endpoint::health: {
      const char* status = state == State::ready ? "ok" : state == State::loading ? "loading" : "draining";
      return exchange->respond(state == State::ready ? 200 : 503, "application/json", json{{"status", status}}.dump());
    }
    case Endpoint::metrics:
      return exchange->respond(200, "text/plain; version=0.0.4; charset=utf-8", render_metrics());
    case Endpoint::models: {
      json model = {{"id", options_.model_name}, {"object", "model"}, {"created", started_at_}, {"owned_by", "paraflow"}};
      return exchange->respond(200, "application/json", json{{"object", "list"}, {"data", {model}}}.dump());
    }
    case Endpoint::completions:
    case Endpoint::chat_completions:
      if (state == State::loading) {
        throw ApiError(503, "server_error", "the model is still loading (GET /health answers 200 once it is ready)", "",
                       "service_unavailable");
      }
      if (endpoint == Endpoint::completions) return complete(decode_completion_request(request.body), exchange);
      return chat(decode_chat_request(request.body), exchange);
    case Endpoint::tf_serving:
      return tf_serving_.handle(request, target_path(request.target), state == State::loading ? nullptr : engine_,
                                exchange);
  }
}

void OpenAiService::complete(const CompletionRequest& request, const std::shared_ptr<Exchange>& exchange) {
  std::vector<int32_t> prompt;
  if (const auto* text = std::get_if<std::string>(&request.prompt)) {
    prompt = codec_->encode(*text);
  } else {
    prompt = std::get<std::vector<int32_t>>(request.prompt);
    const int64_t vocabulary = engine_->config().vocab_size;
    for (int32_t id : prompt) {
      if (id >= vocabulary) refuse("prompt", "token id {} is outside the model's vocabulary of {} tokens", id, vocabulary);
    }
  }
  start(false, request.params, std::move(prompt), exchange);
}

void OpenAiService::chat(const ChatRequest& request, const std::shared_ptr<Exchange>& exchange) {
  start(true, request.params, codec_->encode(chat_prompt(request.messages)), exchange);
}

void OpenAiService::start(bool chat, const GenerationParams& params, std::vector<int32_t> prompt,
                          const std::shared_ptr<Exchange>& exchange) {
  if (params.model && *params.model != options_.model_name) {
    throw ApiError(404, "invalid_request_error",
                   fmt::format("the model '{}' does not exist; this server serves '{}'", *params.model,
                               options_.model_name),
                   "model", "model_not_found");
  }
  const char* prompt_field = chat ? "messages" : "prompt";
  const auto context = engine_->config().n_positions;
  const auto length = static_cast<int64_t>(prompt.size());
  if (length == 0) refuse(prompt_field, "the prompt must not be empty");
  if (length >= context) {
    refuse(prompt_field, "the prompt is {} tokens; the model's context is {} positions, and one must be left to generate",
           length, context);
  }
  const int64_t room = context - length;
  const int64_t max_tokens = params.max_tokens.value_or(chat ? room : std::min<int64_t>(16, room));
  if (max_tokens > room) {
    refuse("max_tokens", "the prompt ({} tokens) + max_tokens ({}) is beyond the model's context of {} positions", length,
           max_tokens, context);
  }

  CompletionSpec spec;
  spec.chat = chat;
  spec.id = fmt::format("{}-{:016x}", chat ? "chatcmpl" : "cmpl", random_number());
  spec.model = options_.model_name;
  spec.created = unix_seconds();
  spec.stops = params.stop;
  spec.stream = params.stream;
  spec.include_usage = params.include_usage;
  spec.logprobs = params.logprobs >= 0;
  // Choice i samples with seed + i: a seeded request is reproducible, and its choices differ.
  const uint64_t seed = params.seed ? static_cast<uint64_t>(*params.seed) : random_number();
  for (int64_t i = 0; i < params.n; ++i) {
    infer::Request request;
    request.prompt = prompt;
    request.max_tokens = max_tokens;
    request.sampling = {params.temperature, params.top_k, params.top_p, seed + static_cast<uint64_t>(i)};
    request.top_logprobs = params.logprobs;
    if (auto end = codec_->end_of_text()) request.stop_tokens = {*end};
    spec.choices.push_back(std::move(request));
  }
  start_completion(std::move(spec), *engine_, *codec_, exchange);
}

void OpenAiService::count(const std::string& target, int status) {
  metrics_
      .counter("paraflow_http_requests_total", "HTTP requests answered, by endpoint and status code",
               {{"endpoint", endpoint_label(target)}, {"code", std::to_string(status)}})
      .add();
}

std::string OpenAiService::render_metrics() const {
  return (state_.load() == State::loading ? "" : engine_->metrics().render()) + metrics_.render();
}

}  // namespace paraflow::serve
