#include "serve/openai_request.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cctype>
#include <charconv>
#include <limits>
#include <span>
#include <nlohmann/json.hpp>

#include "base/json.h"
#include "serve/api_error.h"

namespace paraflow::serve {

namespace {

using nlohmann::json;

// Parses the body, and when it is not JSON says where: "invalid JSON at byte 31 in prompt (...)",
// so that a prompt with invalid UTF-8 gets an error naming `prompt`.
json parse_body(std::string_view body) {
  struct Level {
    bool array = false;
    std::string key;   // in an object: the member being read
    size_t index = 0;  // in an array: the element being read
  };
  std::vector<Level> levels;
  const auto path = [&] {
    std::string text;
    for (const Level& level : levels) {
      if (level.array) {
        text += fmt::format("[{}]", level.index);
      } else if (!level.key.empty()) {
        text += (text.empty() ? "" : ".") + level.key;
      }
    }
    return text;
  };
  const auto track = [&](int depth, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        if (depth >= kMaxJsonDepth) refuse(path(), "the request nests JSON deeper than {} levels", kMaxJsonDepth);
        levels.push_back({event == json::parse_event_t::array_start});
        break;
      case json::parse_event_t::key:
        levels.back().key = parsed.get<std::string>();
        break;
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        levels.pop_back();
        [[fallthrough]];
      case json::parse_event_t::value:  // a member or element is complete: the next one is unknown yet
        if (!levels.empty() && levels.back().array) ++levels.back().index;
        if (!levels.empty() && !levels.back().array) levels.back().key.clear();
        break;
    }
    return true;
  };
  try {
    json parsed = json::parse(body, track);
    if (!parsed.is_object()) refuse("", "the request body must be a JSON object, not {}", parsed.type_name());
    return parsed;
  } catch (const json::parse_error& e) {
    // The library's message ends " - <the reason>"; keep the reason.
    const std::string message = e.what();
    const size_t reason = message.rfind(" - ");
    const std::string where = path();
    refuse(where, "invalid JSON at byte {}{}{}", e.byte, where.empty() ? "" : " in " + where,
           reason == std::string::npos ? "" : ": " + message.substr(reason + 3));
  } catch (const json::out_of_range& e) {  // a number beyond double's range, such as 1e999
    const std::string message = e.what();
    const std::string where = path();
    refuse(where, "invalid JSON{}: {}", where.empty() ? "" : " in " + where, message.substr(message.find("] ") + 2));
  }
}

// A field of OpenAI's API that paraflow does not implement. Many clients send every field, null
// for "not set", and some send a value that asks for nothing different (`tools: []`): those are
// accepted. Any other value is refused naming the field, rather than answered as if honoured.
struct Unimplemented {
  const char* name;
  const char* accepted;  // the values accepted besides null, for the message ("" when none)
  bool (*harmless)(const json& value, const json& request);
};

bool never(const json&, const json&) { return false; }
bool empty_list(const json& value, const json&) { return value.is_array() && value.empty(); }
// tool_choice and function_call: with no tools to call, "none" and "auto" both mean plain text.
bool no_tool_call(const json& value, const json&) { return value == "none" || value == "auto"; }

constexpr Unimplemented kCompletionUnimplemented[] = {
    {"suffix", "\"\"", [](const json& value, const json&) { return value == ""; }},
    // Best of n among n: every choice returned, none more generated.
    {"best_of", "the same as n", [](const json& value, const json& request) {
       const json n = request.value("n", json(1));
       return value.is_number_integer() && value == (n.is_null() ? json(1) : n);
     }},
};
constexpr Unimplemented kChatUnimplemented[] = {
    {"tools", "[]", empty_list},
    {"functions", "[]", empty_list},
    {"tool_choice", "\"none\" or \"auto\"", no_tool_call},
    {"function_call", "\"none\" or \"auto\"", no_tool_call},
    {"parallel_tool_calls", "true or false", [](const json& value, const json&) { return value.is_boolean(); }},
    {"response_format", "{\"type\": \"text\"}",
     [](const json& value, const json&) { return value == json{{"type", "text"}}; }},
    // A processing tier: how a request is scheduled, not what it answers.
    {"service_tier", "a string", [](const json& value, const json&) { return value.is_string(); }},
};
// What a client sends back of an assistant message it received (openai-python's model_dump()).
constexpr Unimplemented kMessageUnimplemented[] = {
    {"tool_calls", "[]", empty_list}, {"annotations", "[]", empty_list}, {"function_call", "", never},
    {"refusal", "", never}, {"audio", "", never}};

// Typed, range-checked reads of an object's members; absent and null members read as nullopt.
class Fields {
 public:
  // Refuses members neither `known` nor `unimplemented` (and those with a value that is not
  // harmless); `path` prefixes the names in errors ("messages[0].").
  Fields(const json& object, std::vector<std::string_view> known, std::string path = "",
         std::span<const Unimplemented> unimplemented = {})
      : object_(object), path_(std::move(path)) {
    for (const auto& [name, value] : object.items()) {
      if (std::find(known.begin(), known.end(), name) != known.end()) continue;
      const auto field = std::find_if(unimplemented.begin(), unimplemented.end(),
                                       [&](const Unimplemented& candidate) { return name == candidate.name; });
      if (field == unimplemented.end()) {
        refuse(path_ + name, "unknown field '{}{}' (known: {})", path_, name, fmt::join(known, ", "));
      }
      if (!value.is_null() && !field->harmless(value, object)) {
        const std::string shown = value.dump();
        refuse(path_ + name, "{}{} is not supported: only null{}{} is accepted (got {}{})", path_, name,
               *field->accepted ? " or " : "", field->accepted, shown.substr(0, 80), shown.size() > 80 ? "..." : "");
      }
    }
  }

  const json* find(const char* name) const {
    auto member = object_.find(name);
    return member == object_.end() || member->is_null() ? nullptr : &*member;
  }
  std::string name(const char* member) const { return path_ + member; }

  std::optional<int64_t> integer(const char* member, int64_t low, int64_t high) const {
    const json* value = find(member);
    if (!value) return std::nullopt;
    if (!value->is_number_integer()) refuse(name(member), "{} must be an integer, not {}", name(member), describe(*value));
    // Unsigned values beyond int64_t are out of every range we accept.
    const bool too_big = value->is_number_unsigned() && value->get<uint64_t>() > static_cast<uint64_t>(high);
    const int64_t number = too_big ? high : value->get<int64_t>();
    if (too_big || number < low || number > high) {
      refuse(name(member), "{} must be {} (got {})", name(member), range_text(low, high), value->dump());
    }
    return number;
  }

  // A number in [low, high], or (low, high] when low_open.
  std::optional<double> number(const char* member, double low, double high, bool low_open = false) const {
    const json* value = find(member);
    if (!value) return std::nullopt;
    if (!value->is_number()) refuse(name(member), "{} must be a number, not {}", name(member), describe(*value));
    const double number = value->get<double>();
    if (number < low || number > high || (low_open && number == low)) {
      refuse(name(member), "{} must be {} {} and at most {} (got {})", name(member), low_open ? "above" : "at least", low,
             high, value->dump());
    }
    return number;
  }

  std::optional<bool> boolean(const char* member) const {
    const json* value = find(member);
    if (!value) return std::nullopt;
    if (!value->is_boolean()) refuse(name(member), "{} must be true or false, not {}", name(member), describe(*value));
    return value->get<bool>();
  }

  std::optional<std::string> string(const char* member) const {
    const json* value = find(member);
    if (!value) return std::nullopt;
    if (!value->is_string()) refuse(name(member), "{} must be a string, not {}", name(member), describe(*value));
    return value->get<std::string>();
  }

  static std::string describe(const json& value) {
    return value.is_number() ? "a number" : fmt::format("{} {}", value.is_array() || value.is_object() ? "an" : "a",
                                                        value.type_name());
  }

 private:
  static std::string range_text(int64_t low, int64_t high) {
    if (high == std::numeric_limits<int64_t>::max()) return fmt::format("at least {}", low);
    return fmt::format("between {} and {}", low, high);
  }

  const json& object_;
  std::string path_;
};

constexpr int64_t no_limit = std::numeric_limits<int64_t>::max();

std::vector<std::string> decode_stop(const Fields& fields) {
  const json* stop = fields.find("stop");
  if (!stop) return {};
  std::vector<std::string> texts;
  if (stop->is_string()) {
    texts.push_back(stop->get<std::string>());
  } else if (stop->is_array()) {
    if (stop->size() > 4) refuse("stop", "stop takes up to 4 strings (got {})", stop->size());
    for (const json& text : *stop) {
      if (!text.is_string()) refuse("stop", "stop must be a string or a list of strings; it holds {}", Fields::describe(text));
      texts.push_back(text.get<std::string>());
    }
  } else {
    refuse("stop", "stop must be a string or a list of strings, not {}", Fields::describe(*stop));
  }
  for (const std::string& text : texts) {
    if (text.empty()) refuse("stop", "stop strings must not be empty");
  }
  return texts;
}

// OpenAI's logit_bias: an object from token ids, as decimal strings, to biases in [-100, 100].
std::vector<std::pair<int32_t, float>> decode_logit_bias(const Fields& fields) {
  const json* biases = fields.find("logit_bias");
  if (!biases) return {};
  if (!biases->is_object()) {
    refuse("logit_bias", "logit_bias must be an object from token ids to biases, not {}", Fields::describe(*biases));
  }
  std::vector<std::pair<int32_t, float>> decoded;
  for (const auto& [key, bias] : biases->items()) {
    int32_t id = -1;
    const auto [end, error] = std::from_chars(key.data(), key.data() + key.size(), id);
    if (key.empty() || !std::isdigit(static_cast<unsigned char>(key[0])) || error != std::errc() ||
        end != key.data() + key.size()) {
      refuse("logit_bias", "logit_bias keys must be token ids (decimal integers); got '{}'", key);
    }
    if (!bias.is_number() || bias.get<double>() < -100 || bias.get<double>() > 100) {
      refuse("logit_bias", "logit_bias['{}'] must be a number from -100 to 100, not {}", key, bias.dump());
    }
    decoded.emplace_back(id, bias.get<float>());
  }
  return decoded;
}

// The members both endpoints share.
GenerationParams decode_params(const Fields& fields) {
  GenerationParams params;
  params.model = fields.string("model");
  params.max_tokens = fields.integer("max_tokens", 1, no_limit);
  params.temperature = fields.number("temperature", 0, 2).value_or(1.0);
  params.top_p = fields.number("top_p", 0, 1, true).value_or(1.0);
  params.top_k = fields.integer("top_k", 0, no_limit).value_or(0);
  params.seed = fields.integer("seed", std::numeric_limits<int64_t>::min(), no_limit);
  params.stop = decode_stop(fields);
  params.n = fields.integer("n", 1, 16).value_or(1);
  params.stream = fields.boolean("stream").value_or(false);
  params.frequency_penalty = fields.number("frequency_penalty", -2, 2).value_or(0.0);
  params.presence_penalty = fields.number("presence_penalty", -2, 2).value_or(0.0);
  params.logit_bias = decode_logit_bias(fields);
  fields.string("user");  // accepted for OpenAI clients that send it; checked, not used
  if (const json* options = fields.find("stream_options")) {
    if (!options->is_object()) {
      refuse("stream_options", "stream_options must be an object, not {}", Fields::describe(*options));
    }
    if (!params.stream) refuse("stream_options", "stream_options is only allowed when stream is true");
    params.include_usage = Fields(*options, {"include_usage"}, "stream_options.").boolean("include_usage").value_or(false);
  }
  return params;
}

// A prompt's token ids; `name`: what messages call it ("prompt", or "prompt[2]" in a batch).
std::vector<int32_t> token_ids(const json& list, const std::string& name) {
  std::vector<int32_t> ids;
  for (const json& id : list) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > std::numeric_limits<int32_t>::max() ||
        (id.is_number_unsigned() && id.get<uint64_t>() > std::numeric_limits<int32_t>::max())) {
      refuse("prompt", "{} token ids must be non-negative integers (got {})", name, id.dump());
    }
    ids.push_back(id.get<int32_t>());
  }
  return ids;
}

// One prompt: a string, or a list of token ids; `name` says which ("prompt", "prompt[2]").
Prompt decode_one_prompt(const json& prompt, const std::string& name) {
  if (prompt.is_string()) {
    if (prompt.get_ref<const std::string&>().empty()) refuse("prompt", "{} must not be empty", name);
    return prompt.get<std::string>();
  }
  if (!prompt.is_array()) {
    refuse("prompt", "{} must be a string or a list of token ids, not {}", name, Fields::describe(prompt));
  }
  if (prompt.empty()) refuse("prompt", "{} must not be empty", name);
  return token_ids(prompt, name);
}

// A string or a list of token ids; or a batch: a list of strings, or a list of lists of ids.
std::vector<Prompt> decode_prompts(const Fields& fields) {
  const json* prompt = fields.find("prompt");
  if (!prompt) refuse("prompt", "prompt is required");
  if (!prompt->is_array() || prompt->empty() || (*prompt)[0].is_number()) return {decode_one_prompt(*prompt, "prompt")};
  if (static_cast<int64_t>(prompt->size()) > kMaxChoices) {
    refuse("prompt", "a batch holds up to {} prompts (got {})", kMaxChoices, prompt->size());
  }
  std::vector<Prompt> prompts;
  for (const json& each : *prompt) {
    if (each.type() != (*prompt)[0].type()) {
      refuse("prompt", "a batch of prompts must be all strings or all lists of token ids");
    }
    prompts.push_back(decode_one_prompt(each, fmt::format("prompt[{}]", prompts.size())));
  }
  return prompts;
}

// The roles a chat message may take, each a turn of the template ("<role>: <content>\n").
constexpr const char* kChatRoles[] = {"system", "developer", "user", "assistant"};

std::vector<ChatMessage> decode_messages(const Fields& fields) {
  const json* messages = fields.find("messages");
  if (!messages) refuse("messages", "messages is required");
  if (!messages->is_array()) refuse("messages", "messages must be a list, not {}", Fields::describe(*messages));
  if (messages->empty()) refuse("messages", "messages must not be empty");
  std::vector<ChatMessage> decoded;
  for (size_t i = 0; i < messages->size(); ++i) {
    const json& message = (*messages)[i];
    const std::string path = fmt::format("messages[{}]", i);
    if (!message.is_object()) refuse(path, "{} must be an object, not {}", path, Fields::describe(message));
    // `name` (a participant's name, which OpenAI's API accepts) is read and not used: the plain
    // template has no place for it.
    const Fields members(message, {"role", "content", "name"}, path + ".", kMessageUnimplemented);
    members.string("name");
    ChatMessage chat;
    chat.role = members.string("role").value_or("");
    if (std::find(std::begin(kChatRoles), std::end(kChatRoles), chat.role) == std::end(kChatRoles)) {
      refuse(members.name("role"), "{} must be one of system, developer, user, assistant (got '{}')",
             members.name("role"), chat.role);
    }
    // The content: a string, or a list of text parts ({"type": "text", "text": ...}).
    const json* content = members.find("content");
    if (!content) refuse(members.name("content"), "{} is required", members.name("content"));
    if (content->is_string()) {
      chat.content = content->get<std::string>();
    } else if (content->is_array()) {
      for (size_t k = 0; k < content->size(); ++k) {
        const std::string part_path = fmt::format("{}.content[{}]", path, k);
        if (!(*content)[k].is_object()) refuse(part_path, "{} must be an object", part_path);
        const Fields part((*content)[k], {"type", "text"}, part_path + ".");
        if (part.string("type") != "text") refuse(part.name("type"), "{} must be \"text\" (only text is supported)", part.name("type"));
        const std::optional<std::string> text = part.string("text");
        if (!text) refuse(part.name("text"), "{} is required in a text part", part.name("text"));
        chat.content += *text;
      }
    } else {
      refuse(members.name("content"), "{} must be a string or a list of text parts, not {}", members.name("content"),
             Fields::describe(*content));
    }
    decoded.push_back(std::move(chat));
  }
  return decoded;
}

}  // namespace

CompletionRequest decode_completion_request(std::string_view body) {
  const json request = parse_body(body);
  const Fields fields(request, {"model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "n",
                                "stream", "stream_options", "logprobs", "echo", "user", "frequency_penalty",
                                "presence_penalty", "logit_bias"},
                      "", kCompletionUnimplemented);
  CompletionRequest decoded;
  decoded.prompts = decode_prompts(fields);
  decoded.params = decode_params(fields);
  if (static_cast<int64_t>(decoded.prompts.size()) * decoded.params.n > kMaxChoices) {
    refuse("n", "{} prompts x n {} is more than {} choices in one request", decoded.prompts.size(), decoded.params.n,
           kMaxChoices);
  }
  decoded.params.logprobs = fields.integer("logprobs", 0, 5).value_or(-1);
  decoded.echo = fields.boolean("echo").value_or(false);
  return decoded;
}

ChatRequest decode_chat_request(std::string_view body) {
  const json request = parse_body(body);
  const Fields fields(request, {"model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p",
                                "top_k", "seed", "stop", "n", "stream", "stream_options", "logprobs", "top_logprobs",
                                "user", "frequency_penalty", "presence_penalty", "logit_bias"},
                      "", kChatUnimplemented);
  ChatRequest decoded;
  decoded.messages = decode_messages(fields);
  decoded.params = decode_params(fields);
  if (const auto max_completion_tokens = fields.integer("max_completion_tokens", 1, no_limit)) {
    if (decoded.params.max_tokens && decoded.params.max_tokens != max_completion_tokens) {
      refuse("max_completion_tokens", "max_tokens and max_completion_tokens disagree; give one");
    }
    decoded.params.max_tokens = max_completion_tokens;
  }
  const bool logprobs = fields.boolean("logprobs").value_or(false);
  const std::optional<int64_t> top_logprobs = fields.integer("top_logprobs", 0, 20);
  if (top_logprobs && !logprobs) refuse("top_logprobs", "top_logprobs needs logprobs: true");
  decoded.params.logprobs = logprobs ? top_logprobs.value_or(0) : -1;
  return decoded;
}

std::string chat_prompt(const std::vector<ChatMessage>& messages) {
  std::string prompt;
  for (const ChatMessage& message : messages) prompt += message.role + ": " + message.content + "\n";
  return prompt + "assistant:";
}

std::vector<std::string> chat_stops(std::vector<std::string> stops) {
  for (const char* role : kChatRoles) stops.push_back(fmt::format("\n{}:", role));
  return stops;
}

}  // namespace paraflow::serve
