// A GGUF file's tokenizer.ggml.* keys and chat template, read into what data::Tokenizer::from_gguf
// builds a tokenizer from, and written from a tokenizer, as llama.cpp's converter names them:
// model, pre, tokens, token_type, merges or scores, bos / eos / unknown_token_id, add_bos_token,
// add_eos_token, add_space_prefix; and tokenizer.chat_template.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "data/tokenizer.h"
#include "infer/chat_template.h"
#include "model/gguf.h"

namespace paraflow::infer {

// None when the file has no tokenizer.ggml.model. Errors name the file and the key.
std::optional<data::GgufVocabulary> read_gguf_vocabulary(const model::GgufFile& file);

// The keys of `vocabulary`, in the converter's order.
std::vector<std::pair<std::string, model::GgufValue>> gguf_vocabulary_metadata(const data::GgufVocabulary& vocabulary);

// tokenizer.chat_template, with the BOS and EOS tokens' texts as its bos_token and eos_token; none
// without the key.
std::optional<ChatTemplate> gguf_chat_template(const model::GgufFile& file);

}  // namespace paraflow::infer
