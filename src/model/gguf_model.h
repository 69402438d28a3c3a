// GPT-2 models from GGUF files as llama.cpp's convert_hf_to_gguf.py writes them (architecture
// `gpt2`: token_embd, position_embd, blk.N.attn_qkv / attn_output / ffn_up / ffn_down with [out,
// in] weights, the norms, output_norm, output), their tensors in F32, F16, BF16, Q8_0 or Q4_K. The
// parameters are float32 (dequantized, the linear weights transposed back to Hugging Face's
// Conv1D [in, out]); decoding them with --dtype q8_0 quantizes the file's Q8_0 weights to the very
// blocks the file holds (ggml's quantizer gives back the blocks it made: each block's largest
// value is ±127 steps). Other architectures are refused naming general.architecture.
#pragma once

#include <filesystem>

#include "model/gguf.h"
#include "model/model_files.h"

namespace paraflow::model {

// Whether `path` names a GGUF file (a regular file whose first bytes are "GGUF").
bool is_gguf_file(const std::filesystem::path& path);

// Reads a GPT-2 model: its config from the gpt2.* metadata, its parameters from the tensors.
// Errors name the file and the key or tensor at fault.
LoadedModel load_gguf_model(const GgufFile& file, Backend& backend);

// Writes a GPT-2 as llama.cpp's converter does (its metadata, tensor names and [out, in]
// weights, the tied head written out as output.weight), every matrix in `type` (q8_0 or q4_k: ggml's
// reference quantizers) and every vector in F32, with `extra` metadata (the tokenizer's) after
// the model's. Refuses the Llama family, naming it.
void save_gguf_model(const std::filesystem::path& path, const GptConfig& config, const ParameterSet& parameters,
                     DType type, const std::vector<std::pair<std::string, GgufValue>>& extra);

// A tensor's values as float32 (F32, F16, BF16, Q8_0 or Q4_K), row-major in its shape.
std::vector<float> gguf_values(const Tensor& tensor);

}  // namespace paraflow::model
