// Model directories in Hugging Face layout: config.json + model.safetensors. GPT-2: GPT2Model
// tensor names and Conv1D [in, out] weights (`transformer.`-prefixed GPT2LMHeadModel names with
// lm_head.weight when the head is untied); the Llama family: LlamaForCausalLM's (Mistral's and
// Qwen2's are the same) with nn.Linear [out, in] weights. We write what transformers loads, and
// load what it saves.
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "model/gpt_config.h"
#include "model/parameters.h"
#include "model/slice_index.h"

namespace paraflow::model {

struct LoadedModel {
  GptConfig config;
  ParameterSet parameters;
};

// The parameters as Hugging Face's files name and shape them: (name, view) pairs, a fused tensor
// (TensorSpec::stored_as) as views of its row blocks.
std::vector<std::pair<std::string, Tensor>> hf_tensors(const ParameterSet& parameters);

// Writes config.json and model.safetensors into `dir` (created if needed), each atomically;
// `end_of_text`: the tokenizer's end-of-text id, or -1 (see GptConfig::to_hf_json).
void save_model_dir(const std::filesystem::path& dir, const GptConfig& config, const ParameterSet& parameters,
                    int64_t end_of_text = -1);

// How save_model_dir lays out the whole model of `specs` in model.safetensors, in file order:
// each stored tensor's name there, and which box of which of our tensors it is (a fused tensor is
// several, one per part).
struct HfStoredTensor {
  std::string stored_name, tensor;
  TensorSlice slice;
};
std::vector<HfStoredTensor> hf_layout(const GptConfig& config, const std::vector<TensorSpec>& specs);

// Writes what save_model_dir writes, byte for byte, from the whole model's tensors in `reader`
// (however they are sliced there), one tensor at a time: no more than one in memory.
void export_model_dir(const std::filesystem::path& dir, const GptConfig& config, SliceReader& reader,
                      int64_t end_of_text = -1);

// Reads a model dir, or a GGUF file (model/gguf_model.h); every error names the file and the
// tensor or field at fault. Where model.safetensors holds the tensors as f32 in their order (as
// save_model_dir and export_model_dir write them) and `backend` computes on host memory, the
// parameters are views of a read-only mapping of the file: nothing is copied, only the pages read
// are resident, and they must never be written. Otherwise they are read into memory.
LoadedModel load_model_dir(const std::filesystem::path& dir, Backend& backend);

// Loads tensors named like `specs` from a safetensors file into `parameters` (a missing or
// extra tensor is an error; HF's attention-mask buffers and a tied lm_head are accepted). The
// file is mapped and read tensor by tensor: the load's peak holds the weights once, plus a tensor.
void load_parameters(const std::filesystem::path& file, ParameterSet& parameters, const std::string& name_prefix = "");

}  // namespace paraflow::model
