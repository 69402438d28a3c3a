// One completion request being served: its n engine requests (one per choice), their tokens
// turned into text, and the answer: one JSON response when all are done, or server-sent events as
// tokens come ("data: {chunk}\n\n" ... "data: [DONE]\n\n"). A client that goes away cancels the
// engine requests.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "infer/engine.h"
#include "serve/http_server.h"
#include "serve/model_registry.h"

namespace paraflow::serve {

// The header of a completion's answer that says which of the model's versions answered it.
constexpr const char* kModelVersionHeader = "Paraflow-Model-Version";

struct CompletionSpec {
  bool chat = false;  // chat.completion shapes instead of text_completion
  std::string id;     // "cmpl-…" or "chatcmpl-…"
  std::string model;
  int64_t created = 0;                   // Unix seconds
  std::vector<infer::Request> choices;   // one engine request per choice
  int64_t prompt_tokens = 0;             // usage: each prompt once, whatever n
  std::vector<std::string> stops;
  bool stream = false;
  bool include_usage = false;
  bool logprobs = false;  // each choice's logprobs: chat's `content` list, or completions' legacy object
  // Completions: each choice's text starts with the prompt's, and its logprobs with the prompt
  // tokens' (the first one's null; the engine requests score their prompts); a stream sends the
  // prompt as a choice's first chunk.
  bool echo = false;
};

// Submits the choices' requests to the version's engine and answers through `exchange` as they
// run; the version is held until the completion is done. Throws ApiError (429 queue full, 503
// draining, 400 refused by the engine) before anything is sent.
void start_completion(CompletionSpec spec, std::shared_ptr<ServedVersion> version, std::shared_ptr<Exchange> exchange);

}  // namespace paraflow::serve
