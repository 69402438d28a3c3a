// Text <-> token ids for a model directory: the export's BPE tokenizer when it has one
// (tokenizer.json, vocab.json + merges.txt, or GPT-2's encoder.json + vocab.bpe), else the
// byte-level vocabulary (id = byte value). Prompts are encoded as transformers' tokenizer(prompt)
// does for generation: with the tokenizer's template ids around them (Llama's BOS). Generation
// ends at the ids generate() stops at: generation_config.json's eos_token_id, else config.json's
// (one id or a list), else the tokenizer's `<|endoftext|>`.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "data/tokenizer.h"
#include "model/gguf.h"

namespace paraflow::infer {

class TextCodec {
 public:
  // Says on stderr when the directory has no tokenizer files.
  // `model_dir` may also be a GGUF file: its tokenizer.ggml.* metadata is read.
  explicit TextCodec(const std::filesystem::path& model_dir);
  // A GGUF file's tokenizer.ggml.* (infer/gguf_tokenizer.h); generation ends at its eos and eot
  // ids, else at `<|endoftext|>`.
  explicit TextCodec(const model::GgufFile& file);
  // add_special_tokens: the template's ids too (false for text that holds them already, as a
  // rendered chat template does).
  std::vector<int32_t> encode(const std::string& text, bool add_special_tokens = true) const;
  // Bytes of one token (a BPE token may end inside a UTF-8 character; join tokens before showing);
  // none for an id past the tokenizer's vocabulary (a model's padded rows).
  std::string decode(int32_t token) const;
  bool is_end_of_text(int32_t token) const;
  // The ids generation stops at (none without a tokenizer or eos_token_id).
  const std::vector<int32_t>& end_of_text() const { return end_of_text_; }
  // The id of a special token spelled `text` (a chat template's "<|im_end|>"), if the tokenizer has one.
  std::optional<int32_t> special_token(const std::string& text) const;

 private:
  std::optional<data::Tokenizer> tokenizer_;
  std::vector<int32_t> end_of_text_;
};

}  // namespace paraflow::infer
