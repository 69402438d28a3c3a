#include "model/model_files.h"

#include <nlohmann/json.hpp>

#include <optional>
#include <set>

#include "base/error.h"
#include "base/json.h"
#include "base/file_io.h"
#include "model/gguf_model.h"
#include "model/safetensors.h"

namespace paraflow::model {

namespace {

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

std::vector<std::pair<std::string, Tensor>> hf_tensors(const ParameterSet& parameters) {
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (size_t i = 0; i < parameters.specs().size(); ++i) {
    const TensorSpec& spec = parameters.specs()[i];
    if (spec.stored_as.empty()) {
      tensors.emplace_back(spec.name, parameters.at(i));
      continue;
    }
    const int64_t row = spec.shape.numel() / spec.shape[0];
    int64_t first = 0;
    for (const StoredPart& part : spec.stored_as) {
      const Shape shape = spec.shape.rank() == 1 ? Shape{part.rows} : Shape{part.rows, row};
      tensors.emplace_back(part.name, parameters.at(i).slice_flat(first * row, part.rows * row).reshape(shape));
      first += part.rows;
    }
    check(first == spec.shape[0], "{}: its parts hold {} rows of {}", spec.name, first, spec.shape[0]);
  }
  return tensors;
}

namespace {

// GPT2LMHeadModel's names for a GPT-2 with a head of its own: the body's under `transformer.`
// (transformers loads bare GPT2Model names only into a model without lm_head).
constexpr const char* kGpt2BodyPrefix = "transformer.";

std::string stored_name(const GptConfig& config, const std::string& name) {
  const bool prefixed = !config.is_llama() && !config.tie_word_embeddings && name != "lm_head.weight";
  return prefixed ? kGpt2BodyPrefix + name : name;
}

}  // namespace

std::vector<HfStoredTensor> hf_layout(const GptConfig& config, const std::vector<TensorSpec>& specs) {
  std::vector<HfStoredTensor> layout;
  for (const TensorSpec& spec : specs) {
    if (spec.stored_as.empty()) {
      layout.push_back({stored_name(config, spec.name), spec.name, TensorSlice::whole(spec.shape)});
      continue;
    }
    int64_t first = 0;
    for (const StoredPart& part : spec.stored_as) {
      TensorSlice rows = TensorSlice::whole(spec.shape);
      rows.offsets[0] = first;
      rows.lengths[0] = part.rows;
      layout.push_back({stored_name(config, part.name), spec.name, rows});
      first += part.rows;
    }
  }
  return layout;
}

void export_model_dir(const std::filesystem::path& dir, const GptConfig& config, SliceReader& reader,
                      int64_t end_of_text) {
  const std::vector<HfStoredTensor> layout = hf_layout(config, gpt_tensor_specs(config));
  std::vector<SafetensorsHeaderEntry> entries;
  for (const HfStoredTensor& stored : layout) entries.push_back({stored.stored_name, DType::f32, stored.slice.shape()});
  std::filesystem::create_directories(dir);
  write_file_atomic(dir / "config.json", config.to_hf_json(end_of_text).dump(2) + "\n");
  AtomicFileWriter weights(dir / "model.safetensors");
  weights.append(safetensors_header(entries, {{"format", "pt"}}));
  for (const HfStoredTensor& stored : layout) {
    const std::vector<float> values = reader.read(stored.tensor, stored.slice);
    weights.append(std::string_view(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float)));
  }
  weights.commit();
}

void save_model_dir(const std::filesystem::path& dir, const GptConfig& config, const ParameterSet& device_parameters,
                    int64_t end_of_text) {
  const ParameterSet parameters = device_parameters.on_host();
  std::filesystem::create_directories(dir);
  write_file_atomic(dir / "config.json", config.to_hf_json(end_of_text).dump(2) + "\n");
  // Tensor by tensor from the parameters (the file whole in memory would double the model's RSS).
  const std::vector<std::pair<std::string, Tensor>> tensors = hf_tensors(parameters);
  std::vector<SafetensorsHeaderEntry> entries;
  for (const auto& [name, tensor] : tensors) entries.push_back({stored_name(config, name), tensor.dtype(), tensor.shape()});
  AtomicFileWriter weights(dir / "model.safetensors");
  // transformers requires metadata format=pt when __metadata__ is present.
  weights.append(safetensors_header(entries, {{"format", "pt"}}));
  for (const auto& [name, tensor] : tensors) {
    weights.append(std::string_view(static_cast<const char*>(tensor.raw()), tensor.nbytes()));
  }
  weights.commit();
}

namespace {

// The prefix of the file's names for the body's tensors: GPT2LMHeadModel saves
// `transformer.`-prefixed names, GPT2Model bare ones.
std::string file_prefix(const SafetensorsFile& weights, const std::string& name_prefix) {
  if (name_prefix.empty() && !weights.contains("wte.weight") && weights.contains("transformer.wte.weight")) {
    return kGpt2BodyPrefix;
  }
  return name_prefix;
}

std::string file_name(const std::string& prefix, const std::string& bare_name) {
  return bare_name == "lm_head.weight" ? bare_name : prefix + bare_name;
}

// Refuses a tensor of the file that is not one of `expected`, but for HF's attention-mask buffers
// and a tied lm_head equal to the embedding table.
void check_no_other_tensors(const SafetensorsFile& weights, const std::filesystem::path& file,
                            const std::set<std::string>& expected, const ParameterSet& parameters) {
  const bool llama = !parameters.specs().empty() && parameters.specs()[0].name == "model.embed_tokens.weight";
  const std::string table = llama ? "model.embed_tokens.weight" : "wte.weight";
  for (const auto& [name, entry] : weights.entries()) {
    if (expected.count(name)) continue;
    // Causal-mask buffers that older transformers versions saved; not parameters.
    if (!llama && (ends_with(name, ".attn.bias") || ends_with(name, ".attn.masked_bias"))) continue;
    if (name == "lm_head.weight") {
      // A tied head must equal the embedding table (config.json's tie_word_embeddings false
      // gives the model a head of its own).
      Tensor head = Tensor::zeros(entry.shape, DType::f32);
      weights.read_into(name, head);
      const Tensor& embedding = parameters.get(table);
      check(head.shape() == embedding.shape() &&
                std::equal(head.data<float>(), head.data<float>() + head.numel(), embedding.data<float>()),
            "{}: lm_head.weight differs from {} but config.json ties them (tie_word_embeddings true)", file.string(),
            table);
      continue;
    }
    fail("{}: unexpected tensor '{}' (not part of a {} model with this config)", file.string(), name,
         llama ? "llama" : "GPT-2");
  }
}

// Reads the parameters from `weights`: every matrix whose parts the file maps in a type we read
// from it when needed (ParameterSet::read_from_file), so that one which only a decoding copy reads
// in another type is never held in f32 too; the rest now, each tensor's pages let go once read.
void read_parameters(const SafetensorsFile& weights, const std::filesystem::path& file, ParameterSet& parameters,
                     const std::string& name_prefix) {
  const std::string prefix = file_prefix(weights, name_prefix);
  std::map<std::string, FileTensor> matrices;
  std::set<std::string> matrix_parts;  // their Hugging Face names
  for (const TensorSpec& spec : parameters.specs()) {
    if (spec.shape.rank() != 2) continue;
    const std::vector<StoredPart> parts = stored_parts(spec);
    FileTensor matrix;
    for (const StoredPart& part : parts) {
      const std::string name = file_name(prefix, part.name);
      std::optional<Tensor> view = weights.contains(name) ? weights.mapped(name) : std::nullopt;
      if (!view) break;  // read now, which names what is missing
      const Shape expected{part.rows, spec.shape[1]};
      check(view->shape() == expected, "{}: tensor '{}' has shape {}, expected {}", file.string(), name,
            view->shape().to_string(), expected.to_string());
      matrix.parts.push_back({std::move(*view), {}});
    }
    if (matrix.parts.size() < parts.size()) continue;
    for (const StoredPart& part : parts) matrix_parts.insert(part.name);
    matrices.emplace(spec.name, std::move(matrix));
  }
  std::set<std::string> expected;
  parameters.write_on_host([&](ParameterSet& host) {
    for (const auto& [bare_name, tensor] : hf_tensors(host)) {
      const std::string name = file_name(prefix, bare_name);
      check(weights.contains(name), "{}: missing tensor '{}'", file.string(), name);
      expected.insert(name);
      if (matrix_parts.count(bare_name)) continue;
      weights.read_into(name, tensor);
      weights.release(name);
    }
  });
  for (auto& [name, matrix] : matrices) parameters.read_from_file(name, std::move(matrix));
  check_no_other_tensors(weights, file, expected, parameters);
}

// The tensors of `specs` as views of the mapped file, where it holds each as f32 values (a fused
// tensor's parts back to back, in order; transformers' own files sort their names, which keeps
// GPT-2's tensors whole but puts the Llama family's k_proj before q_proj). None otherwise: a
// bf16 file, say, is read as a copy.
std::optional<ParameterSet> map_parameters(const SafetensorsFile& weights, const std::filesystem::path& file,
                                           std::vector<TensorSpec> specs, Backend& backend) {
  const std::string prefix = file_prefix(weights, "");
  std::vector<Tensor> views;
  for (const TensorSpec& spec : specs) {
    const std::string first = file_name(prefix, spec.stored_as.empty() ? spec.name : spec.stored_as.front().name);
    if (!weights.contains(first)) return std::nullopt;  // the copying load names it
    std::optional<Tensor> view = weights.mapped_f32(weights.entry(first).begin, spec.shape.numel());
    if (!view) return std::nullopt;
    views.push_back(view->reshape(spec.shape));
  }
  ParameterSet mapped = ParameterSet::over_mapping(std::move(specs), backend, std::move(views));
  // Each stored tensor (a fused tensor's parts, each) is the f32 run of the file its view covers.
  std::set<std::string> expected;
  for (const auto& [bare_name, view] : hf_tensors(mapped)) {
    const std::string name = file_name(prefix, bare_name);
    if (!weights.contains(name)) return std::nullopt;
    const SafetensorsEntry& entry = weights.entry(name);
    const std::optional<Tensor> stored = weights.mapped_f32(entry.begin, view.numel());
    if (entry.dtype != DType::f32 || !(entry.shape == view.shape()) || !stored || stored->raw() != view.raw()) {
      return std::nullopt;
    }
    expected.insert(name);
  }
  check_no_other_tensors(weights, file, expected, mapped);
  return mapped;
}

// Whether the host reads `backend`'s tensors, so that it can compute on a file mapping's.
bool reads_host_memory(Backend& backend) { return backend.empty(Shape{1}, DType::f32).host_accessible(); }

}  // namespace

void load_parameters(const std::filesystem::path& file, ParameterSet& parameters, const std::string& name_prefix) {
  // Mapped, each tensor's pages let go once read: loading holds the weights once, not twice.
  read_parameters(SafetensorsFile::map(file.string()), file, parameters, name_prefix);
}

LoadedModel load_model_dir(const std::filesystem::path& dir, Backend& backend) {
  if (is_gguf_file(dir)) return load_gguf_model(GgufFile::open(dir), backend);
  std::filesystem::path config_path = dir / "config.json";
  check(std::filesystem::exists(config_path), "{}: not found (is '{}' a model directory?)", config_path.string(),
        dir.string());
  const nlohmann::json json = parse_json(read_file(config_path), config_path.string());
  LoadedModel loaded{GptConfig::from_hf_json(json, config_path.string()), {}};
  const std::filesystem::path file = dir / "model.safetensors";
  // Mapped once: computed on in place where it allows, else copied with each tensor's pages let go.
  const SafetensorsFile weights = SafetensorsFile::map(file.string());
  if (reads_host_memory(backend)) {
    std::optional<ParameterSet> mapped = map_parameters(weights, file, gpt_tensor_specs(loaded.config), backend);
    if (mapped) {
      loaded.parameters = std::move(*mapped);
      return loaded;
    }
  }
  loaded.parameters = ParameterSet::for_file_values(gpt_tensor_specs(loaded.config), backend);
  read_parameters(weights, file, loaded.parameters, "");
  return loaded;
}

}  // namespace paraflow::model
