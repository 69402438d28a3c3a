#include "model/parameters.h"

#include <cmath>
#include <tuple>

#include "backend/kernel_args.h"
#include "base/error.h"
#include "tensor/quantized.h"

namespace paraflow::model {

namespace {

// LlamaForCausalLM's tensors (nn.Linear weights [out, in]), q, k and v fused into one projection.
std::vector<TensorSpec> llama_tensor_specs(const GptConfig& config, bool decay_embeddings) {
  const int64_t C = config.n_embd, F = config.mlp_width(), hs = config.head_size();
  const int64_t q_rows = config.n_head * hs, kv_rows = config.kv_heads() * hs;
  std::vector<TensorSpec> specs{{"model.embed_tokens.weight", Shape{config.vocab_size, C}, Init::normal, decay_embeddings}};
  for (int64_t layer = 0; layer < config.n_layer; ++layer) {
    const std::string prefix = "model.layers." + std::to_string(layer) + ".";
    const std::string attention = prefix + "self_attn.", mlp = prefix + "mlp.";
    auto parts = [&](const std::string& suffix) {
      return std::vector<StoredPart>{{attention + "q_proj." + suffix, q_rows},
                                     {attention + "k_proj." + suffix, kv_rows},
                                     {attention + "v_proj." + suffix, kv_rows}};
    };
    specs.push_back({prefix + "input_layernorm.weight", Shape{C}, Init::ones, false});
    specs.push_back({attention + "qkv_proj.weight", Shape{config.qkv_width(), C}, Init::normal, true, parts("weight")});
    if (config.attention_bias || config.qkv_bias) {
      specs.push_back({attention + "qkv_proj.bias", Shape{config.qkv_width()}, Init::zeros, false, parts("bias")});
    }
    specs.push_back({attention + "o_proj.weight", Shape{C, q_rows}, Init::normal, true});
    if (config.attention_bias) specs.push_back({attention + "o_proj.bias", Shape{C}, Init::zeros, false});
    specs.push_back({prefix + "post_attention_layernorm.weight", Shape{C}, Init::ones, false});
    for (const auto& [name, out, in] : {std::tuple{"gate_proj", F, C}, std::tuple{"up_proj", F, C},
                                        std::tuple{"down_proj", C, F}}) {
      specs.push_back({mlp + name + ".weight", Shape{out, in}, Init::normal, true});
      if (config.mlp_bias) specs.push_back({mlp + name + ".bias", Shape{out}, Init::zeros, false});
    }
  }
  specs.push_back({"model.norm.weight", Shape{C}, Init::ones, false});
  return specs;
}

}  // namespace

std::vector<TensorSpec> gpt_tensor_specs(const GptConfig& config, bool decay_embeddings) {
  std::vector<TensorSpec> specs =
      config.is_llama() ? llama_tensor_specs(config, decay_embeddings) : gpt2_tensor_specs(config, decay_embeddings);
  if (!config.tie_word_embeddings) {
    specs.push_back({"lm_head.weight", Shape{config.vocab_size, config.n_embd}, Init::normal, true});
  }
  return specs;
}

std::string embedding_table_name(const GptConfig& config) {
  return config.is_llama() ? "model.embed_tokens.weight" : "wte.weight";
}

std::string lm_head_name(const GptConfig& config) {
  return config.tie_word_embeddings ? embedding_table_name(config) : "lm_head.weight";
}

std::vector<TensorSpec> gpt2_tensor_specs(const GptConfig& config, bool decay_embeddings) {
  const int64_t C = config.n_embd;
  std::vector<TensorSpec> specs{
      {"wte.weight", Shape{config.vocab_size, C}, Init::normal, decay_embeddings},
      {"wpe.weight", Shape{config.n_positions, C}, Init::normal, decay_embeddings},
  };
  for (int64_t layer = 0; layer < config.n_layer; ++layer) {
    std::string prefix = "h." + std::to_string(layer) + ".";
    std::vector<TensorSpec> block{
        {prefix + "ln_1.weight", Shape{C}, Init::ones, false},
        {prefix + "ln_1.bias", Shape{C}, Init::zeros, false},
        {prefix + "attn.c_attn.weight", Shape{C, 3 * C}, Init::normal, true},
        {prefix + "attn.c_attn.bias", Shape{3 * C}, Init::zeros, false},
        {prefix + "attn.c_proj.weight", Shape{C, C}, Init::residual_projection, true},
        {prefix + "attn.c_proj.bias", Shape{C}, Init::zeros, false},
        {prefix + "ln_2.weight", Shape{C}, Init::ones, false},
        {prefix + "ln_2.bias", Shape{C}, Init::zeros, false},
        {prefix + "mlp.c_fc.weight", Shape{C, 4 * C}, Init::normal, true},
        {prefix + "mlp.c_fc.bias", Shape{4 * C}, Init::zeros, false},
        {prefix + "mlp.c_proj.weight", Shape{4 * C, C}, Init::residual_projection, true},
        {prefix + "mlp.c_proj.bias", Shape{C}, Init::zeros, false},
    };
    specs.insert(specs.end(), block.begin(), block.end());
  }
  specs.push_back({"ln_f.weight", Shape{C}, Init::ones, false});
  specs.push_back({"ln_f.bias", Shape{C}, Init::zeros, false});
  return specs;
}

std::vector<TensorSpec> stage_tensor_specs(const std::vector<TensorSpec>& specs, const LayerRange& range) {
  std::vector<TensorSpec> held;
  for (const TensorSpec& spec : specs) {
    bool holds = false;
    if (spec.name.rfind("h.", 0) == 0) {
      holds = range.holds_layer(std::stoll(spec.name.substr(2, spec.name.find('.', 2) - 2)));
    } else if (spec.name.rfind("wte.", 0) == 0) {
      holds = range.first || range.last;
    } else if (spec.name.rfind("wpe.", 0) == 0) {
      holds = range.first;
    } else {  // ln_f
      holds = range.last;
    }
    if (holds) held.push_back(spec);
  }
  return held;
}

namespace {

bool ends_with(const std::string& name, const std::string& suffix) {
  return name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// How a tensor is split across tensor-parallel shards.
struct Split {
  enum Kind : uint8_t { whole, columns, rows } kind = whole;
  int64_t sections = 1;  // columns: independent blocks of columns (qkv: 3), each split alike
};

Split split_of(const std::string& name) {
  if (ends_with(name, "attn.c_attn.weight") || ends_with(name, "attn.c_attn.bias")) return {Split::columns, 3};
  if (ends_with(name, "mlp.c_fc.weight") || ends_with(name, "mlp.c_fc.bias")) return {Split::columns, 1};
  if (ends_with(name, "attn.c_proj.weight") || ends_with(name, "mlp.c_proj.weight")) return {Split::rows, 1};
  if (name == "wte.weight") return {Split::rows, 1};  // the vocabulary
  return {};
}

}  // namespace

bool is_partial_gradient(const std::string& name) {
  return ends_with(name, "attn.c_proj.bias") || ends_with(name, "mlp.c_proj.bias") || name == "wpe.weight";
}

bool is_replicated(const std::string& name) { return split_of(name).kind == Split::whole; }

std::vector<TensorSpec> shard_tensor_specs(const std::vector<TensorSpec>& specs, const TensorShard& shard) {
  std::vector<TensorSpec> sharded = specs;
  for (TensorSpec& spec : sharded) {
    const Split split = split_of(spec.name);
    if (split.kind == Split::whole) continue;
    // A 1-D bias is one row of columns.
    const size_t dim = split.kind == Split::rows ? 0 : spec.shape.rank() - 1;
    check(spec.name != "wte.weight" || spec.shape[0] % shard.size == 0,
          "model.vocab_size ({}) is not a multiple of dist.tensor_parallel ({}): the vocabulary is split evenly "
          "over the shards (pad it, as GPT-2's 50257 pads to 50304)",
          spec.shape[0], shard.size);
    check(spec.shape[dim] % (split.sections * shard.size) == 0,
          "dist.tensor_parallel ({}) does not divide {}'s {} ({})", shard.size, spec.name,
          split.kind == Split::rows ? "rows" : "columns", spec.shape[dim] / split.sections);
    std::vector<int64_t> dims = spec.shape.dims();
    dims[dim] /= shard.size;
    spec.shape = Shape(dims);
  }
  return sharded;
}

std::vector<TensorSpec> part_tensor_specs(const std::vector<TensorSpec>& whole, const LayerRange& range,
                                          const TensorShard& shard) {
  return shard_tensor_specs(stage_tensor_specs(whole, range), shard);
}

int64_t element_count(const std::vector<TensorSpec>& specs) {
  int64_t count = 0;
  for (const TensorSpec& spec : specs) count += spec.shape.numel();
  return count;
}

std::vector<std::pair<int64_t, int64_t>> shard_runs(const TensorSpec& spec, const TensorShard& shard) {
  const Split split = split_of(spec.name);
  const int64_t numel = spec.shape.numel();
  if (split.kind == Split::whole || shard.size == 1) return {{0, numel}};
  const int64_t rows = spec.shape.rank() == 2 ? spec.shape[0] : 1, columns = numel / rows;
  if (split.kind == Split::rows) {
    const int64_t mine = rows / shard.size;
    return {{shard.rank * mine * columns, mine * columns}};
  }
  const int64_t section = columns / split.sections, mine = section / shard.size;
  std::vector<std::pair<int64_t, int64_t>> runs;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t s = 0; s < split.sections; ++s) runs.push_back({r * columns + s * section + shard.rank * mine, mine});
  }
  return runs;
}

ParameterSet::ParameterSet(std::vector<TensorSpec> specs, Backend& backend, DType dtype)
    : backend_(&backend), specs_(std::move(specs)) {
  int64_t total = 0;
  for (const TensorSpec& spec : specs_) {
    offsets_.push_back(total);
    total += spec.shape.numel();
  }
  flat_ = backend.empty(Shape{total}, dtype);
  for (size_t i = 0; i < specs_.size(); ++i) {
    views_.push_back(flat_.slice_flat(offsets_[i], specs_[i].shape.numel()).reshape(specs_[i].shape));
    index_[specs_[i].name] = i;
  }
}

const Tensor& ParameterSet::get(const std::string& name) const {
  auto found = index_.find(name);
  if (found == index_.end()) throw Error("model has no tensor named '" + name + "'");
  return views_[found->second];
}

void ParameterSet::assign_converted(const ParameterSet& source) {
  backend_->launch(Cast{.src = source.flat_, .dst = flat_});
}

ParameterSet ParameterSet::converted_copy(Backend& backend, DType dtype, const StoredLayouts& layouts,
                                          const std::set<std::string>* only) const {
  check(dtype == DType::bf16 || dtype == DType::f16 || dtype == DType::f32 || dtype == DType::q8_0,
        "converted_copy: {} is not f32, bf16, f16 or q8_0", dtype_name(dtype));
  std::vector<size_t> sources;  // indices into specs_ of the tensors copied
  std::vector<TensorSpec> specs;
  for (size_t i = 0; i < specs_.size(); ++i) {
    if (only != nullptr && !only->count(specs_[i].name)) continue;
    TensorSpec spec = specs_[i];
    if (layouts.transposed.count(spec.name)) spec.shape = Shape{spec.shape[1], spec.shape[0]};
    const bool interleaved = layouts.interleaved.count(spec.name) > 0, tiled = layouts.tiled.count(spec.name) > 0;
    check((!interleaved && !tiled) || spec.shape.rank() == 2,
          "converted_copy: {} {} cannot be stored interleaved or tiled (not 2-D)", spec.name, spec.shape.to_string());
    if (is_block_quantized(dtype)) {
      const int64_t block = dtype_block_elements(dtype), columns = spec.shape[spec.shape.rank() - 1];
      check(!interleaved && !tiled, "converted_copy: {} weights are read as blocks of rows, not interleaved or tiled ({})",
            dtype_name(dtype), spec.name);
      check(columns % block == 0, "{} {} cannot be quantized to {}: its rows of {} are not a whole number of {}-value blocks",
            spec.name, spec.shape.to_string(), dtype_name(dtype), columns, block);
    }
    sources.push_back(i);
    specs.push_back(std::move(spec));
  }
  const ParameterSet source = on_host();
  ParameterSet copy(std::move(specs), backend, dtype);
  copy.write_on_host([&](ParameterSet& host) {
    std::vector<float> stored;  // a quantized tensor's f32 values, in its stored layout
    for (size_t i = 0; i < sources.size(); ++i) {
      const float* from = source.at(sources[i]).data<float>();
      const std::string& name = specs_[sources[i]].name;
      const Shape& shape = specs_[sources[i]].shape;  // the source's
      const bool transpose = layouts.transposed.count(name) > 0;
      const bool interleave = layouts.interleaved.count(name) > 0;
      const bool tile = layouts.tiled.count(name) > 0;
      const int64_t rows = shape[0], columns = shape.numel() / rows;
      const int64_t stored_rows = transpose ? columns : rows, stored_columns = transpose ? rows : columns;
      auto write = [&](auto store) {
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t c = 0; c < columns; ++c) {
            const int64_t row = transpose ? c : r, column = transpose ? r : c;
            store(interleave ? interleaved_offset(row, column, stored_rows, stored_columns)
                  : tile     ? tiles_offset(row, column, stored_rows, stored_columns)
                             : row * stored_columns + column,
                  from[r * columns + c]);
          }
        }
      };
      switch (dtype) {
        case DType::f32: write([to = host.at(i).data<float>()](int64_t at, float value) { to[at] = value; }); break;
        case DType::bf16:
          write([to = host.at(i).data<uint16_t>()](int64_t at, float value) { to[at] = f32_to_bf16(value); });
          break;
        case DType::f16:
          write([to = host.at(i).data<uint16_t>()](int64_t at, float value) { to[at] = f32_to_f16(value); });
          break;
        default:  // q8_0: the stored rows in f32, then quantized block by block
          stored.resize(static_cast<size_t>(shape.numel()));
          write([&](int64_t at, float value) { stored[static_cast<size_t>(at)] = value; });
          quantize_q8_0(stored.data(), host.at(i).data<BlockQ8_0>(), shape.numel());
          break;
      }
    }
  });
  return copy;
}

ParameterSet ParameterSet::on_host() const {
  if (flat_.host_accessible()) return *this;
  ParameterSet copy(specs_, cpu_backend(), flat_.dtype());
  backend_->download(flat_, copy.flat_.raw());
  return copy;
}

void ParameterSet::write_on_host(const std::function<void(ParameterSet&)>& write) {
  if (flat_.host_accessible()) {
    write(*this);
    return;
  }
  ParameterSet copy(specs_, cpu_backend(), flat_.dtype());
  write(copy);
  backend_->upload(copy.flat_.raw(), flat_);
}

namespace {

void initialize_on_host(ParameterSet& parameters, const GptConfig& config, Rng& rng) {
  const double std_normal = 0.02;
  const double std_residual = 0.02 / std::sqrt(2.0 * static_cast<double>(config.n_layer));
  for (size_t i = 0; i < parameters.specs().size(); ++i) {
    const TensorSpec& spec = parameters.specs()[i];
    float* data = parameters.at(i).data<float>();
    int64_t n = spec.shape.numel();
    for (int64_t j = 0; j < n; ++j) {
      switch (spec.init) {
        case Init::normal: data[j] = static_cast<float>(rng.normal() * std_normal); break;
        case Init::residual_projection: data[j] = static_cast<float>(rng.normal() * std_residual); break;
        case Init::zeros: data[j] = 0.0f; break;
        case Init::ones: data[j] = 1.0f; break;
      }
    }
  }
}

}  // namespace

void initialize_gpt(ParameterSet& parameters, const GptConfig& config, Rng& rng) {
  parameters.write_on_host([&](ParameterSet& host) { initialize_on_host(host, config, rng); });
}

}  // namespace paraflow::model
