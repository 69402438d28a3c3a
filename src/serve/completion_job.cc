#include "serve/completion_job.h"

#include <algorithm>
#include <mutex>
#include <nlohmann/json.hpp>

#include "serve/api_error.h"
#include "serve/text_assembler.h"
#include "serve/utf8.h"

namespace paraflow::serve {

namespace {

using nlohmann::json;

// Every string put in a response went through to_valid_utf8 or came from parsed JSON; the
// replacing dump is a second guard that the JSON is valid whatever the model produced.
std::string dump(const json& value) { return value.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string sse_event(const json& value) { return "data: " + dump(value) + "\n\n"; }

// A token as logprobs name it: its text, or, when its bytes are not whole UTF-8 characters (a
// byte-level token inside a character), "bytes:" and the bytes escaped, as OpenAI's API writes
// them ("bytes:\\xc3"), so two such tokens never share a name.
std::string token_name(const std::string& bytes) {
  const std::string text = to_valid_utf8(bytes);
  if (text == bytes) return text;
  std::string name = "bytes:";
  for (unsigned char byte : bytes) name += fmt::format("\\x{:02x}", byte);
  return name;
}

// A token in chat's logprobs: its name, log-probability and bytes (OpenAI's
// ChatCompletionTokenLogprob, less its top_logprobs).
json chat_token(const std::string& bytes, float logprob) {
  json list = json::array();
  for (unsigned char byte : bytes) list.push_back(byte);
  return {{"token", token_name(bytes)}, {"logprob", logprob}, {"bytes", list}};
}

// One choice: its text so far and, when asked for, its logprobs: chat's `content` list, or the
// legacy lists of completions.
struct Choice {
  Choice(const std::vector<std::string>& stops, bool chat) : text(stops) {
    if (chat) {
      logprobs = {{"content", json::array()}, {"refusal", nullptr}};
    } else {
      logprobs = {{"tokens", json::array()}, {"token_logprobs", json::array()},
                  {"top_logprobs", json::array()}, {"text_offset", json::array()}};
    }
  }
  TextAssembler text;
  std::string sent;       // the text given out (the whole completion once finished)
  std::string raw_bytes;  // the tokens' bytes (the prompt's first with echo), for text offsets
  std::string echoed;     // echo: the prompt's text
  bool echo_pending = false;  // echo in a stream: the prompt's chunk is still to be sent
  json logprobs;
  std::string finish_reason;
  std::string error;
  bool cancelled = false;
  bool finished = false;
};

class Completion : public std::enable_shared_from_this<Completion> {
 public:
  Completion(CompletionSpec spec, std::shared_ptr<ServedVersion> version, std::shared_ptr<Exchange> exchange)
      : spec_(std::move(spec)),
        version_(std::move(version)),
        engine_(*version_->engine),
        codec_(*version_->codec),
        exchange_(std::move(exchange)) {
    for (size_t i = 0; i < spec_.choices.size(); ++i) choices_.emplace_back(spec_.stops, spec_.chat);
    if (spec_.echo) echo_prompts();
  }

  void start();
  void on_prompt_token(size_t index, const infer::TokenEvent& event);
  bool on_token(size_t index, const infer::TokenEvent& event);
  void on_finish(size_t index, const infer::Outcome& outcome);

 private:
  // The sink of one choice's engine request.
  class Sink : public infer::RequestSink {
   public:
    Sink(std::shared_ptr<Completion> completion, size_t index) : completion_(std::move(completion)), index_(index) {}
    void on_prompt_token(const infer::TokenEvent& event) override { completion_->on_prompt_token(index_, event); }
    bool on_token(const infer::TokenEvent& event) override { return completion_->on_token(index_, event); }
    void on_finish(const infer::Outcome& outcome) override { completion_->on_finish(index_, outcome); }

   private:
    std::shared_ptr<Completion> completion_;
    size_t index_;
  };

  json chunk(size_t index, const std::string& text, const json& logprobs, const std::string& finish_reason) const;
  json token_logprobs(Choice& choice, const infer::TokenEvent& event) const;
  void echo_prompts();
  void send_echo(size_t index);  // a stream's prompt chunk, once, before the choice's first other one
  json usage() const;
  void emit(std::string data);  // stream events wait until the stream has started
  void finish();                // every choice is done
  void cancel_all();
  // Which version answered, for a request that named only the model (its newest version).
  HttpHeaders version_header() const { return {{kModelVersionHeader, std::to_string(version_->version)}}; }

  CompletionSpec spec_;
  std::shared_ptr<ServedVersion> version_;  // held while the completion runs: its engine and codec
  infer::Engine& engine_;
  const infer::TextCodec& codec_;
  std::shared_ptr<Exchange> exchange_;
  std::mutex mutex_;  // the engine thread (sinks) and an io thread (start, disconnect) share the state below
  std::vector<Choice> choices_;
  std::vector<uint64_t> ids_;
  std::vector<std::string> early_;  // events from before the stream started
  bool started_ = false;            // all requests submitted (and for a stream, its header sent)
  bool refused_ = false;            // a submit failed: the service answers with the error
  size_t finished_ = 0;
  int64_t completion_tokens_ = 0;  // all choices'
};

void Completion::start() {
  try {
    for (size_t i = 0; i < spec_.choices.size(); ++i) {
      const uint64_t id = engine_.submit(spec_.choices[i], std::make_shared<Sink>(shared_from_this(), i));
      std::lock_guard lock(mutex_);
      ids_.push_back(id);
    }
  } catch (const Error& error) {
    {
      std::lock_guard lock(mutex_);
      refused_ = true;
    }
    cancel_all();
    if (dynamic_cast<const infer::QueueFull*>(&error)) {
      throw ApiError(429, "requests", error.what(), "", "rate_limit_exceeded");
    }
    if (dynamic_cast<const infer::Draining*>(&error)) {
      throw ApiError(503, "server_error", error.what(), "", "service_unavailable");
    }
    if (dynamic_cast<const InputError*>(&error)) throw ApiError(400, "invalid_request_error", error.what());
    throw;
  }
  exchange_->on_disconnect([weak = weak_from_this()] {
    if (auto completion = weak.lock()) completion->cancel_all();
  });
  std::vector<std::string> early;
  {
    std::lock_guard lock(mutex_);
    started_ = true;
    if (spec_.stream) {
      exchange_->start_stream("text/event-stream", version_header());
      if (spec_.chat) {
        for (size_t i = 0; i < choices_.size(); ++i) {
          json role = chunk(i, "", nullptr, "");
          role["choices"][0]["delta"] = {{"role", "assistant"}, {"content", ""}};
          exchange_->send(sse_event(role));
        }
      }
      for (std::string& data : early_) exchange_->send(std::move(data));
      early_.clear();
    }
    if (finished_ == choices_.size()) finish();
  }
}

// Echo: each choice's text starts with the prompt's; with logprobs, the lists start with the
// first prompt token, which has no log-probability (null), as in OpenAI's API.
void Completion::echo_prompts() {
  for (size_t i = 0; i < choices_.size(); ++i) {
    Choice& choice = choices_[i];
    const std::vector<int32_t>& prompt = spec_.choices[i].prompt;
    std::string bytes;
    for (int32_t token : prompt) bytes += codec_.decode(token);
    choice.echoed = to_valid_utf8(bytes);
    choice.echo_pending = spec_.stream;
    if (!spec_.logprobs) continue;
    const std::string first = codec_.decode(prompt.front());
    choice.logprobs["tokens"].push_back(token_name(first));
    choice.logprobs["token_logprobs"].push_back(nullptr);
    choice.logprobs["top_logprobs"].push_back(nullptr);
    choice.logprobs["text_offset"].push_back(0);
    choice.raw_bytes = first;
  }
}

void Completion::on_prompt_token(size_t index, const infer::TokenEvent& event) {
  std::lock_guard lock(mutex_);
  Choice& choice = choices_[index];
  token_logprobs(choice, event);
  choice.raw_bytes += codec_.decode(event.token);
}

void Completion::send_echo(size_t index) {
  Choice& choice = choices_[index];
  if (!choice.echo_pending) return;
  choice.echo_pending = false;
  emit(sse_event(chunk(index, choice.echoed, spec_.logprobs ? choice.logprobs : json(), "")));
}

bool Completion::on_token(size_t index, const infer::TokenEvent& event) {
  std::lock_guard lock(mutex_);
  Choice& choice = choices_[index];
  if (refused_ || choice.text.stopped()) return false;
  send_echo(index);
  const std::vector<int32_t>& stop_tokens = spec_.choices[index].stop_tokens;
  if (std::find(stop_tokens.begin(), stop_tokens.end(), event.token) != stop_tokens.end()) {  // it ends the request: no text
    // Completions' logprobs still list it, as OpenAI's do: a client that reads the last entry as
    // the generated token (lm-evaluation-harness) finds it there.
    if (spec_.logprobs && !spec_.chat) {
      const json logprobs = token_logprobs(choice, event);
      if (spec_.stream) emit(sse_event(chunk(index, "", logprobs, "")));
    }
    return true;
  }
  json logprobs = spec_.logprobs ? token_logprobs(choice, event) : json();
  const std::string bytes = codec_.decode(event.token);
  choice.raw_bytes += bytes;
  const std::string piece = choice.text.add(bytes);
  choice.sent += piece;
  if (spec_.stream && (!piece.empty() || spec_.logprobs)) emit(sse_event(chunk(index, piece, logprobs, "")));
  return !choice.text.stopped();
}

// The token's logprobs, added to the choice's and returned as a stream chunk carries them.
json Completion::token_logprobs(Choice& choice, const infer::TokenEvent& event) const {
  if (spec_.chat) {
    json entry = chat_token(codec_.decode(event.token), event.logprob);
    entry["top_logprobs"] = json::array();
    for (const infer::TokenLogprob& alternative : event.top) {
      entry["top_logprobs"].push_back(chat_token(codec_.decode(alternative.token), alternative.logprob));
    }
    choice.logprobs["content"].push_back(entry);
    return {{"content", {entry}}, {"refusal", nullptr}};
  }
  const std::string token = token_name(codec_.decode(event.token));
  json top = json::object();
  // Most likely first; a name two tokens share (ids past a padded vocabulary decode to nothing)
  // keeps the likelier one's value.
  for (const infer::TokenLogprob& alternative : event.top) {
    const std::string name = token_name(codec_.decode(alternative.token));
    if (!top.contains(name)) top[name] = alternative.logprob;
  }
  // Offsets count characters of the completion before the token (an unfinished one not yet).
  const size_t offset = utf8_length(std::string_view(choice.raw_bytes).substr(0, complete_utf8_prefix(choice.raw_bytes)));
  choice.logprobs["tokens"].push_back(token);
  choice.logprobs["token_logprobs"].push_back(event.logprob);
  choice.logprobs["top_logprobs"].push_back(top);
  choice.logprobs["text_offset"].push_back(offset);
  return {{"tokens", {token}}, {"token_logprobs", {event.logprob}}, {"top_logprobs", {top}}, {"text_offset", {offset}}};
}

void Completion::on_finish(size_t index, const infer::Outcome& outcome) {
  std::lock_guard lock(mutex_);
  Choice& choice = choices_[index];
  const std::string rest = choice.text.stopped() ? "" : choice.text.finish();
  choice.sent += rest;
  choice.finish_reason =
      choice.text.stopped() || outcome.reason == infer::FinishReason::stop ? "stop" : "length";
  choice.error = outcome.error;
  choice.cancelled = outcome.cancelled;
  choice.finished = true;
  completion_tokens_ += outcome.generated_tokens;
  if (refused_) return;
  if (spec_.stream) {
    if (choice.error.empty()) {
      send_echo(index);
      emit(sse_event(chunk(index, rest, nullptr, choice.finish_reason)));
    } else {
      emit(sse_event(json::parse(ApiError(503, "server_error", choice.error).body())));
    }
  }
  if (++finished_ == choices_.size() && started_) finish();
}

void Completion::finish() {
  if (spec_.stream) {
    if (spec_.include_usage) {
      json last = chunk(0, "", nullptr, "");
      last["choices"] = json::array();
      last["usage"] = usage();
      exchange_->send(sse_event(last));
    }
    exchange_->send("data: [DONE]\n\n");
    exchange_->end_stream();
    return;
  }
  for (const Choice& choice : choices_) {
    if (!choice.error.empty()) {
      const int status = choice.cancelled ? 503 : 500;
      exchange_->respond(status, "application/json", ApiError(status, "server_error", choice.error).body());
      return;
    }
  }
  json response = {{"id", spec_.id},
                   {"object", spec_.chat ? "chat.completion" : "text_completion"},
                   {"created", spec_.created},
                   {"model", spec_.model},
                   {"choices", json::array()},
                   {"usage", usage()}};
  for (size_t i = 0; i < choices_.size(); ++i) {
    const Choice& choice = choices_[i];
    json entry = {{"index", i}, {"finish_reason", choice.finish_reason}};
    if (spec_.chat) {
      entry["message"] = {{"role", "assistant"}, {"content", choice.sent}};
    } else {
      entry["text"] = choice.echoed + choice.sent;
    }
    entry["logprobs"] = spec_.logprobs ? choice.logprobs : json();
    response["choices"].push_back(entry);
  }
  exchange_->respond(200, "application/json", dump(response), version_header());
}

json Completion::chunk(size_t index, const std::string& text, const json& logprobs,
                       const std::string& finish_reason) const {
  json choice = {{"index", index}, {"finish_reason", finish_reason.empty() ? json() : json(finish_reason)}};
  if (spec_.chat) {
    choice["delta"] = finish_reason.empty() || !text.empty() ? json{{"content", text}} : json::object();
  } else {
    choice["text"] = text;
  }
  choice["logprobs"] = logprobs;
  return {{"id", spec_.id},
          {"object", spec_.chat ? "chat.completion.chunk" : "text_completion"},
          {"created", spec_.created},
          {"model", spec_.model},
          {"choices", {choice}}};
}

json Completion::usage() const {
  return {{"prompt_tokens", spec_.prompt_tokens},
          {"completion_tokens", completion_tokens_},
          {"total_tokens", spec_.prompt_tokens + completion_tokens_}};
}

void Completion::emit(std::string data) {
  if (started_) {
    exchange_->send(std::move(data));
  } else {
    early_.push_back(std::move(data));
  }
}

void Completion::cancel_all() {
  std::vector<uint64_t> ids;
  {
    std::lock_guard lock(mutex_);
    ids = ids_;
  }
  for (uint64_t id : ids) engine_.cancel(id);
}

}  // namespace

void start_completion(CompletionSpec spec, std::shared_ptr<ServedVersion> version, std::shared_ptr<Exchange> exchange) {
  std::make_shared<Completion>(std::move(spec), std::move(version), std::move(exchange))->start();
}

}  // namespace paraflow::serve
