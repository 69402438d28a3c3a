// paraflow quantize: a model dir written as a GGUF file with quantized matrices, with its
// tokenizer (vocab.json + merges.txt, GPT-2's byte-level BPE) as tokenizer.ggml.*, so that
// llama.cpp and `paraflow generate/serve --model FILE` read it.
#include <fmt/format.h>

#include <filesystem>
#include <memory>

#include "base/error.h"
#include "base/file_io.h"
#include "base/json.h"
#include "cli/commands.h"
#include "model/gguf_model.h"

namespace paraflow::cli {

namespace {

struct QuantizeOptions {
  std::string model_dir, type = "q8_0", out;
};

// The dir's vocab.json and merges.txt as GGUF's gpt2 tokenizer keys (none without them).
std::vector<std::pair<std::string, model::GgufValue>> tokenizer_metadata(const std::filesystem::path& dir) {
  if (!std::filesystem::exists(dir / "vocab.json") || !std::filesystem::exists(dir / "merges.txt")) {
    fmt::print(stderr, "{}: no vocab.json + merges.txt; the GGUF file gets no tokenizer\n", dir.string());
    return {};
  }
  const std::string vocab_path = (dir / "vocab.json").string();
  const nlohmann::json vocab = parse_json(read_file(dir / "vocab.json"), vocab_path);
  check(vocab.is_object(), "{}: not a JSON object of token -> id", vocab_path);
  std::vector<std::string> tokens(vocab.size());
  std::vector<int32_t> types(vocab.size(), 1);  // NORMAL
  for (const auto& [token, id] : vocab.items()) {
    check(id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<size_t>() < tokens.size(),
          "{}: token \"{}\": id {} outside [0, {})", vocab_path, token, id.dump(), tokens.size());
    tokens[id.get<size_t>()] = token;
    if (token == "<|endoftext|>") types[id.get<size_t>()] = 3;  // CONTROL
  }
  std::vector<std::string> merges;
  const std::string text = read_file(dir / "merges.txt");
  for (size_t begin = 0; begin < text.size();) {
    size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(begin, end - begin);
    begin = end + 1;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (!line.empty() && !line.starts_with("#version")) merges.push_back(line);
  }
  return {{"tokenizer.ggml.model", model::gguf_string("gpt2")},
          {"tokenizer.ggml.tokens", model::gguf_strings(tokens)},
          {"tokenizer.ggml.token_type", model::gguf_i32s(types)},
          {"tokenizer.ggml.merges", model::gguf_strings(merges)}};
}

void run_quantize(const QuantizeOptions& options) {
  const model::LoadedModel model = model::load_model_dir(options.model_dir, cpu_backend());
  model::save_gguf_model(options.out, model.config, model.parameters, parse_dtype(options.type, "--type"),
                         tokenizer_metadata(options.model_dir));
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
  command->add_option("--type", options->type, "The matrices' type (vectors are float32)")->capture_default_str()->check(CLI::IsMember({"q8_0", "f16", "bf16", "f32"}));
  command->add_option("--out", options->out, "The GGUF file to write")->required();
  command->callback([options] { run_quantize(*options); });
}

}  // namespace paraflow::cli
