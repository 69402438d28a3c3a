// The request decoders: every bad input is a 400 whose `param` names the field, and the message too.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <tuple>

#include "serve/api_error.h"
#include "serve/openai_request.h"

namespace paraflow::serve {
namespace {

// Decodes `body` expecting a refusal: status 400, `param` = field, the message naming it.
template <typename Decode>
void expect_refused(Decode decode, const std::string& body, const std::string& field, const std::string& says) {
  SCOPED_TRACE(body);
  try {
    decode(body);
    ADD_FAILURE() << "accepted";
  } catch (const ApiError& error) {
    EXPECT_EQ(error.status(), 400);
    const nlohmann::json object = nlohmann::json::parse(error.body());
    const nlohmann::json& inner = object.at("error");
    EXPECT_EQ(inner.at("type"), "invalid_request_error");
    EXPECT_EQ(inner.at("param"), field.empty() ? nlohmann::json() : nlohmann::json(field));
    const std::string message = inner.at("message");
    if (!field.empty()) {
      EXPECT_NE(message.find(field), std::string::npos) << message;
    }
    EXPECT_NE(message.find(says), std::string::npos) << message;
  }
}

void completion_refused(const std::string& body, const std::string& field, const std::string& says) {
  expect_refused(decode_completion_request, body, field, says);
}
void chat_refused(const std::string& body, const std::string& field, const std::string& says) {
  expect_refused(decode_chat_request, body, field, says);
}

TEST(CompletionRequest, DecodesEveryField) {
  const CompletionRequest request = decode_completion_request(
      R"({"model": "m", "prompt": "Hi", "max_tokens": 5, "temperature": 0, "top_p": 0.5, "top_k": 3, "seed": -7,
          "stop": ["a", "bc"], "n": 2, "stream": true, "stream_options": {"include_usage": true}, "logprobs": 2,
          "echo": false, "user": "u", "frequency_penalty": 0.5, "presence_penalty": -1.5,
          "logit_bias": {"50256": -100, "7": 2.5}})");
  ASSERT_EQ(request.prompts.size(), 1u);
  EXPECT_EQ(std::get<std::string>(request.prompts[0]), "Hi");
  const GenerationParams& p = request.params;
  EXPECT_EQ(p.model, "m");
  EXPECT_EQ(p.max_tokens, 5);
  EXPECT_EQ(p.temperature, 0);
  EXPECT_EQ(p.top_p, 0.5);
  EXPECT_EQ(p.top_k, 3);
  EXPECT_EQ(p.seed, -7);
  EXPECT_EQ(p.stop, (std::vector<std::string>{"a", "bc"}));
  EXPECT_EQ(p.n, 2);
  EXPECT_TRUE(p.stream);
  EXPECT_TRUE(p.include_usage);
  EXPECT_EQ(p.logprobs, 2);
  EXPECT_FALSE(request.echo);
  EXPECT_TRUE(decode_completion_request(R"({"prompt": "x", "echo": true})").echo);
  EXPECT_EQ(p.frequency_penalty, 0.5);
  EXPECT_EQ(p.presence_penalty, -1.5);
  EXPECT_EQ(p.logit_bias, (std::vector<std::pair<int32_t, float>>{{50256, -100.0f}, {7, 2.5f}}));
}

TEST(CompletionRequest, DefaultsAndNulls) {
  const CompletionRequest request = decode_completion_request(R"({"prompt": "x", "max_tokens": null, "stop": null})");
  EXPECT_FALSE(request.params.max_tokens);
  EXPECT_EQ(request.params.temperature, 1.0);
  EXPECT_EQ(request.params.n, 1);
  EXPECT_FALSE(request.params.stream);
  EXPECT_EQ(request.params.logprobs, -1);
  EXPECT_TRUE(request.params.stop.empty());
  EXPECT_EQ(decode_completion_request(R"({"prompt": "x", "stop": "end"})").params.stop, std::vector<std::string>{"end"});
}

TEST(CompletionRequest, PromptShapes) {
  using Ids = std::vector<int32_t>;
  const auto prompts = [](const std::string& body) { return decode_completion_request(body).prompts; };
  EXPECT_EQ(prompts(R"({"prompt": ["one"]})"), std::vector<Prompt>{"one"});
  EXPECT_EQ(prompts(R"({"prompt": [1, 2, 3]})"), (std::vector<Prompt>{Ids{1, 2, 3}}));
  EXPECT_EQ(prompts(R"({"prompt": [[4, 5]]})"), (std::vector<Prompt>{Ids{4, 5}}));
  // Batches: choices prompt by prompt.
  EXPECT_EQ(prompts(R"({"prompt": ["one", "two"]})"), (std::vector<Prompt>{"one", "two"}));
  EXPECT_EQ(prompts(R"({"prompt": [[4, 5], [6]]})"), (std::vector<Prompt>{Ids{4, 5}, Ids{6}}));
  completion_refused(R"({"prompt": ["a", [1]]})", "prompt", "all strings or all lists of token ids");
  completion_refused(R"({"prompt": ["a", ""]})", "prompt", "prompt[1] must not be empty");
  completion_refused(R"({"prompt": [[1], []]})", "prompt", "prompt[1] must not be empty");
  completion_refused(R"({"prompt": [[1], [2, -1]]})", "prompt", "prompt[1] token ids must be non-negative");
  std::string many = R"({"prompt": [)";
  for (int i = 0; i < 129; ++i) many += std::string(i ? ", " : "") + "\"x\"";
  completion_refused(many + "]}", "prompt", "up to 128 prompts (got 129)");
  completion_refused(R"({"prompt": ["a", "b", "c", "d", "e", "f", "g", "h", "i"], "n": 15})", "n",
                     "9 prompts x n 15 is more than 128 choices");
  // Invalid UTF-8 in a JSON string is refused while parsing, naming the field it was in.
  completion_refused("{\"prompt\": \"ab\xff\"}", "prompt", "invalid JSON");
  completion_refused("{\"max_tokens\": 3, \"prompt\": \"\xc3\x28\"}", "prompt", "UTF-8");
  completion_refused(R"({"prompt": "\ud800"})", "prompt", "invalid JSON");  // a lone surrogate
}

TEST(CompletionRequest, RefusesBadInputNamingTheField) {
  completion_refused(R"({"prompt": "x",)", "", "invalid JSON");
  completion_refused("", "", "invalid JSON");
  completion_refused(R"(["prompt"])", "", "JSON object");
  completion_refused(R"({"max_tokens": 4})", "prompt", "required");
  completion_refused(R"({"prompt": ""})", "prompt", "empty");
  completion_refused(R"({"prompt": []})", "prompt", "empty");
  completion_refused(R"({"prompt": 5})", "prompt", "must be a string");
  completion_refused(R"({"prompt": [1, -2]})", "prompt", "non-negative");
  completion_refused(R"({"prompt": [1, "a"]})", "prompt", "token ids");
  completion_refused(R"({"prompt": "x", "max_tokens": 0})", "max_tokens", "at least 1");
  completion_refused(R"({"prompt": "x", "max_tokens": -3})", "max_tokens", "at least 1");
  completion_refused(R"({"prompt": "x", "max_tokens": 2.5})", "max_tokens", "integer");
  completion_refused(R"({"prompt": "x", "max_tokens": "16"})", "max_tokens", "integer");
  completion_refused(R"({"prompt": "x", "max_tokens": 18446744073709551615})", "max_tokens", "at least 1");
  completion_refused(R"({"prompt": "x", "temperature": "hot"})", "temperature", "number");
  completion_refused(R"({"prompt": "x", "temperature": 1e999})", "temperature", "number overflow");  // found by fuzzing
  completion_refused(R"({"prompt": "x", "temperature": 2.5})", "temperature", "at most 2");
  completion_refused(R"({"prompt": "x", "top_p": 0})", "top_p", "above 0");
  completion_refused(R"({"prompt": "x", "top_p": 1.5})", "top_p", "at most 1");
  completion_refused(R"({"prompt": "x", "top_k": -1})", "top_k", "at least 0");
  completion_refused(R"({"prompt": "x", "seed": 1.5})", "seed", "integer");
  completion_refused(R"({"prompt": "x", "n": 0})", "n", "between 1 and 16");
  completion_refused(R"({"prompt": "x", "n": 17})", "n", "between 1 and 16");
  completion_refused(R"({"prompt": "x", "stream": "yes"})", "stream", "true or false");
  completion_refused(R"({"prompt": "x", "stop": 3})", "stop", "string or a list");
  completion_refused(R"({"prompt": "x", "stop": ["a", 1]})", "stop", "string or a list");
  completion_refused(R"({"prompt": "x", "stop": ["a", "b", "c", "d", "e"]})", "stop", "up to 4");
  completion_refused(R"({"prompt": "x", "stop": ""})", "stop", "empty");
  completion_refused(R"({"prompt": "x", "logprobs": 6})", "logprobs", "between 0 and 5");
  completion_refused(R"({"prompt": "x", "logprobs": true})", "logprobs", "integer");
  completion_refused(R"({"prompt": "x", "echo": 1})", "echo", "true or false");
  completion_refused(R"({"prompt": "x", "stream_options": {"include_usage": true}})", "stream_options",
                     "only allowed when stream is true");
  completion_refused(R"({"prompt": "x", "stream": true, "stream_options": {"usage": true}})", "stream_options.usage",
                     "unknown field");
  completion_refused(R"({"prompt": "x", "frequency_penalty": 2.5})", "frequency_penalty", "at most 2");
  completion_refused(R"({"prompt": "x", "presence_penalty": -3})", "presence_penalty", "at least -2");
  completion_refused(R"({"prompt": "x", "presence_penalty": "high"})", "presence_penalty", "number");
  completion_refused(R"({"prompt": "x", "logit_bias": [1]})", "logit_bias", "an object from token ids");
  completion_refused(R"({"prompt": "x", "logit_bias": {"hello": 1}})", "logit_bias", "token ids (decimal integers); got 'hello'");
  completion_refused(R"({"prompt": "x", "logit_bias": {"-5": 1}})", "logit_bias", "got '-5'");
  completion_refused(R"({"prompt": "x", "logit_bias": {"12x": 1}})", "logit_bias", "got '12x'");
  completion_refused(R"({"prompt": "x", "logit_bias": {"99999999999": 1}})", "logit_bias", "got '99999999999'");
  completion_refused(R"({"prompt": "x", "logit_bias": {"5": 101}})", "logit_bias", "logit_bias['5'] must be a number from -100 to 100");
  completion_refused(R"({"prompt": "x", "logit_bias": {"5": "up"}})", "logit_bias", "not \"up\"");
  completion_refused(R"({"prompt": "x", "temprature": 1})", "temprature", "unknown field");
  completion_refused(R"({"prompt": "x", "messages": []})", "messages", "unknown field");
}

TEST(ChatRequest, DecodesMessagesAndTheTemplate) {
  const ChatRequest request = decode_chat_request(
      R"({"model": "m", "messages": [{"role": "system", "content": "Be brief."},
                                     {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "!"}]}],
          "max_completion_tokens": 7, "frequency_penalty": 1, "logit_bias": {"3": 4}})");
  ASSERT_EQ(request.messages.size(), 2u);
  EXPECT_EQ(request.params.frequency_penalty, 1.0);
  EXPECT_EQ(request.params.logit_bias, (std::vector<std::pair<int32_t, float>>{{3, 4.0f}}));
  EXPECT_EQ(request.params.logprobs, -1);
  const std::string user = R"("messages": [{"role": "user", "content": "x"}])";
  EXPECT_EQ(decode_chat_request("{" + user + R"(, "logprobs": true})").params.logprobs, 0);
  EXPECT_EQ(decode_chat_request("{" + user + R"(, "logprobs": true, "top_logprobs": 20})").params.logprobs, 20);
  EXPECT_EQ(decode_chat_request("{" + user + R"(, "logprobs": false})").params.logprobs, -1);
  EXPECT_EQ(request.messages[1].content, "Hi!");
  EXPECT_EQ(request.params.max_tokens, 7);
  EXPECT_EQ(chat_prompt(request.messages), "system: Be brief.\nuser: Hi!\nassistant:");
}

TEST(ChatRequest, RefusesBadInputNamingTheField) {
  chat_refused(R"({})", "messages", "required");
  chat_refused(R"({"messages": []})", "messages", "empty");
  chat_refused(R"({"messages": "hi"})", "messages", "list");
  chat_refused(R"({"messages": ["hi"]})", "messages[0]", "object");
  chat_refused(R"({"messages": [{"role": "user"}]})", "messages[0].content", "required");
  chat_refused(R"({"messages": [{"role": "robot", "content": "x"}]})", "messages[0].role", "one of");
  chat_refused(R"({"messages": [{"content": "x"}]})", "messages[0].role", "one of");
  chat_refused(R"({"messages": [{"role": "user", "content": 3}]})", "messages[0].content", "string or a list");
  chat_refused(R"({"messages": [{"role": "user", "content": "x", "nmae": "a"}]})", "messages[0].nmae", "unknown field");
  chat_refused(R"({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]})",
               "messages[0].content[0].image_url", "unknown field");
  chat_refused(R"({"messages": [{"role": "user", "content": [{"type": "image"}]}]})", "messages[0].content[0].type",
               "only text");
  chat_refused("{\"messages\": [{\"role\": \"user\", \"content\": \"\xe2\x82\"}]}", "messages[0].content", "UTF-8");
  chat_refused(R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 2, "max_completion_tokens": 3})",
               "max_completion_tokens", "disagree");
  chat_refused(R"({"messages": [{"role": "user", "content": "x"}], "logprobs": 1})", "logprobs", "true or false");
  chat_refused(R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})", "top_logprobs",
               "needs logprobs: true");
  chat_refused(R"({"messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 21})",
               "top_logprobs", "between 0 and 20");
  chat_refused(R"({"messages": [{"role": "user", "content": "x"}], "prompt": "x"})", "prompt", "unknown field");
  chat_refused(R"({"messages": [{"role": "user", "content": [{"type": "text"}]}]})", "messages[0].content[0].text",
               "required");
  chat_refused(R"({"messages": [{"role": "user", "content": "x", "name": 7}]})", "messages[0].name", "string");
}

// OpenAI's `name` on a message (a participant's name) is accepted; the plain template leaves it out.
TEST(ChatRequest, AcceptsAParticipantsName) {
  const ChatRequest request = decode_chat_request(R"({"messages": [{"role": "user", "content": "Hi", "name": "ann"}]})");
  EXPECT_EQ(chat_prompt(request.messages), "user: Hi\nassistant:");
}

// A chat reply ends where the model starts a turn of the template itself: every turn after the
// first in a conversation of every role begins with one of the stops, which come after the
// request's own.
TEST(ChatRequest, StopsAtTheStartOfEveryTurnOfTheTemplate) {
  const std::vector<std::string> stops = chat_stops({"END"});
  ASSERT_GE(stops.size(), 2u);
  EXPECT_EQ(stops[0], "END");
  const ChatRequest conversation = decode_chat_request(
      R"({"messages": [{"role": "system", "content": "a"}, {"role": "developer", "content": "b"},
                       {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}]})");
  const std::string prompt = chat_prompt(conversation.messages) + " e";
  std::vector<std::string> turns;
  for (size_t at = prompt.find('\n'); at != std::string::npos; at = prompt.find('\n', at + 1)) {
    turns.push_back(prompt.substr(at, prompt.find(' ', at) - at));
  }
  EXPECT_EQ(turns, (std::vector<std::string>{"\ndeveloper:", "\nuser:", "\nassistant:", "\nassistant:"}));
  for (const std::string& turn : turns) EXPECT_NE(std::find(stops.begin(), stops.end(), turn), stops.end()) << turn;
  EXPECT_NE(std::find(stops.begin(), stops.end(), "\nsystem:"), stops.end());
}

// Every field of a decoded request, to compare two decodings whole.
auto every_field(const GenerationParams& p) {
  return std::tie(p.model, p.max_tokens, p.temperature, p.top_p, p.top_k, p.seed, p.stop, p.n, p.stream,
                  p.include_usage, p.logprobs, p.frequency_penalty, p.presence_penalty, p.logit_bias);
}

// Clients that send every field, null for "not set" (vLLM and llama-server accept them): each
// optional field as null decodes as the request without it, the fields paraflow does not
// implement included.
TEST(OpenAiRequest, NullIsAFieldNotGiven) {
  const CompletionRequest plain = decode_completion_request(R"({"prompt": "x"})");
  const CompletionRequest nulls = decode_completion_request(
      R"({"prompt": "x", "model": null, "max_tokens": null, "temperature": null, "top_p": null, "top_k": null,
          "seed": null, "stop": null, "n": null, "stream": null, "stream_options": null, "logprobs": null,
          "echo": null, "user": null, "frequency_penalty": null, "presence_penalty": null, "logit_bias": null,
          "suffix": null, "best_of": null})");
  EXPECT_EQ(every_field(nulls.params), every_field(plain.params));
  EXPECT_EQ(nulls.echo, plain.echo);
  EXPECT_EQ(plain.params.temperature, 1.0);  // the defaults, not zeros
  EXPECT_EQ(plain.params.n, 1);
  EXPECT_EQ(plain.params.logprobs, -1);

  const ChatRequest chat = decode_chat_request(R"({"messages": [{"role": "user", "content": "Hi"}]})");
  // An assistant message as openai-python's model_dump() writes it, sent back in the conversation.
  const ChatRequest chat_nulls = decode_chat_request(
      R"({"messages": [{"role": "user", "content": "Hi", "name": null},
                       {"role": "assistant", "content": "Yo", "refusal": null, "function_call": null,
                        "tool_calls": null, "audio": null, "annotations": null}],
          "model": null, "max_tokens": null, "max_completion_tokens": null, "temperature": null, "top_p": null,
          "top_k": null, "seed": null, "stop": null, "n": null, "stream": null, "stream_options": null,
          "logprobs": null, "top_logprobs": null, "user": null, "frequency_penalty": null, "presence_penalty": null,
          "logit_bias": null, "tools": null, "tool_choice": null, "response_format": null, "functions": null,
          "function_call": null, "parallel_tool_calls": null, "service_tier": null})");
  EXPECT_EQ(every_field(chat_nulls.params), every_field(chat.params));
  EXPECT_EQ(chat_prompt(chat_nulls.messages), "user: Hi\nassistant: Yo\nassistant:");
}

// The fields paraflow does not implement: a value that asks for nothing different is accepted;
// one that would change the answer is refused (400 naming the field), not silently ignored; and
// each belongs to its endpoint only, as in OpenAI's API.
TEST(OpenAiRequest, UnimplementedFieldsAreRefusedUnlessHarmless) {
  EXPECT_EQ(decode_completion_request(R"({"prompt": "x", "suffix": "", "best_of": 1})").params.n, 1);
  EXPECT_EQ(decode_completion_request(R"({"prompt": "x", "n": 3, "best_of": 3})").params.n, 3);
  completion_refused(R"({"prompt": "x", "suffix": "end"})", "suffix", "suffix is not supported: only null or \"\"");
  completion_refused(R"({"prompt": "x", "best_of": 2})", "best_of", "only null or the same as n");
  completion_refused(R"({"prompt": "x", "n": 2, "best_of": 3})", "best_of", "got 3");
  completion_refused(R"({"prompt": "x", "tools": null})", "tools", "unknown field");

  const std::string user = R"({"messages": [{"role": "user", "content": "Hi"}], )";
  const ChatRequest harmless = decode_chat_request(
      user + R"("tools": [], "functions": [], "tool_choice": "none", "function_call": "auto",
                "parallel_tool_calls": true, "response_format": {"type": "text"}, "service_tier": "auto"})");
  EXPECT_EQ(chat_prompt(harmless.messages), "user: Hi\nassistant:");
  chat_refused(user + R"("tools": [{"type": "function", "function": {"name": "f"}}]})", "tools", "only null or []");
  chat_refused(user + R"("functions": [{"name": "f"}]})", "functions", "functions is not supported");
  chat_refused(user + R"("tool_choice": "required"})", "tool_choice", "got \"required\"");
  chat_refused(user + R"("tool_choice": {"type": "function", "function": {"name": "f"}}})", "tool_choice", "not supported");
  chat_refused(user + R"("function_call": {"name": "f"}})", "function_call", "not supported");
  chat_refused(user + R"("parallel_tool_calls": "yes"})", "parallel_tool_calls", "only null or true or false");
  chat_refused(user + R"("response_format": {"type": "json_object"}})", "response_format", "json_object");
  chat_refused(user + R"("service_tier": 1})", "service_tier", "only null or a string");
  chat_refused(user + R"("best_of": null})", "best_of", "unknown field");
  chat_refused(R"({"messages": [{"role": "assistant", "content": "x", "tool_calls": [{"id": "c"}]}]})",
               "messages[0].tool_calls", "not supported");
  chat_refused(R"({"messages": [{"role": "assistant", "content": "x", "refusal": "no"}]})", "messages[0].refusal",
               "only null is accepted");
}

}  // namespace
}  // namespace paraflow::serve
