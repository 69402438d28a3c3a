// What decoding reads from a model: a Hugging Face dir or a GGUF file, each read once (a GGUF file
// is mapped and parsed once for its weights, its tokenizer and its chat template).
#pragma once

#include <filesystem>
#include <optional>

#include "infer/chat_template.h"
#include "infer/text_codec.h"
#include "model/model_files.h"

namespace paraflow::infer {

struct ModelSource {
  model::LoadedModel model;
  TextCodec codec;
  std::optional<ChatTemplate> chat_template;  // only when asked for, and the source has one
};

// Errors name the file and the key, tensor or field; with `chat_template`, a template outside the
// Jinja subset is refused naming its line. A GGUF file read to decode in a block-quantized
// `decoding_weights` holds the matrices its blocks serve as they are only as those blocks
// (model::load_gguf_model); other uses need the model read with the default (float32).
ModelSource load_model_source(const std::filesystem::path& path, Backend& backend, bool chat_template = false,
                              DType decoding_weights = DType::f32);

}  // namespace paraflow::infer
