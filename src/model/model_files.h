// Model directories in Hugging Face GPT-2 layout: config.json + model.safetensors with GPT2Model
// tensor names and Conv1D [in, out] weights. We write what transformers loads, and load what it
// saves (bare GPT2Model keys or `transformer.`-prefixed GPT2LMHeadModel keys).
#pragma once

#include <filesystem>
#include <map>
#include <string>

#include "model/gpt_config.h"
#include "model/parameters.h"

namespace paraflow::model {

struct LoadedModel {
  GptConfig config;
  ParameterSet parameters;
};

// Writes config.json and model.safetensors into `dir` (created if needed), each atomically;
// `end_of_text`: the tokenizer's end-of-text id, or -1 (see GptConfig::to_hf_json).
void save_model_dir(const std::filesystem::path& dir, const GptConfig& config, const ParameterSet& parameters,
                    int64_t end_of_text = -1);

// Reads a model dir; every error names the file and the tensor or field at fault.
LoadedModel load_model_dir(const std::filesystem::path& dir, Backend& backend);

// Loads tensors named like `specs` from a safetensors file into `parameters` (a missing or
// extra tensor is an error; HF's attention-mask buffers and a tied lm_head are accepted).
void load_parameters(const std::filesystem::path& file, ParameterSet& parameters, const std::string& name_prefix = "");

}  // namespace paraflow::model
