#include "model/gguf_model.h"

#include <cstring>
#include <fstream>
#include <optional>

#include "base/error.h"
#include "model/gguf_llama.h"
#include "model/gguf_tensors.h"
#include "tensor/quantized.h"

namespace paraflow::model {

bool is_gguf_file(const std::filesystem::path& path) {
  if (!std::filesystem::is_regular_file(path)) return false;
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  return in.read(magic, 4) && std::memcmp(magic, "GGUF", 4) == 0;
}

void gguf_values(const Tensor& tensor, int64_t first, int64_t count, float* out) {
  stored_values_as_f32(tensor.dtype(), static_cast<const char*>(tensor.raw()) + dtype_bytes(tensor.dtype(), first), out,
                       count);
}

std::vector<float> gguf_values(const Tensor& tensor) {
  std::vector<float> values(static_cast<size_t>(tensor.numel()));
  gguf_values(tensor, 0, tensor.numel(), values.data());
  return values;
}

int64_t gguf_positive(const GgufFile& file, const std::string& key) {
  const int64_t value = file.value(key).as_int(file.path() + ": " + key);
  check(value > 0, "{}: {} is {}, expected a positive integer", file.path(), key, value);
  return value;
}

namespace {

// The head is tied when the file has no output.weight or one equal to token_embd (the converter
// writes GPT-2's tied head out as a copy).
bool head_is_tied(const GgufFile& file) {
  if (!file.contains_tensor("output.weight")) return true;
  const Tensor head = file.tensor("output.weight"), table = file.tensor("token_embd.weight");
  return head.dtype() == table.dtype() && head.shape() == table.shape() &&
         std::memcmp(head.raw(), table.raw(), head.nbytes()) == 0;
}

// GPT-2's config from the gpt2.* keys.
GptConfig gpt2_config_from_gguf(const GgufFile& file) {
  const std::string& where = file.path();
  GptConfig config;
  config.n_embd = gguf_positive(file, "gpt2.embedding_length");
  config.n_layer = gguf_positive(file, "gpt2.block_count");
  config.n_head = gguf_positive(file, "gpt2.attention.head_count");
  config.n_positions = gguf_positive(file, "gpt2.context_length");
  config.layer_norm_epsilon = file.value("gpt2.attention.layer_norm_epsilon").as_float(where + ": gpt2.attention.layer_norm_epsilon");
  check(config.n_embd % config.n_head == 0, "{}: gpt2.embedding_length {} is not a multiple of gpt2.attention.head_count {}",
        where, config.n_embd, config.n_head);
  if (file.contains("gpt2.feed_forward_length")) {
    const int64_t width = gguf_positive(file, "gpt2.feed_forward_length");
    check(width == 4 * config.n_embd, "{}: gpt2.feed_forward_length {} is not 4 x gpt2.embedding_length ({}), as GPT-2's is",
          where, width, 4 * config.n_embd);
  }
  const GgufTensorInfo& table = file.tensor_info("token_embd.weight");
  check(table.shape.rank() == 2 && table.shape[1] == config.n_embd, "{}: token_embd.weight {} is not [vocab, {}]", where,
        table.shape.to_string(), config.n_embd);
  config.vocab_size = table.shape[0];
  config.tie_word_embeddings = head_is_tied(file);
  return config;
}

std::vector<std::pair<std::string, GgufValue>> gpt2_gguf_metadata(const GptConfig& config) {
  return {
      {"general.architecture", gguf_string("gpt2")},
      {"gpt2.context_length", gguf_u32(static_cast<uint32_t>(config.n_positions))},
      {"gpt2.embedding_length", gguf_u32(static_cast<uint32_t>(config.n_embd))},
      {"gpt2.feed_forward_length", gguf_u32(static_cast<uint32_t>(4 * config.n_embd))},
      {"gpt2.block_count", gguf_u32(static_cast<uint32_t>(config.n_layer))},
      {"gpt2.attention.head_count", gguf_u32(static_cast<uint32_t>(config.n_head))},
      {"gpt2.attention.layer_norm_epsilon", gguf_f32(static_cast<float>(config.layer_norm_epsilon))},
  };
}

}  // namespace

LoadedModel load_gguf_model(const GgufFile& file, Backend& backend) {
  const std::string& where = file.path();
  const std::string architecture = file.value("general.architecture").as_string(where + ": general.architecture");
  check(architecture == "gpt2" || architecture == "llama" || architecture == "qwen2",
        "{}: general.architecture '{}': GGUF files of gpt2, llama (Llama, Mistral) and qwen2 are read", where, architecture);
  const GptConfig config = architecture == "gpt2" ? gpt2_config_from_gguf(file) : llama_config_from_gguf(file, architecture);
  LoadedModel loaded{config, ParameterSet::for_file_values(gpt_tensor_specs(config), backend)};
  // The converter writes GPT-2's tied head out as a copy; Llama 3's rope scaling is in rope_freqs
  // (read into the config).
  std::vector<std::string> extra;
  if (config.is_llama()) extra.push_back("rope_freqs.weight");
  if (config.tie_word_embeddings) extra.push_back("output.weight");
  read_gguf_parameters(file, config, loaded.parameters, extra);
  return loaded;
}

void save_gguf_model(const std::filesystem::path& path, const GptConfig& config, const ParameterSet& device_parameters,
                     DType type, const std::vector<std::pair<std::string, GgufValue>>& extra) {
  const ParameterSet parameters = device_parameters.on_host();
  std::vector<std::pair<std::string, GgufValue>> metadata =
      config.is_llama() ? llama_gguf_metadata(config) : gpt2_gguf_metadata(config);
  metadata.insert(metadata.begin() + 1, {"general.file_type", gguf_u32(gguf_file_type(type))});
  metadata.insert(metadata.end(), extra.begin(), extra.end());
  std::vector<std::pair<std::string, Tensor>> tensors;
  if (std::optional<Tensor> divisors = llama_rope_freqs(config)) tensors.emplace_back("rope_freqs.weight", *divisors);
  for (auto& tensor : gguf_parameter_tensors(config, parameters, type)) tensors.push_back(std::move(tensor));
  if (!config.is_llama() && config.tie_word_embeddings) {  // the converter writes GPT-2's tied head out
    const Tensor table = tensors.front().second;  // token_embd, wte's
    tensors.emplace_back("output.weight", table);
  }
  write_gguf(path, metadata, tensors);
}

}  // namespace paraflow::model
