#include "infer/text_codec.h"

#include <fmt/format.h>

namespace paraflow::infer {

TextCodec::TextCodec(const std::filesystem::path& model_dir) {
  if (data::Tokenizer::present_in(model_dir)) {
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

std::optional<int32_t> TextCodec::special_token(const std::string& text) const {
  if (!tokenizer_) return std::nullopt;
  const int32_t id = tokenizer_->special_id(text);
  return id >= 0 ? std::optional<int32_t>(id) : std::nullopt;
}

}  // namespace paraflow::infer
