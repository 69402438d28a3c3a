#include "infer/text_codec.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>

#include "base/error.h"
#include "base/file_io.h"
#include "base/json.h"
#include "infer/gguf_tokenizer.h"
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

TextCodec::TextCodec(const model::GgufFile& file) {
  const std::optional<data::GgufVocabulary> vocabulary = read_gguf_vocabulary(file);
  if (!vocabulary) {
    fmt::print(stderr, "{}: no tokenizer.ggml.model; text is read and written as bytes (id = byte value)\n", file.path());
    return;
  }
  tokenizer_.emplace(data::Tokenizer::from_gguf(*vocabulary, file.path()));
  if (vocabulary->eos >= 0) end_of_text_ = {vocabulary->eos};
  // llama.cpp also stops at the end-of-turn token (Llama 3's <|eot_id|>).
  if (file.contains("tokenizer.ggml.eot_token_id")) {
    const int64_t eot = file.value("tokenizer.ggml.eot_token_id").as_int(file.path() + ": tokenizer.ggml.eot_token_id");
    check(eot >= 0 && eot < tokenizer_->vocab_size(), "{}: tokenizer.ggml.eot_token_id {} is not a token id", file.path(), eot);
    if (eot != vocabulary->eos) end_of_text_.push_back(static_cast<int32_t>(eot));
  }
  if (end_of_text_.empty() && tokenizer_->eot_id() >= 0) end_of_text_ = {tokenizer_->eot_id()};  // GPT-2's
}

TextCodec::TextCodec(const std::filesystem::path& model_dir) {
  if (model::is_gguf_file(model_dir)) {
    *this = TextCodec(model::GgufFile::open(model_dir));
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
