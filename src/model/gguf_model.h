// Models from GGUF files as llama.cpp's convert_hf_to_gguf.py writes them: GPT-2's (architecture
// `gpt2`: token_embd, position_embd, blk.N.attn_qkv / attn_output / ffn_up / ffn_down with [out,
// in] weights, the norms, output_norm, output) and the Llama family's (`llama` for Llama and
// Mistral, `qwen2`: model/gguf_llama.h), their tensors in F32, F16, BF16, Q8_0, Q4_K or Q5_0; which tensor is
// which parameter: model/gguf_tensors.h. The parameters are float32 (dequantized, GPT-2's linear
// weights transposed back to Hugging Face's Conv1D [in, out]); decoding them with --dtype q8_0 or
// q4_k reads the very blocks the file holds for its Q8_0 or Q4_K matrices (from the mapped file,
// not quantized again). Other architectures are refused naming
// general.architecture.
#pragma once

#include <filesystem>

#include "model/gguf.h"
#include "model/model_files.h"

namespace paraflow::model {

// Whether `path` names a GGUF file (a regular file whose first bytes are "GGUF").
bool is_gguf_file(const std::filesystem::path& path);

// Reads a model: its config from the {architecture}.* metadata, its parameters from the tensors.
// Errors name the file and the key or tensor at fault. The matrices are read from the mapping when
// needed (read_gguf_parameters), which the parameters keep alive.
LoadedModel load_gguf_model(const GgufFile& file, Backend& backend);

// Writes a model as llama.cpp's converter does (its metadata, tensor names and layouts; GPT-2's
// tied head written out as output.weight, Llama 3's rope_freqs), every matrix in `type` (f32,
// f16, bf16, or q8_0 / q4_k by ggml's reference quantizers) and every vector in F32, with `extra`
// metadata (the tokenizer's) after the model's.
void save_gguf_model(const std::filesystem::path& path, const GptConfig& config, const ParameterSet& parameters,
                     DType type, const std::vector<std::pair<std::string, GgufValue>>& extra);

// The key's value, which must be a positive integer; errors name the file and the key.
int64_t gguf_positive(const GgufFile& file, const std::string& key);

// A tensor's values as float32 (F32, F16, BF16, Q8_0, Q4_K or Q5_0), row-major in its shape.
std::vector<float> gguf_values(const Tensor& tensor);
// The same for `count` values from element `first` (a whole number of the type's blocks) into `out`.
void gguf_values(const Tensor& tensor, int64_t first, int64_t count, float* out);

}  // namespace paraflow::model
