#include "infer/gguf_tokenizer.h"

#include "base/error.h"

namespace paraflow::infer {
namespace {

class Keys {
 public:
  explicit Keys(const model::GgufFile& file) : file_(file) {}
  bool has(const std::string& key) const { return file_.contains(key); }
  std::string text(const std::string& key) const { return file_.value(key).as_string(where(key)); }
  std::vector<std::string> texts(const std::string& key) const {
    std::vector<std::string> result;
    for (const model::GgufValue& value : file_.value(key).as_array(where(key), model::GgufType::string)) {
      result.push_back(value.string_value);
    }
    return result;
  }
  int32_t id(const std::string& key) const {
    const int64_t value = file_.value(key).as_int(where(key));
    check(value >= 0 && value < (int64_t{1} << 31), "{}: {} is not a token id", where(key), value);
    return static_cast<int32_t>(value);
  }
  bool flag(const std::string& key) const {
    const model::GgufValue& value = file_.value(key);
    check(value.type == model::GgufType::boolean, "{}: a bool, not {}", where(key), model::gguf_type_name(value.type));
    return value.unsigned_value != 0;
  }
  std::string where(const std::string& key) const { return file_.path() + ": " + key; }

 private:
  const model::GgufFile& file_;
};

}  // namespace

std::optional<data::GgufVocabulary> read_gguf_vocabulary(const model::GgufFile& file) {
  const Keys keys(file);
  if (!keys.has("tokenizer.ggml.model")) return std::nullopt;
  data::GgufVocabulary g;
  g.model = keys.text("tokenizer.ggml.model");
  if (keys.has("tokenizer.ggml.pre")) g.pre = keys.text("tokenizer.ggml.pre");
  g.tokens = keys.texts("tokenizer.ggml.tokens");
  if (keys.has("tokenizer.ggml.token_type")) {
    for (const model::GgufValue& type :
         file.value("tokenizer.ggml.token_type").as_array(keys.where("tokenizer.ggml.token_type"), model::GgufType::i32)) {
      g.token_types.push_back(static_cast<int32_t>(type.signed_value));
    }
  }
  if (keys.has("tokenizer.ggml.merges")) g.merges = keys.texts("tokenizer.ggml.merges");
  if (keys.has("tokenizer.ggml.scores")) {
    for (const model::GgufValue& score :
         file.value("tokenizer.ggml.scores").as_array(keys.where("tokenizer.ggml.scores"), model::GgufType::f32)) {
      g.scores.push_back(static_cast<float>(score.float_value));
    }
  }
  if (keys.has("tokenizer.ggml.bos_token_id")) g.bos = keys.id("tokenizer.ggml.bos_token_id");
  if (keys.has("tokenizer.ggml.eos_token_id")) g.eos = keys.id("tokenizer.ggml.eos_token_id");
  if (keys.has("tokenizer.ggml.unknown_token_id")) g.unk = keys.id("tokenizer.ggml.unknown_token_id");
  if (keys.has("tokenizer.ggml.add_bos_token")) g.add_bos = keys.flag("tokenizer.ggml.add_bos_token");
  if (keys.has("tokenizer.ggml.add_eos_token")) g.add_eos = keys.flag("tokenizer.ggml.add_eos_token");
  if (keys.has("tokenizer.ggml.add_space_prefix")) g.add_space_prefix = keys.flag("tokenizer.ggml.add_space_prefix");
  return g;
}

std::vector<std::pair<std::string, model::GgufValue>> gguf_vocabulary_metadata(const data::GgufVocabulary& g) {
  std::vector<std::pair<std::string, model::GgufValue>> keys{
      {"tokenizer.ggml.model", model::gguf_string(g.model)},
      {"tokenizer.ggml.pre", model::gguf_string(g.pre)},
      {"tokenizer.ggml.tokens", model::gguf_strings(g.tokens)},
  };
  if (!g.scores.empty()) keys.emplace_back("tokenizer.ggml.scores", model::gguf_f32s(g.scores));
  keys.emplace_back("tokenizer.ggml.token_type", model::gguf_i32s(g.token_types));
  if (!g.merges.empty()) keys.emplace_back("tokenizer.ggml.merges", model::gguf_strings(g.merges));
  for (const auto& [key, id] : {std::pair{"tokenizer.ggml.bos_token_id", g.bos}, std::pair{"tokenizer.ggml.eos_token_id", g.eos},
                                std::pair{"tokenizer.ggml.unknown_token_id", g.unk}}) {
    if (id >= 0) keys.emplace_back(key, model::gguf_u32(static_cast<uint32_t>(id)));
  }
  if (g.add_bos) keys.emplace_back("tokenizer.ggml.add_bos_token", model::gguf_bool(*g.add_bos));
  if (g.add_eos) keys.emplace_back("tokenizer.ggml.add_eos_token", model::gguf_bool(*g.add_eos));
  if (g.model == "llama") keys.emplace_back("tokenizer.ggml.add_space_prefix", model::gguf_bool(g.add_space_prefix));
  return keys;
}

std::optional<ChatTemplate> gguf_chat_template(const model::GgufFile& file) {
  const Keys keys(file);
  if (!keys.has("tokenizer.chat_template")) return std::nullopt;
  nlohmann::ordered_json special_tokens = nlohmann::ordered_json::object();
  if (keys.has("tokenizer.ggml.tokens")) {
    const std::vector<std::string> tokens = keys.texts("tokenizer.ggml.tokens");
    for (const auto& [name, key] : {std::pair{"bos_token", "tokenizer.ggml.bos_token_id"},
                                    std::pair{"eos_token", "tokenizer.ggml.eos_token_id"}}) {
      if (!keys.has(key)) continue;
      const int32_t id = keys.id(key);
      check(static_cast<size_t>(id) < tokens.size(), "{}: {} is past the {} tokens", keys.where(key), id, tokens.size());
      special_tokens[name] = tokens[static_cast<size_t>(id)];
    }
  }
  return ChatTemplate(keys.text("tokenizer.chat_template"), keys.where("tokenizer.chat_template"), std::move(special_tokens));
}

}  // namespace paraflow::infer
