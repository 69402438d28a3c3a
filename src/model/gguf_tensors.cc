#include "model/gguf_tensors.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <set>

#include "base/error.h"
#include "model/gguf_model.h"
#include "model/model_files.h"
#include "tensor/quantized.h"

namespace paraflow::model {

std::string gguf_architecture(const GptConfig& config) {
  if (!config.is_llama()) return "gpt2";
  return config.model_type == "qwen2" ? "qwen2" : "llama";
}

namespace {

struct NamePair {
  const char* ours;
  const char* theirs;
};

// Outside the blocks; a name (less .weight / .bias) not listed is not part of a model.
constexpr NamePair kGlobalNames[] = {
    {"wte", "token_embd"},  {"wpe", "position_embd"}, {"ln_f", "output_norm"},
    {"model.embed_tokens", "token_embd"}, {"model.norm", "output_norm"}, {"lm_head", "output"},
};
// Inside block N ("h.N." or "model.layers.N." -> "blk.N.").
constexpr NamePair kBlockNames[] = {
    {"ln_1", "attn_norm"}, {"attn.c_attn", "attn_qkv"}, {"attn.c_proj", "attn_output"},
    {"ln_2", "ffn_norm"},  {"mlp.c_fc", "ffn_up"},     {"mlp.c_proj", "ffn_down"},
    {"input_layernorm", "attn_norm"}, {"self_attn.q_proj", "attn_q"}, {"self_attn.k_proj", "attn_k"},
    {"self_attn.v_proj", "attn_v"}, {"self_attn.o_proj", "attn_output"},
    {"post_attention_layernorm", "ffn_norm"}, {"mlp.gate_proj", "ffn_gate"}, {"mlp.up_proj", "ffn_up"},
    {"mlp.down_proj", "ffn_down"},
};

const char* lookup(const NamePair* begin, const NamePair* end, const std::string& ours, const std::string& hf_name) {
  const NamePair* found = std::find_if(begin, end, [&](const NamePair& pair) { return ours == pair.ours; });
  check(found != end, "GGUF: no llama.cpp name for tensor '{}'", hf_name);
  return found->theirs;
}

// Where element (r, c) of a GGUF tensor of `rows` x `columns` lies in ours (row-major).
// rope_pairs: GGUF row h*hs + 2i + j is Hugging Face's row h*hs + j*hs/2 + i.
size_t our_index(const GgufPlacement& placement, size_t r, size_t c, size_t rows, size_t columns) {
  switch (placement.layout) {
    case GgufLayout::same: break;
    case GgufLayout::transposed: return c * rows + r;
    case GgufLayout::rope_pairs: {
      const size_t head_size = rows / static_cast<size_t>(placement.heads);
      const size_t head = r / head_size, within = r % head_size;
      return (head * head_size + (within % 2) * (head_size / 2) + within / 2) * columns + c;
    }
  }
  return r * columns + c;
}

// The file's blocks of every matrix the file holds block-quantized (Q8_0, Q4_K, Q5_0), by
// parameter name, in the rows decoding stores ([out, in]: a transposed matrix's rows are the
// file's; rope_pairs rows moved back to Hugging Face's order, whole rows, so whole blocks), a fused
// parameter's parts one after another, and whether they are its transpose's rows.
std::map<std::string, std::pair<Tensor, bool>> file_matrix_blocks(const GgufFile& file, const GptConfig& config,
                                                                    const std::vector<TensorSpec>& specs) {
  std::map<std::string, std::pair<Tensor, bool>> kept_blocks;
  for (const TensorSpec& spec : specs) {
    if (spec.shape.rank() != 2) continue;
    std::vector<StoredPart> parts = spec.stored_as;
    if (parts.empty()) parts.push_back({spec.name, spec.shape[0]});
    std::vector<std::pair<GgufPlacement, Tensor>> tensors;
    for (const StoredPart& part : parts) {
      const GgufPlacement placement = gguf_placement(config, part.name);
      tensors.emplace_back(placement, file.tensor(placement.name));
    }
    const DType type = tensors.front().second.dtype();
    const bool transposed = tensors.front().first.layout == GgufLayout::transposed;
    const bool kept = is_block_quantized(type) && std::all_of(tensors.begin(), tensors.end(), [&](const auto& tensor) {
      return tensor.second.dtype() == type && (tensor.first.layout == GgufLayout::transposed) == transposed;
    });
    if (!kept || (transposed && tensors.size() > 1)) continue;
    Tensor blocks = Tensor::zeros(transposed ? Shape{spec.shape[1], spec.shape[0]} : spec.shape, type);
    const size_t row_bytes = blocks.nbytes() / static_cast<size_t>(blocks.shape()[0]);
    size_t first = 0;  // the part's first row in `blocks`
    for (const auto& [placement, tensor] : tensors) {
      const size_t rows = static_cast<size_t>(tensor.shape()[0]);
      for (size_t r = 0; r < rows; ++r) {
        const size_t row = placement.layout == GgufLayout::rope_pairs ? our_index(placement, r, 0, rows, 1) : r;
        std::memcpy(static_cast<char*>(blocks.raw()) + (first + row) * row_bytes,
                    static_cast<const char*>(tensor.raw()) + r * row_bytes, row_bytes);
      }
      first += rows;
    }
    kept_blocks.emplace(spec.name, std::pair{std::move(blocks), transposed});
  }
  return kept_blocks;
}

}  // namespace

GgufPlacement gguf_placement(const GptConfig& config, const std::string& hf_name) {
  const size_t dot = hf_name.rfind('.');
  check(dot != std::string::npos, "GGUF: tensor name '{}' has no .weight or .bias", hf_name);
  const std::string base = hf_name.substr(0, dot), kind = hf_name.substr(dot);
  const std::string prefix = config.block_prefix();
  if (!base.starts_with(prefix)) {
    return {lookup(std::begin(kGlobalNames), std::end(kGlobalNames), base, hf_name) + kind};
  }
  const size_t layer_end = base.find('.', prefix.size());
  check(layer_end != std::string::npos, "GGUF: tensor name '{}' has no layer", hf_name);
  const std::string layer = base.substr(prefix.size(), layer_end - prefix.size()), part = base.substr(layer_end + 1);
  GgufPlacement placement{"blk." + layer + "." + lookup(std::begin(kBlockNames), std::end(kBlockNames), part, hf_name) +
                          kind};
  const bool matrix = kind == ".weight";
  if (!config.is_llama() && matrix && part != "ln_1" && part != "ln_2") placement.layout = GgufLayout::transposed;
  if (gguf_architecture(config) == "llama" && (part == "self_attn.q_proj" || part == "self_attn.k_proj")) {
    placement.layout = GgufLayout::rope_pairs;
    placement.heads = part == "self_attn.q_proj" ? config.n_head : config.kv_heads();
  }
  return placement;
}

void read_gguf_parameters(const GgufFile& file, const GptConfig& config, ParameterSet& device_parameters,
                          const std::vector<std::string>& allowed_extra, std::optional<DType> decoding_weights) {
  const std::string& where = file.path();
  std::set<std::string> read(allowed_extra.begin(), allowed_extra.end());
  std::map<std::string, std::pair<Tensor, bool>> blocks = file_matrix_blocks(file, config, device_parameters.specs());
  // For quantized decoding, the matrices whose blocks its copy takes as they are (not the
  // embedding tables: the embedding reads their float values), as their Hugging Face parts.
  std::set<std::string> blocks_only, blocks_only_parts;
  for (const TensorSpec& spec : device_parameters.specs()) {
    const auto kept = blocks.find(spec.name);
    if (!decoding_weights || kept == blocks.end() || config.is_embedding_table(spec.name)) continue;
    const Tensor& file_blocks = kept->second.first;
    if (file_blocks.dtype() != quantized_type_for_rows(*decoding_weights, file_blocks.shape()[1])) continue;
    blocks_only.insert(spec.name);
    if (spec.stored_as.empty()) blocks_only_parts.insert(spec.name);
    for (const StoredPart& part : spec.stored_as) blocks_only_parts.insert(part.name);
  }
  device_parameters.write_on_host([&](ParameterSet& parameters) {
    for (auto& [hf_name, destination] : hf_tensors(parameters)) {
      const GgufPlacement placement = gguf_placement(config, hf_name);
      check(file.contains_tensor(placement.name), "{}: missing tensor '{}' (a {} of this config has it)", where,
            placement.name, gguf_architecture(config));
      const Tensor tensor = file.tensor(placement.name);
      const Shape& ours = destination.shape();
      const Shape expected = placement.layout == GgufLayout::transposed ? Shape{ours[1], ours[0]} : ours;
      check(tensor.shape() == expected, "{}: tensor '{}' is {}, expected {} for this config", where, placement.name,
            tensor.shape().to_string(), expected.to_string());
      read.insert(placement.name);
      if (blocks_only_parts.count(hf_name)) continue;  // its pages never written, never resident
      // Row by row, with no copy of the whole tensor's values (the embedding table's are 0.5 GB
      // in f32 at Qwen2.5-0.5B's size): a row moves whole (to its place among ours), or a
      // transposed one column by column.
      float* to = destination.data<float>();
      const size_t rows = static_cast<size_t>(expected[0]), columns = static_cast<size_t>(expected.numel()) / rows;
      const bool transposed = placement.layout == GgufLayout::transposed;
      std::vector<float> row(transposed ? columns : 0);
      for (size_t r = 0; r < rows; ++r) {
        const auto first = static_cast<int64_t>(r * columns), count = static_cast<int64_t>(columns);
        if (!transposed) {
          gguf_values(tensor, first, count, to + our_index(placement, r, 0, rows, columns));
          continue;
        }
        gguf_values(tensor, first, count, row.data());
        for (size_t c = 0; c < columns; ++c) to[our_index(placement, r, c, rows, columns)] = row[c];
      }
    }
  });
  for (auto& [name, kept] : blocks) {
    if (blocks_only.count(name)) device_parameters.keep_file_blocks_only(name, std::move(kept.first), kept.second);
    else device_parameters.keep_file_blocks(name, std::move(kept.first), kept.second);
  }
  for (const GgufTensorInfo& info : file.tensors()) {
    check(read.count(info.name) > 0, "{}: unexpected tensor '{}' (not part of a {} of this config)", where, info.name,
          gguf_architecture(config));
  }
}

Tensor to_gguf_type(const std::vector<float>& values, const Shape& shape, DType type) {
  Tensor out = Tensor::zeros(shape, type);
  switch (type) {
    case DType::f32: std::copy(values.begin(), values.end(), out.data<float>()); break;
    case DType::f16:
    case DType::bf16: {
      auto* bits = static_cast<uint16_t*>(out.raw());
      for (size_t i = 0; i < values.size(); ++i) bits[i] = type == DType::f16 ? f32_to_f16(values[i]) : f32_to_bf16(values[i]);
      break;
    }
    case DType::q8_0:
    case DType::q4_k:
    case DType::q5_0:
      check(shape[shape.rank() - 1] % dtype_block_elements(type) == 0, "GGUF write: rows of {} are not whole {} blocks of {}",
            shape.to_string(), dtype_name(type), dtype_block_elements(type));
      quantize_blocks(type, values.data(), out.raw(), static_cast<int64_t>(values.size()));
      break;
    default: fail("GGUF write: matrices in f32, f16, bf16, q8_0, q4_k or q5_0 (got {})", dtype_name(type));
  }
  return out;
}

uint32_t gguf_file_type(DType type) {
  switch (type) {
    case DType::f32: return 0;   // LLAMA_FTYPE_ALL_F32
    case DType::f16: return 1;   // MOSTLY_F16
    case DType::q8_0: return 7;  // MOSTLY_Q8_0
    case DType::q4_k: return 15;  // MOSTLY_Q4_K_M (every matrix Q4_K, as llama-quantize --pure)
    case DType::bf16: return 32;  // MOSTLY_BF16
    default: fail("GGUF write: matrices in f32, f16, bf16, q8_0 or q4_k (got {})", dtype_name(type));
  }
}

std::vector<std::pair<std::string, Tensor>> gguf_parameter_tensors(const GptConfig& config,
                                                                    const ParameterSet& parameters, DType type) {
  gguf_file_type(type);  // refuses an unwritable type before any work
  std::vector<std::pair<std::string, Tensor>> tensors;
  std::vector<std::string> matrices;
  std::vector<DType> matrix_types;  // `type`, or its fallback (quantized_type_for_rows) as llama-quantize writes
  for (const auto& [hf_name, values] : hf_tensors(parameters)) {
    const GgufPlacement placement = gguf_placement(config, hf_name);
    const Shape& shape = values.shape();
    const Shape stored = placement.layout == GgufLayout::transposed ? Shape{shape[1], shape[0]} : shape;
    const size_t rows = static_cast<size_t>(stored[0]), columns = static_cast<size_t>(values.numel()) / rows;
    std::vector<float> laid_out(static_cast<size_t>(values.numel()));
    const float* from = values.data<float>();
    for (size_t r = 0; r < rows; ++r) {
      for (size_t c = 0; c < columns; ++c) laid_out[r * columns + c] = from[our_index(placement, r, c, rows, columns)];
    }
    DType tensor_type = DType::f32;
    if (shape.rank() > 1) {
      tensor_type = quantized_type_for_rows(type, stored[stored.rank() - 1]);
      matrices.push_back(placement.name);
      matrix_types.push_back(tensor_type);
    }
    tensors.emplace_back(placement.name, to_gguf_type(laid_out, stored, tensor_type));
  }
  report_quantization_fallbacks(type, matrices, matrix_types);
  return tensors;
}

}  // namespace paraflow::model
