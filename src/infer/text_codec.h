// Text <-> token ids for a model directory: the export's BPE tokenizer when it has one
// (tokenizer.json, vocab.json + merges.txt, or GPT-2's encoder.json + vocab.bpe), else the
// byte-level vocabulary (id = byte value).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "data/tokenizer.h"

namespace paraflow::infer {

class TextCodec {
 public:
  // Says on stderr when the directory has no tokenizer files.
  // `model_dir` may also be a GGUF file: its tokenizer.ggml.* metadata (GPT-2's BPE) is read.
  explicit TextCodec(const std::filesystem::path& model_dir);
  std::vector<int32_t> encode(const std::string& text) const;
  // Bytes of one token (a BPE token may end inside a UTF-8 character; join tokens before showing);
  // none for an id past the tokenizer's vocabulary (a model's padded rows).
  std::string decode(int32_t token) const;
  bool is_end_of_text(int32_t token) const;
  std::optional<int32_t> end_of_text() const;

 private:
  std::optional<data::Tokenizer> tokenizer_;
};

}  // namespace paraflow::infer
