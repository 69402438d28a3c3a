#include "infer/chat_template.h"

#include <fmt/format.h>

#include <algorithm>

#include "base/file_io.h"
#include "base/json.h"

namespace paraflow::infer {

namespace fs = std::filesystem;
using nlohmann::json;
using nlohmann::ordered_json;

namespace {

// The special tokens transformers passes to a template (its special_tokens_map), each a string or
// an AddedToken object {"content": ...} in tokenizer_config.json; null ones are left out.
constexpr const char* kSpecialTokens[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                          "pad_token", "cls_token", "mask_token"};

// Markers chat templates write at the end of a turn, besides the eos token.
constexpr const char* kEndOfTurnMarkers[] = {"<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>"};

std::string token_text(const json& value, const std::string& where) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_object() && value.contains("content") && value["content"].is_string()) return value["content"].get<std::string>();
  throw InputError(fmt::format("{}: must be a string or an object with a \"content\" string", where));
}

// tokenizer_config.json's chat_template: a string, or [{"name": ..., "template": ...}, ...].
std::string configured_template(const json& value, const std::string& file) {
  if (value.is_string()) return value.get<std::string>();
  check(value.is_array(), "{}: chat_template must be a string or a list of {{\"name\", \"template\"}} objects", file);
  for (size_t i = 0; i < value.size(); ++i) {
    const json& entry = value[i];
    check(entry.is_object() && entry.contains("name") && entry["name"].is_string() && entry.contains("template") &&
              entry["template"].is_string(),
          "{}: chat_template[{}] must be an object with \"name\" and \"template\" strings", file, i);
    if (entry["name"] == "default") return entry["template"].get<std::string>();
  }
  throw InputError(fmt::format("{}: chat_template lists {} named templates and none is named \"default\"", file, value.size()));
}

}  // namespace

std::optional<ChatTemplate> ChatTemplate::load(const fs::path& model_dir) {
  const fs::path config_file = model_dir / "tokenizer_config.json";
  const fs::path template_file = model_dir / "chat_template.jinja";
  json config = json::object();
  if (fs::exists(config_file)) {
    config = parse_json(read_file(config_file), config_file.string());
    check(config.is_object(), "{}: must be a JSON object", config_file.string());
  }
  std::optional<std::string> source;
  std::string name;
  if (fs::exists(template_file)) {  // as transformers: the file wins over the config's field
    source = read_file(template_file);
    name = template_file.string();
  } else if (config.contains("chat_template") && !config["chat_template"].is_null()) {
    source = configured_template(config["chat_template"], config_file.string());
    name = config_file.string() + " chat_template";
  }
  if (!source) return std::nullopt;
  ordered_json special_tokens = ordered_json::object();
  for (const char* key : kSpecialTokens) {
    if (config.contains(key) && !config[key].is_null()) {
      special_tokens[key] = token_text(config[key], fmt::format("{}: {}", config_file.string(), key));
    }
  }
  return ChatTemplate(std::move(*source), std::move(name), std::move(special_tokens));
}

ChatTemplate::ChatTemplate(std::string source, std::string name, ordered_json special_tokens)
    : source_(source), template_(source, std::move(name)), special_tokens_(std::move(special_tokens)) {
  if (special_tokens_.contains("eos_token") && !special_tokens_["eos_token"].get<std::string>().empty()) {
    end_of_turn_.push_back(special_tokens_["eos_token"].get<std::string>());
  }
  for (const char* marker : kEndOfTurnMarkers) {
    if (source.find(marker) != std::string::npos &&
        std::find(end_of_turn_.begin(), end_of_turn_.end(), marker) == end_of_turn_.end()) {
      end_of_turn_.push_back(marker);
    }
  }
}

std::string ChatTemplate::render(const ordered_json& messages, bool add_generation_prompt) const {
  // The variables in the order transformers' render_jinja_template passes them.
  ordered_json context = {{"messages", messages}, {"tools", nullptr}, {"documents", nullptr},
                          {"add_generation_prompt", add_generation_prompt}};
  for (const auto& [key, value] : special_tokens_.items()) context[key] = value;
  return template_.render(context);
}

}  // namespace paraflow::infer
