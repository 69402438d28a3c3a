#include "infer/text_codec.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>

#include "base/error.h"
#include "base/file_io.h"
#include "base/json.h"

#include "base/error.h"
#include "model/gguf_model.h"

namespace paraflow::infer {
namespace {

// eos_token_id of generation_config.json, else of config.json: one id or a list; empty when
// neither file gives one.
std::vector<int32_t> configured_end_ids(const std::filesystem::path& dir) {
  for (const char* name : {"generation_config.json", "config.json"}) {
    const std::filesystem::path file = dir / name;
    if (!std::filesystem::exists(file)) continue;
    const nlohmann::json j = parse_json(read_file(file), file.string());
    const nlohmann::json& eos = j.is_object() ? j.value("eos_token_id", nlohmann::json()) : nlohmann::json();
    if (eos.is_null()) continue;
    std::vector<int32_t> ids;
    for (const nlohmann::json& id : eos.is_array() ? eos : nlohmann::json::array({eos})) {
      check(id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < (int64_t{1} << 31),
            "{}: eos_token_id must be a token id or a list of them, got {}", file.string(), eos.dump());
      ids.push_back(id.get<int32_t>());
    }
    return ids;
  }
  return {};
}

}  // namespace

namespace {

// GGUF's tokenizer.ggml.* of a GPT-2-style byte-level BPE ("gpt2"); CONTROL tokens (type 3) are
// special. None (text as bytes) when the file holds another kind, which is said on stderr.
std::optional<data::Tokenizer> gguf_tokenizer(const std::filesystem::path& path) {
  const model::GgufFile file = model::GgufFile::open(path);
  const std::string where = path.string();
  const std::string kind =
      file.contains("tokenizer.ggml.model") ? file.value("tokenizer.ggml.model").as_string(where + ": tokenizer.ggml.model") : "";
  if (kind != "gpt2") {
    fmt::print(stderr, "{}: {}; text is read and written as bytes (id = byte value)\n", where,
               kind.empty() ? "no tokenizer.ggml.model" : "tokenizer.ggml.model '" + kind + "' is not GPT-2's BPE");
    return std::nullopt;
  }
  auto strings = [&](const std::string& key) {
    std::vector<std::string> result;
    for (const model::GgufValue& value : file.value(key).as_array(where + ": " + key, model::GgufType::string)) {
      result.push_back(value.string_value);
    }
    return result;
  };
  const std::vector<std::string> tokens = strings("tokenizer.ggml.tokens");
  std::vector<std::string> specials;
  if (file.contains("tokenizer.ggml.token_type")) {
    const auto& types = file.value("tokenizer.ggml.token_type").as_array(where + ": tokenizer.ggml.token_type", model::GgufType::i32);
    check(types.size() == tokens.size(), "{}: tokenizer.ggml.token_type has {} entries for {} tokens", where, types.size(),
          tokens.size());
    for (size_t id = 0; id < tokens.size(); ++id) {
      if (types[id].signed_value == 3) specials.push_back(tokens[id]);
    }
  }
  return data::Tokenizer::from_strings(tokens, strings("tokenizer.ggml.merges"), specials, where + ": tokenizer.ggml.*");
}

}  // namespace

TextCodec::TextCodec(const std::filesystem::path& model_dir) {
  if (model::is_gguf_file(model_dir)) {
    tokenizer_ = gguf_tokenizer(model_dir);  // GPT-2's: generation stops at <|endoftext|>
    if (tokenizer_->eot_id() >= 0) end_of_text_ = {tokenizer_->eot_id()};
  } else if (data::Tokenizer::present_in(model_dir)) {
    tokenizer_.emplace(data::Tokenizer::load(model_dir));
    end_of_text_ = configured_end_ids(model_dir);
    if (end_of_text_.empty() && tokenizer_->eot_id() >= 0) end_of_text_ = {tokenizer_->eot_id()};
  } else {
    fmt::print(stderr, "{}: no tokenizer files; text is read and written as bytes (id = byte value)\n",
               model_dir.string());
  }
}

std::vector<int32_t> TextCodec::encode(const std::string& text, bool add_special_tokens) const {
  if (tokenizer_) return add_special_tokens ? tokenizer_->encode_with_template(text) : tokenizer_->encode(text);
  std::vector<int32_t> ids;
  for (const unsigned char byte : text) ids.push_back(byte);  // 0-255 (char is signed on x86)
  return ids;
}

std::string TextCodec::decode(int32_t token) const {
  // A model's vocabulary may be padded past its tokenizer's (training allows it): those ids,
  // which sampling can still pick, have no bytes.
  if (tokenizer_) return token < tokenizer_->vocab_size() ? std::string(tokenizer_->token_bytes(token)) : "";
  return token < 256 ? std::string(1, static_cast<char>(token)) : "";
}

bool TextCodec::is_end_of_text(int32_t token) const {
  return std::find(end_of_text_.begin(), end_of_text_.end(), token) != end_of_text_.end();
}

std::optional<int32_t> TextCodec::special_token(const std::string& text) const {
  if (!tokenizer_) return std::nullopt;
  const int32_t id = tokenizer_->special_id(text);
  return id >= 0 ? std::optional<int32_t>(id) : std::nullopt;
}

}  // namespace paraflow::infer
