// The JSON bodies of POST /v1/completions and POST /v1/chat/completions, decoded and checked
// field by field. Every refusal is a 400 ApiError whose `param` names the field: malformed JSON,
// a wrong type, a value out of range, an unknown field (rather than silently ignoring it). A field
// given as null is a field not given. Fields of OpenAI's API that paraflow does not implement
// (tools, response_format, best_of, suffix, ...) are accepted as null or with a value that changes
// nothing (`tools: []`), and refused with any other. What
// needs the model (token counts against its context, token ids against its vocabulary) is checked
// when the engine requests are built (openai_service.cc).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace paraflow::serve {

// What both endpoints ask of a generation.
struct GenerationParams {
  std::optional<std::string> model;
  std::optional<int64_t> max_tokens;  // absent: 16 for completions, the rest of the context for chat
  double temperature = 1.0;           // 0..2; 0 is greedy
  double top_p = 1.0;                 // (0, 1]
  int64_t top_k = 0;                  // an extension; 0 = all
  std::optional<int64_t> seed;        // absent: a random seed
  std::vector<std::string> stop;      // up to 4, none empty
  int64_t n = 1;                      // choices, 1..16
  bool stream = false;
  bool include_usage = false;         // stream_options.include_usage
  int64_t logprobs = -1;              // -1 none, else alternatives per token (completions 0..5, chat 0..20)
  double frequency_penalty = 0;       // -2..2
  double presence_penalty = 0;        // -2..2
  std::vector<std::pair<int32_t, float>> logit_bias;  // token id (a decimal key) -> -100..100
};

// A completion request's prompts, each text or token ids: one, or a batch (whose choices are
// numbered prompt by prompt, n for each, as OpenAI's API does).
using Prompt = std::variant<std::string, std::vector<int32_t>>;
constexpr int64_t kMaxChoices = 128;  // prompts x n in one request

struct CompletionRequest {
  GenerationParams params;
  std::vector<Prompt> prompts;  // at least one
  bool echo = false;  // the answer's text (and logprobs) start with the prompt's
};

struct ChatMessage {
  std::string role;  // system | developer | user | assistant
  std::string content;
};

struct ChatRequest {
  GenerationParams params;
  std::vector<ChatMessage> messages;  // at least one
};

CompletionRequest decode_completion_request(std::string_view body);
ChatRequest decode_chat_request(std::string_view body);

// The chat template of a model without one of its own (GPT-2; infer/chat_template.h renders the
// others'): each message as "<role>: <content>\n", then "assistant:" for the model to continue.
std::string chat_prompt(const std::vector<ChatMessage>& messages);
// A chat completion's stop strings: the request's, and the start of every turn of the template
// ("\nuser:" ...), so a reply ends where a model would go on to write the next turn itself.
std::vector<std::string> chat_stops(std::vector<std::string> stops);

}  // namespace paraflow::serve
