// Which GGUF tensor holds each of our parameters, and how: llama.cpp's names (token_embd,
// blk.N.attn_q, ...) for Hugging Face's (hf_tensors' names: GPT2Model's, LlamaForCausalLM's), one
// table for both architectures. GPT-2's Conv1D weights are stored transposed ([out, in]); for GGUF
// architecture `llama` the converter permutes q_proj's and k_proj's rows from Hugging Face's
// rotate-half RoPE layout to GGML's interleaved pairs (convert_hf_to_gguf.py's LlamaModel.permute),
// undone here on read and redone on write (`qwen2` keeps Hugging Face's order: GGML's NEOX RoPE).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "model/gguf.h"
#include "model/gpt_config.h"
#include "model/parameters.h"

namespace paraflow::model {

// The general.architecture a model is written as: gpt2, llama (Llama and Mistral) or qwen2.
std::string gguf_architecture(const GptConfig& config);

enum class GgufLayout : uint8_t {
  same,        // row-major as ours
  transposed,  // a matrix stored [columns, rows] of ours
  rope_pairs,  // rows (or a bias's elements) in GGML's interleaved-pairs RoPE order, per head
};

struct GgufPlacement {
  std::string name;  // the GGUF tensor's name
  GgufLayout layout = GgufLayout::same;
  int64_t heads = 0;  // rope_pairs: the heads the rows are cut into
};

// Where the Hugging Face tensor `hf_name` of `config`'s model lies in a GGUF file.
GgufPlacement gguf_placement(const GptConfig& config, const std::string& hf_name);

// Every parameter read from `file`'s tensors (F32, F16, BF16, Q8_0, Q4_K or Q5_0, as float32), shapes
// checked; a tensor the model does not hold is an error naming it, but for `allowed_extra` (a tied
// head's copy, the llama3 rope_freqs). Errors name the file and the tensor. The matrices' values
// are read from the mapped file when needed (ParameterSet::read_from_file): a quantized decoding
// copy of the file's type takes its blocks as they are, and a matrix only such a copy reads is
// never held in float32.
void read_gguf_parameters(const GgufFile& file, const GptConfig& config, ParameterSet& parameters,
                          const std::vector<std::string>& allowed_extra);

// The parameters as GGUF tensors, in hf_tensors' order: matrices in `type` (f32, f16, bf16, q8_0
// or q4_k, each rounded or quantized as gguf-py or llama-quantize does; q4_k falling back to q5_0
// where rows are not whole super-blocks, as llama-quantize does, said on stderr), vectors in F32.
std::vector<std::pair<std::string, Tensor>> gguf_parameter_tensors(const GptConfig& config,
                                                                    const ParameterSet& host_parameters, DType type);

// Float32 values as a GGUF tensor of `shape` in `type` (the one switch over the types we write).
Tensor to_gguf_type(const std::vector<float>& values, const Shape& shape, DType type);

// llama.cpp's general.file_type (llama_ftype) for matrices in `type`.
uint32_t gguf_file_type(DType type);

}  // namespace paraflow::model
