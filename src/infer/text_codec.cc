#include "infer/text_codec.h"

#include <fmt/format.h>

#include "base/error.h"
#include "model/gguf_model.h"

namespace paraflow::infer {

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
    tokenizer_ = gguf_tokenizer(model_dir);
  } else if (data::Tokenizer::present_in(model_dir)) {
    tokenizer_.emplace(data::Tokenizer::load(model_dir));
  } else {
    fmt::print(stderr, "{}: no tokenizer files; text is read and written as bytes (id = byte value)\n",
               model_dir.string());
  }
}

std::vector<int32_t> TextCodec::encode(const std::string& text) const {
  if (tokenizer_) return tokenizer_->encode(text);
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

bool TextCodec::is_end_of_text(int32_t token) const { return tokenizer_ && token == tokenizer_->eot_id(); }

std::optional<int32_t> TextCodec::end_of_text() const {
  if (tokenizer_) return tokenizer_->eot_id();
  return std::nullopt;
}

}  // namespace paraflow::infer
