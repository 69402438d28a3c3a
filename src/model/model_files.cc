#include "model/model_files.h"

#include <nlohmann/json.hpp>

#include <set>

#include "base/error.h"
#include "base/json.h"
#include "base/file_io.h"
#include "model/safetensors.h"

namespace paraflow::model {

namespace {

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

void save_model_dir(const std::filesystem::path& dir, const GptConfig& config, const ParameterSet& device_parameters,
                    int64_t end_of_text) {
  const ParameterSet parameters = device_parameters.on_host();
  std::filesystem::create_directories(dir);
  write_file_atomic(dir / "config.json", config.to_hf_json(end_of_text).dump(2) + "\n");
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (size_t i = 0; i < parameters.specs().size(); ++i) tensors.emplace_back(parameters.specs()[i].name, parameters.at(i));
  // transformers requires metadata format=pt when __metadata__ is present.
  write_file_atomic(dir / "model.safetensors", serialize_safetensors(tensors, {{"format", "pt"}}));
}

namespace {

void read_parameters(const SafetensorsFile& weights, const std::filesystem::path& file, ParameterSet& parameters,
                     const std::string& name_prefix) {
  // GPT2LMHeadModel saves `transformer.`-prefixed names; GPT2Model saves bare ones.
  std::string prefix = name_prefix;
  if (prefix.empty() && !weights.contains("wte.weight") && weights.contains("transformer.wte.weight")) {
    prefix = "transformer.";
  }
  std::set<std::string> expected;
  for (const TensorSpec& spec : parameters.specs()) {
    std::string name = prefix + spec.name;
    check(weights.contains(name), "{}: missing tensor '{}'", file.string(), name);
    weights.read_into(name, parameters.get(spec.name));
    expected.insert(name);
  }
  for (const auto& [name, entry] : weights.entries()) {
    if (expected.count(name)) continue;
    // Causal-mask buffers that older transformers versions saved; not parameters.
    if (ends_with(name, ".attn.bias") || ends_with(name, ".attn.masked_bias")) continue;
    if (name == "lm_head.weight") {
      // A tied head must equal the embedding table; an untied one we cannot represent.
      Tensor head = Tensor::zeros(entry.shape, DType::f32);
      weights.read_into(name, head);
      const Tensor& wte = parameters.get("wte.weight");
      check(head.shape() == wte.shape() && std::equal(head.data<float>(), head.data<float>() + head.numel(), wte.data<float>()),
            "{}: lm_head.weight differs from wte.weight; paraflow supports tied embeddings only", file.string());
      continue;
    }
    fail("{}: unexpected tensor '{}' (not part of a GPT-2 model with this config)", file.string(), name);
  }
}

}  // namespace

void load_parameters(const std::filesystem::path& file, ParameterSet& device_parameters,
                     const std::string& name_prefix) {
  SafetensorsFile weights = SafetensorsFile::load(file.string());
  device_parameters.write_on_host([&](ParameterSet& parameters) { read_parameters(weights, file, parameters, name_prefix); });
}

LoadedModel load_model_dir(const std::filesystem::path& dir, Backend& backend) {
  std::filesystem::path config_path = dir / "config.json";
  check(std::filesystem::exists(config_path), "{}: not found (is '{}' a model directory?)", config_path.string(),
        dir.string());
  const nlohmann::json json = parse_json(read_file(config_path), config_path.string());
  LoadedModel loaded{GptConfig::from_hf_json(json, config_path.string()), {}};
  loaded.parameters = ParameterSet(gpt_tensor_specs(loaded.config), backend);
  load_parameters(dir / "model.safetensors", loaded.parameters);
  return loaded;
}

}  // namespace paraflow::model
