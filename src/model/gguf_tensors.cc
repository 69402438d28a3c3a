#include "model/gguf_tensors.h"

#include <algorithm>
#include <cstring>
#include <map>
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

// Every matrix of ours as the file's tensors hold it (ParameterSet::read_from_file), by parameter
// name: a fused parameter's parts one after another, rope_pairs rows in Hugging Face's order, a
// transposed matrix as its transpose's rows. Not one whose parts are held in different
// orientations (none the converter writes).
std::map<std::string, FileTensor> file_matrices(const GgufFile& file, const GptConfig& config,
                                                const std::vector<TensorSpec>& specs) {
  std::map<std::string, FileTensor> matrices;
  for (const TensorSpec& spec : specs) {
    if (spec.shape.rank() != 2) continue;
    const std::vector<StoredPart> parts = stored_parts(spec);
    FileTensor matrix;
    std::set<bool> orientations;
    for (const StoredPart& part : parts) {
      const GgufPlacement placement = gguf_placement(config, part.name);
      FileTensor::Part held{file.tensor(placement.name), {}};
      if (placement.layout == GgufLayout::rope_pairs) {
        const size_t rows = static_cast<size_t>(held.rows.shape()[0]);
        held.file_row.resize(rows);
        for (size_t r = 0; r < rows; ++r) held.file_row[our_index(placement, r, 0, rows, 1)] = static_cast<int64_t>(r);
      }
      orientations.insert(placement.layout == GgufLayout::transposed);
      matrix.parts.push_back(std::move(held));
    }
    matrix.transposed = *orientations.begin();
    if (orientations.size() == 1 && (!matrix.transposed || parts.size() == 1)) matrices.emplace(spec.name, std::move(matrix));
  }
  return matrices;
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
                          const std::vector<std::string>& allowed_extra) {
  const std::string& where = file.path();
  std::set<std::string> read(allowed_extra.begin(), allowed_extra.end());
  std::map<std::string, FileTensor> matrices = file_matrices(file, config, device_parameters.specs());
  std::set<std::string> matrix_parts;  // the Hugging Face tensors of those, read from the file when needed
  for (const TensorSpec& spec : device_parameters.specs()) {
    if (!matrices.count(spec.name)) continue;
    for (const StoredPart& part : stored_parts(spec)) matrix_parts.insert(part.name);
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
      if (matrix_parts.count(hf_name)) continue;  // read from the file when needed
      // Row by row, a row moved whole (to its place among ours), or a transposed one column by column.
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
  for (auto& [name, matrix] : matrices) device_parameters.read_from_file(name, std::move(matrix));
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
