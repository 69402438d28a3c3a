#include "model/gguf_model.h"

#include <cstring>
#include <fstream>
#include <set>

#include "base/error.h"
#include "tensor/quantized.h"

namespace paraflow::model {

bool is_gguf_file(const std::filesystem::path& path) {
  if (!std::filesystem::is_regular_file(path)) return false;
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  return in.read(magic, 4) && std::memcmp(magic, "GGUF", 4) == 0;
}

std::vector<float> gguf_values(const Tensor& tensor) {
  std::vector<float> values(static_cast<size_t>(tensor.numel()));
  switch (tensor.dtype()) {
    case DType::f32: std::memcpy(values.data(), tensor.raw(), tensor.nbytes()); break;
    case DType::f16:
    case DType::bf16: {
      const auto* bits = static_cast<const uint16_t*>(tensor.raw());
      for (size_t i = 0; i < values.size(); ++i) values[i] = tensor.dtype() == DType::f16 ? f16_to_f32(bits[i]) : bf16_to_f32(bits[i]);
      break;
    }
    case DType::q8_0:
    case DType::q4_k: dequantize_blocks(tensor.dtype(), tensor.raw(), values.data(), tensor.numel()); break;
    default: fail("gguf_values: {} is not a GGUF tensor type we read", dtype_name(tensor.dtype()));
  }
  return values;
}

namespace {

// One of our parameters and the GGUF tensor it comes from; `transposed`: the file holds it [out,
// in] and we [in, out] (Hugging Face's Conv1D).
struct Source {
  std::string ours, theirs;
  bool transposed = false;
};

std::vector<Source> gpt2_sources(const GptConfig& config) {
  std::vector<Source> sources{{"wte.weight", "token_embd.weight"}, {"wpe.weight", "position_embd.weight"}};
  for (int64_t layer = 0; layer < config.n_layer; ++layer) {
    const std::string ours = fmt::format("h.{}.", layer), theirs = fmt::format("blk.{}.", layer);
    for (const char* part : {"weight", "bias"}) {
      const bool matrix = std::string(part) == "weight";
      sources.push_back({ours + "ln_1." + part, theirs + "attn_norm." + part});
      sources.push_back({ours + "attn.c_attn." + part, theirs + "attn_qkv." + part, matrix});
      sources.push_back({ours + "attn.c_proj." + part, theirs + "attn_output." + part, matrix});
      sources.push_back({ours + "ln_2." + part, theirs + "ffn_norm." + part});
      sources.push_back({ours + "mlp.c_fc." + part, theirs + "ffn_up." + part, matrix});
      sources.push_back({ours + "mlp.c_proj." + part, theirs + "ffn_down." + part, matrix});
    }
  }
  sources.push_back({"ln_f.weight", "output_norm.weight"});
  sources.push_back({"ln_f.bias", "output_norm.bias"});
  if (!config.tie_word_embeddings) sources.push_back({"lm_head.weight", "output.weight"});
  return sources;
}

int64_t positive(const GgufFile& file, const std::string& key) {
  const int64_t value = file.value(key).as_int(file.path() + ": " + key);
  check(value > 0, "{}: {} is {}, expected a positive integer", file.path(), key, value);
  return value;
}

// The head is tied when the file has no output.weight or one equal to token_embd (the converter
// writes GPT-2's tied head out as a copy).
bool head_is_tied(const GgufFile& file) {
  if (!file.contains_tensor("output.weight")) return true;
  const Tensor head = file.tensor("output.weight"), table = file.tensor("token_embd.weight");
  return head.dtype() == table.dtype() && head.shape() == table.shape() &&
         std::memcmp(head.raw(), table.raw(), head.nbytes()) == 0;
}

}  // namespace

LoadedModel load_gguf_model(const GgufFile& file, Backend& backend) {
  const std::string& where = file.path();
  const std::string architecture = file.value("general.architecture").as_string(where + ": general.architecture");
  check(architecture == "gpt2", "{}: general.architecture '{}': only 'gpt2' GGUF files are read", where, architecture);
  GptConfig config;
  config.n_embd = positive(file, "gpt2.embedding_length");
  config.n_layer = positive(file, "gpt2.block_count");
  config.n_head = positive(file, "gpt2.attention.head_count");
  config.n_positions = positive(file, "gpt2.context_length");
  config.layer_norm_epsilon = file.value("gpt2.attention.layer_norm_epsilon").as_float(where + ": gpt2.attention.layer_norm_epsilon");
  check(config.n_embd % config.n_head == 0, "{}: gpt2.embedding_length {} is not a multiple of gpt2.attention.head_count {}",
        where, config.n_embd, config.n_head);
  if (file.contains("gpt2.feed_forward_length")) {
    const int64_t width = positive(file, "gpt2.feed_forward_length");
    check(width == 4 * config.n_embd, "{}: gpt2.feed_forward_length {} is not 4 x gpt2.embedding_length ({}), as GPT-2's is",
          where, width, 4 * config.n_embd);
  }
  const GgufTensorInfo& table = file.tensor_info("token_embd.weight");
  check(table.shape.rank() == 2 && table.shape[1] == config.n_embd, "{}: token_embd.weight {} is not [vocab, {}]", where,
        table.shape.to_string(), config.n_embd);
  config.vocab_size = table.shape[0];
  config.tie_word_embeddings = head_is_tied(file);

  LoadedModel loaded{config, ParameterSet(gpt_tensor_specs(config), backend)};
  const std::vector<Source> sources = gpt2_sources(config);
  std::set<std::string> read;
  loaded.parameters.write_on_host([&](ParameterSet& parameters) {
    for (const Source& source : sources) {
      const Tensor& destination = parameters.get(source.ours);
      const Tensor tensor = file.tensor(source.theirs);
      const Shape& ours = destination.shape();
      const Shape expected = source.transposed ? Shape{ours[1], ours[0]} : ours;
      check(tensor.shape() == expected, "{}: tensor '{}' is {}, expected {} for this config", where, source.theirs,
            tensor.shape().to_string(), expected.to_string());
      const std::vector<float> values = gguf_values(tensor);
      float* to = destination.data<float>();
      if (!source.transposed) {
        std::copy(values.begin(), values.end(), to);
      } else {
        const int64_t rows = expected[0], columns = expected[1];
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t c = 0; c < columns; ++c) to[c * rows + r] = values[static_cast<size_t>(r * columns + c)];
        }
      }
      read.insert(source.theirs);
    }
  });
  if (config.tie_word_embeddings) read.insert("output.weight");
  for (const GgufTensorInfo& info : file.tensors()) {
    check(read.count(info.name) > 0, "{}: unexpected tensor '{}' (not part of a GPT-2 of this config)", where, info.name);
  }
  return loaded;
}

void save_gguf_model(const std::filesystem::path& path, const GptConfig& config, const ParameterSet& device_parameters,
                     DType type, const std::vector<std::pair<std::string, GgufValue>>& extra) {
  check(!config.is_llama(), "GGUF write: only GPT-2 models are written (not the Llama family's '{}')", config.model_type);
  check(is_block_quantized(type), "GGUF write: matrices in q8_0 or q4_k only (got {})", dtype_name(type));
  const ParameterSet parameters = device_parameters.on_host();
  std::vector<std::pair<std::string, GgufValue>> metadata{
      {"general.architecture", gguf_string("gpt2")},
      {"general.file_type", gguf_u32(type == DType::q8_0 ? 7 : 15)},  // llama_ftype MOSTLY_Q8_0, MOSTLY_Q4_K_M
      {"gpt2.context_length", gguf_u32(static_cast<uint32_t>(config.n_positions))},
      {"gpt2.embedding_length", gguf_u32(static_cast<uint32_t>(config.n_embd))},
      {"gpt2.feed_forward_length", gguf_u32(static_cast<uint32_t>(4 * config.n_embd))},
      {"gpt2.block_count", gguf_u32(static_cast<uint32_t>(config.n_layer))},
      {"gpt2.attention.head_count", gguf_u32(static_cast<uint32_t>(config.n_head))},
      {"gpt2.attention.layer_norm_epsilon", gguf_f32(static_cast<float>(config.layer_norm_epsilon))},
  };
  metadata.insert(metadata.end(), extra.begin(), extra.end());
  std::vector<Source> sources = gpt2_sources(config);
  if (config.tie_word_embeddings) sources.push_back({"wte.weight", "output.weight"});
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const Source& source : sources) {
    const Tensor& values = parameters.get(source.ours);
    const Shape& shape = values.shape();
    if (shape.rank() == 1) {
      tensors.emplace_back(source.theirs, values);
      continue;
    }
    // [out, in] rows, each quantized to blocks.
    const int64_t rows = source.transposed ? shape[1] : shape[0], columns = source.transposed ? shape[0] : shape[1];
    check(columns % dtype_block_elements(type) == 0, "GGUF write: {} {}: rows of {} are not whole {} blocks of {}",
          source.ours, shape.to_string(), columns, dtype_name(type), dtype_block_elements(type));
    std::vector<float> stored(static_cast<size_t>(rows * columns));
    const float* from = values.data<float>();
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < columns; ++c) {
        stored[static_cast<size_t>(r * columns + c)] = source.transposed ? from[c * rows + r] : from[r * columns + c];
      }
    }
    Tensor blocks = Tensor::zeros(Shape{rows, columns}, type);
    quantize_blocks(type, stored.data(), blocks.raw(), rows * columns);
    tensors.emplace_back(source.theirs, blocks);
  }
  write_gguf(path, metadata, tensors);
}

}  // namespace paraflow::model
