#include "serve/openai_service.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

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

// `name`: what the message calls the ids' holder ("prompt[1]", "logit_bias").
void check_in_vocabulary(const char* field, const std::string& name, int32_t id, const ServedVersion& version) {
  const int64_t vocabulary = version.engine->config().vocab_size;
  if (id >= vocabulary) {
    refuse(field, "{}: token id {} is outside the model's vocabulary of {} tokens", name, id, vocabulary);
  }
}

int64_t unix_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

OpenAiService::OpenAiService(const ModelRegistry& registry, std::string api_key, CorsPolicy cors)
    : registry_(registry), api_key_(std::move(api_key)), cors_(std::move(cors)), started_at_(unix_seconds()), tf_serving_(registry, started_at_) {}

void OpenAiService::draining() {
  draining_.store(true);
  tf_serving_.draining();
}

void OpenAiService::handle(HttpRequest request, std::shared_ptr<Exchange> exchange) {
  // A browser asks before a cross-origin call, without the key (serve/cors.h).
  if (CorsPolicy::is_preflight(request)) {
    CorsPolicy::Answer answer = cors_.preflight(request);
    return exchange->respond(answer.status, "text/plain; charset=utf-8", std::move(answer.body), std::move(answer.headers));
  }
  if (HttpHeaders headers = cors_.headers(request); !headers.empty()) exchange = with_headers(std::move(exchange), std::move(headers));
  try {
    answer(route(request, api_key_, metrics_path_), request, exchange);
  } catch (const ApiError& error) {
    HttpHeaders headers = error.headers();
    if (error.status() == 429) headers.emplace_back("Retry-After", "1");
    // TF Serving's clients read its error shape on its paths (a 401 there).
    const bool tf_serving = target_path(request.target).starts_with(tf_serving_prefix);
    exchange->respond(error.status(), "application/json", tf_serving ? json{{"error", error.what()}}.dump() : error.body(),
                      headers);
  } catch (const std::exception& error) {
    exchange->respond(500, "application/json", ApiError(500, "server_error", error.what()).body());
  }
}

void OpenAiService::answer(Endpoint endpoint, const HttpRequest& request, const std::shared_ptr<Exchange>& exchange) {
  switch (endpoint) {
    case Endpoint::web_page:
      return exchange->respond(200, "text/html; charset=utf-8", std::string(web_page_html()));
    case Endpoint::health: {
      const bool ready = !draining_.load() && registry_.ready();
      const char* status = ready ? "ok" : draining_.load() ? "draining" : "loading";
      return exchange->respond(ready ? 200 : 503, "application/json", json{{"status", status}}.dump());
    }
    case Endpoint::metrics:
      return exchange->respond(200, "text/plain; version=0.0.4; charset=utf-8", registry_.render_metrics(metrics_));
    case Endpoint::models: {
      json models = json::array();
      for (const std::string& name : registry_.model_names()) {
        models.push_back({{"id", name}, {"object", "model"}, {"created", started_at_}, {"owned_by", "paraflow"}});
      }
      return exchange->respond(200, "application/json", json{{"object", "list"}, {"data", models}}.dump());
    }
    case Endpoint::completions:
    case Endpoint::chat_completions:
      // A kept-alive connection may still send requests while the server drains.
      if (draining_.load()) {
        throw ApiError(503, "server_error", "the server is shutting down and accepts no new requests", "",
                       "service_unavailable");
      }
      if (endpoint == Endpoint::chat_completions) return chat(decode_chat_request(request.body), exchange);
      return complete(decode_completion_request(request.body), exchange);
    case Endpoint::tf_serving:
      return tf_serving_.handle(request, target_path(request.target), exchange);
  }
}

std::shared_ptr<ServedVersion> OpenAiService::find_version(const std::optional<std::string>& model) const {
  const std::vector<std::string> names = registry_.model_names();
  if (!model && names.size() > 1) {
    throw ApiError(400, "invalid_request_error",
                   fmt::format("model: required, this server serves several models ({})", fmt::join(names, ", ")),
                   "model", "model_required");
  }
  std::string name = model.value_or(names.front());
  std::optional<int64_t> version;
  std::string label;
  if (const size_t colon = name.rfind(':'); colon != std::string::npos) {
    const std::string which = name.substr(colon + 1);
    name.resize(colon);
    version = version_number(which);
    if (!version) label = which;
  }
  try {
    return registry_.find(name, version, label);
  } catch (const ModelNotFound& error) {
    throw ApiError(404, "invalid_request_error", fmt::format("the model '{}' does not exist: {}", model.value_or(name), error.what()),
                   "model", "model_not_found");
  } catch (const ModelUnavailable& error) {
    throw ApiError(503, "server_error", fmt::format("{} (GET /health answers 200 once every model is ready)", error.what()),
                   "", "service_unavailable");
  }
}

void OpenAiService::complete(const CompletionRequest& request, const std::shared_ptr<Exchange>& exchange) {
  std::shared_ptr<ServedVersion> version = find_version(request.params.model);
  std::vector<std::vector<int32_t>> prompts;
  for (const Prompt& prompt : request.prompts) {
    if (const auto* text = std::get_if<std::string>(&prompt)) {
      prompts.push_back(version->codec->encode(*text));
    } else {
      prompts.push_back(std::get<std::vector<int32_t>>(prompt));
      const std::string name = request.prompts.size() > 1 ? fmt::format("prompt[{}]", prompts.size() - 1) : "prompt";
      for (int32_t id : prompts.back()) check_in_vocabulary("prompt", name, id, *version);
    }
  }
  Stops stops{request.params.stop, {}};
  stops.tokens = version->codec->end_of_text();
  start(false, request.params, std::move(prompts), std::move(stops), std::move(version), exchange, request.echo);
}

void OpenAiService::chat(const ChatRequest& request, const std::shared_ptr<Exchange>& exchange) {
  std::shared_ptr<ServedVersion> version = find_version(request.params.model);
  Stops stops;
  stops.tokens = version->codec->end_of_text();
  if (!version->chat_template) {
    stops.strings = chat_stops(request.params.stop);
    return start(true, request.params, {version->codec->encode(chat_prompt(request.messages))}, std::move(stops),
                 version, exchange, false);
  }
  // The model's own template. The reply ends at the end of the assistant's turn: a special token
  // of the tokenizer when it has that marker as one, else the marker's text.
  stops.strings = request.params.stop;
  for (const std::string& marker : version->chat_template->end_of_turn()) {
    if (auto id = version->codec->special_token(marker)) {
      stops.tokens.push_back(*id);
    } else {
      stops.strings.push_back(marker);
    }
  }
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  for (const ChatMessage& message : request.messages) messages.push_back({{"role", message.role}, {"content", message.content}});
  std::string prompt;
  try {
    prompt = version->chat_template->render(messages, true);
  } catch (const infer::jinja::TemplateRaised& error) {  // the template refuses these messages
    refuse("messages", "{}", error.what());
  } catch (const infer::jinja::RenderError& error) {
    refuse("messages", "the model's chat template cannot render these messages: {}", error.what());
  }
  // The rendered text carries the template's own BOS: no second one (apply_chat_template's
  // tokenizing does the same).
  start(true, request.params, {version->codec->encode(prompt, false)}, std::move(stops), version, exchange, false);
}

void OpenAiService::start(bool chat, const GenerationParams& params, std::vector<std::vector<int32_t>> prompts,
                          Stops stops, std::shared_ptr<ServedVersion> version, const std::shared_ptr<Exchange>& exchange,
                          bool echo) {
  const char* prompt_field = chat ? "messages" : "prompt";
  const auto context = version->engine->config().n_positions;
  std::vector<int64_t> max_tokens;  // per prompt
  for (size_t p = 0; p < prompts.size(); ++p) {
    const std::string which = prompts.size() > 1 ? fmt::format("prompt[{}]", p) : "the prompt";
    const auto length = static_cast<int64_t>(prompts[p].size());
    if (length == 0) refuse(prompt_field, "{} must not be empty", which);
    if (length >= context) {
      refuse(prompt_field, "{} is {} tokens; the model's context is {} positions, and one must be left to generate",
             which, length, context);
    }
    const int64_t room = context - length;
    max_tokens.push_back(params.max_tokens.value_or(chat ? room : std::min<int64_t>(16, room)));
    if (max_tokens.back() > room) {
      refuse("max_tokens", "{} ({} tokens) + max_tokens ({}) is beyond the model's context of {} positions", which,
             length, max_tokens.back(), context);
    }
  }
  for (const auto& [id, bias] : params.logit_bias) check_in_vocabulary("logit_bias", "logit_bias", id, *version);

  CompletionSpec spec;
  spec.chat = chat;
  spec.id = fmt::format("{}-{:016x}", chat ? "chatcmpl" : "cmpl", random_number());
  spec.model = params.model.value_or(version->model);
  spec.created = unix_seconds();
  spec.stops = std::move(stops.strings);
  spec.stream = params.stream;
  spec.include_usage = params.include_usage;
  spec.logprobs = params.logprobs >= 0;
  spec.echo = echo;
  // Choice i (n per prompt, prompt by prompt) samples with seed + i: a seeded request is
  // reproducible, and its choices differ.
  const uint64_t seed = params.seed ? static_cast<uint64_t>(*params.seed) : random_number();
  for (int64_t i = 0; i < static_cast<int64_t>(prompts.size()) * params.n; ++i) {
    const auto p = static_cast<size_t>(i / params.n);
    if (i % params.n == 0) spec.prompt_tokens += static_cast<int64_t>(prompts[p].size());
    infer::Request request;
    request.prompt = prompts[p];
    request.max_tokens = max_tokens[p];
    request.sampling = {.temperature = params.temperature,
                        .top_k = params.top_k,
                        .top_p = params.top_p,
                        .seed = seed + static_cast<uint64_t>(i),
                        .frequency_penalty = params.frequency_penalty,
                        .presence_penalty = params.presence_penalty,
                        .logit_bias = params.logit_bias};
    request.top_logprobs = params.logprobs;
    request.prompt_logprobs = echo && spec.logprobs;
    request.stop_tokens = stops.tokens;
    spec.choices.push_back(std::move(request));
  }
  start_completion(std::move(spec), std::move(version), exchange);
}

void OpenAiService::count(const std::string& target, int status) {
  metrics_
      .counter("paraflow_http_requests_total", "HTTP requests answered, by endpoint and status code",
               {{"endpoint", endpoint_label(target)}, {"code", std::to_string(status)}})
      .add();
}

}  // namespace paraflow::serve
