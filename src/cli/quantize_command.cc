// paraflow quantize: a model dir (GPT-2 or the Llama family) written as a GGUF file as llama.cpp's
// converter writes it, its matrices in the chosen type, with its tokenizer as tokenizer.ggml.*, so
// that llama.cpp and `paraflow generate/serve --model FILE` read it.
#include <fmt/format.h>

#include <filesystem>
#include <memory>

#include "base/error.h"
#include "cli/commands.h"
#include "data/tokenizer.h"
#include "infer/gguf_tokenizer.h"
#include "infer/text_codec.h"
#include "model/gguf_model.h"

namespace paraflow::cli {

namespace {

struct QuantizeOptions {
  std::string model_dir, type = "q8_0", out;
};

// Tokens up to the embedding's `rows`, as the converter pads them (Qwen2.5's 151936 rows hold
// 151646 tokens; llama.cpp refuses a file whose token_embd has more rows than it has tokens):
// unused tokens "[PAD<id>]" for a byte-level BPE, "[PAD1]", "[PAD2]", ... scored -1000 for a
// SentencePiece-style vocabulary.
void pad_tokens(data::GgufVocabulary& vocabulary, int64_t rows) {
  constexpr int32_t kUnused = 5;
  const size_t tokens = vocabulary.tokens.size();
  for (size_t id = tokens; id < static_cast<size_t>(rows); ++id) {
    vocabulary.tokens.push_back(fmt::format("[PAD{}]", vocabulary.model == "llama" ? id - tokens + 1 : id));
    vocabulary.token_types.push_back(kUnused);
    if (vocabulary.model == "llama") vocabulary.scores.push_back(-1000.0f);
  }
}

// The dir's tokenizer as GGUF's tokenizer.ggml.* keys (none without one): a byte-level BPE as
// the converter's gpt2 vocabulary, a SentencePiece-style one as its llama vocabulary, padded to
// the model's `vocab_size`; the EOS id generation stops at (generation_config.json's,
// config.json's, or <|endoftext|>), and the chat template as tokenizer.chat_template.
std::vector<std::pair<std::string, model::GgufValue>> tokenizer_metadata(const std::filesystem::path& dir, int64_t vocab_size) {
  if (!data::Tokenizer::present_in(dir)) {
    fmt::print(stderr, "{}: no tokenizer files; the GGUF file gets no tokenizer\n", dir.string());
    return {};
  }
  data::GgufVocabulary vocabulary = data::Tokenizer::load(dir).gguf_vocabulary();
  pad_tokens(vocabulary, vocab_size);
  const infer::TextCodec codec(dir);
  if (vocabulary.eos < 0 && !codec.end_of_text().empty()) vocabulary.eos = codec.end_of_text().front();
  std::vector<std::pair<std::string, model::GgufValue>> metadata = infer::gguf_vocabulary_metadata(vocabulary);
  if (const std::optional<infer::ChatTemplate> chat = infer::ChatTemplate::load(dir)) {
    metadata.emplace_back("tokenizer.chat_template", model::gguf_string(chat->source()));
  }
  return metadata;
}

void run_quantize(const QuantizeOptions& options) {
  const model::LoadedModel model = model::load_model_dir(options.model_dir, cpu_backend());
  model::save_gguf_model(options.out, model.config, model.parameters, parse_dtype(options.type, "--type"),
                         tokenizer_metadata(options.model_dir, model.config.vocab_size));
  fmt::print("{}: {} weights, {} bytes\n", options.out, options.type, std::filesystem::file_size(options.out));
}

}  // namespace

void add_quantize_command(CLI::App& app) {
  auto options = std::make_shared<QuantizeOptions>();
  CLI::App* command = app.add_subcommand(
      "quantize", "Write a model dir (GPT-2 or the Llama family) as a GGUF file (llama.cpp and paraflow read it)");
  command->add_option("--model", options->model_dir, "Model dir (Hugging Face layout, with its tokenizer)")
      ->required()
      ->check(CLI::ExistingDirectory);
  command->add_option("--type", options->type,
                      "The matrices' type, the head's too (q4_k as llama-quantize --pure writes: Q5_0 where rows are not whole "
                      "256-value super-blocks; vectors are float32)")
      ->capture_default_str()
      ->check(CLI::IsMember({"q8_0", "q4_k", "f16", "bf16", "f32"}));
  command->add_option("--out", options->out, "The GGUF file to write")->required();
  command->callback([options] { run_quantize(*options); });
}

}  // namespace paraflow::cli
