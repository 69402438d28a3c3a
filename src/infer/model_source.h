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
// Jinja subset is refused naming its line. The weights are read from the mapped files when
// needed (model::load_model_dir, model::load_gguf_model).
ModelSource load_model_source(const std::filesystem::path& path, Backend& backend, bool chat_template = false);

}  // namespace paraflow::infer
