#include "infer/model_source.h"

#include "infer/gguf_tokenizer.h"
#include "model/gguf_model.h"

namespace paraflow::infer {

ModelSource load_model_source(const std::filesystem::path& path, Backend& backend, bool chat_template) {
  if (model::is_gguf_file(path)) {
    const model::GgufFile file = model::GgufFile::open(path);
    return {model::load_gguf_model(file, backend), TextCodec(file),
            chat_template ? gguf_chat_template(file) : std::nullopt};
  }
  return {model::load_model_dir(path, backend), TextCodec(path), chat_template ? ChatTemplate::load(path) : std::nullopt};
}

}  // namespace paraflow::infer
