#include "model/parameters.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>

#include "backend/kernel_args.h"
#include "backend/quantized_tiles.h"
#include "base/error.h"
#include "base/system_memory.h"
#include "model/part_slices.h"
#include "tensor/quantized.h"

namespace paraflow::model {

namespace {

constexpr const char* kVocabulary = "model.vocab_size";

// The token embedding table and an untied head: split by vocabulary rows.
TensorSplit vocabulary_rows(const GptConfig& config) {
  return {TensorSplit::rows, {{config.vocab_size, 1, kVocabulary}}};
}

// LlamaForCausalLM's tensors (nn.Linear weights [out, in]), q, k and v fused into one projection.
std::vector<TensorSpec> llama_tensor_specs(const GptConfig& config, bool decay_embeddings) {
  const int64_t C = config.n_embd, F = config.mlp_width(), hs = config.head_size();
  const int64_t q_rows = config.n_head * hs, kv_rows = config.kv_heads() * hs;
  const TensorSplit::Section q_heads{config.n_head, hs, "model.n_head"};
  const TensorSplit::Section kv_heads{config.kv_heads(), hs, "model.n_kv_head", true};
  const TensorSplit qkv{TensorSplit::rows, {q_heads, kv_heads, kv_heads}};
  const TensorSplit mlp_in{TensorSplit::rows, {{F, 1, "model.intermediate_size"}}};
  const TensorSplit partial{.partial_gradient = true};
  std::vector<TensorSpec> specs{{"model.embed_tokens.weight", Shape{config.vocab_size, C}, Init::normal,
                                 decay_embeddings, {}, vocabulary_rows(config)}};
  for (int64_t layer = 0; layer < config.n_layer; ++layer) {
    const std::string prefix = config.block_prefix() + std::to_string(layer) + ".";
    const std::string attention = prefix + "self_attn.", mlp = prefix + "mlp.";
    auto parts = [&](const std::string& suffix) {
      return std::vector<StoredPart>{{attention + "q_proj." + suffix, q_rows},
                                     {attention + "k_proj." + suffix, kv_rows},
                                     {attention + "v_proj." + suffix, kv_rows}};
    };
    specs.push_back({prefix + "input_layernorm.weight", Shape{C}, Init::ones, false});
    specs.push_back({attention + "qkv_proj.weight", Shape{config.qkv_width(), C}, Init::normal, true, parts("weight"), qkv});
    if (config.attention_bias || config.qkv_bias) {
      specs.push_back({attention + "qkv_proj.bias", Shape{config.qkv_width()}, Init::zeros, false, parts("bias"), qkv});
    }
    specs.push_back({attention + "o_proj.weight", Shape{C, q_rows}, Init::normal, true, {},
                     {TensorSplit::columns, {q_heads}}});
    if (config.attention_bias) specs.push_back({attention + "o_proj.bias", Shape{C}, Init::zeros, false, {}, partial});
    specs.push_back({prefix + "post_attention_layernorm.weight", Shape{C}, Init::ones, false});
    for (const char* name : {"gate_proj", "up_proj"}) {
      specs.push_back({mlp + name + ".weight", Shape{F, C}, Init::normal, true, {}, mlp_in});
      if (config.mlp_bias) specs.push_back({mlp + name + ".bias", Shape{F}, Init::zeros, false, {}, mlp_in});
    }
    specs.push_back({mlp + "down_proj.weight", Shape{C, F}, Init::normal, true, {},
                     {TensorSplit::columns, mlp_in.sections}});
    if (config.mlp_bias) specs.push_back({mlp + "down_proj.bias", Shape{C}, Init::zeros, false, {}, partial});
  }
  specs.push_back({"model.norm.weight", Shape{C}, Init::ones, false});
  return specs;
}

}  // namespace

std::vector<TensorSpec> gpt_tensor_specs(const GptConfig& config, bool decay_embeddings) {
  std::vector<TensorSpec> specs =
      config.is_llama() ? llama_tensor_specs(config, decay_embeddings) : gpt2_tensor_specs(config, decay_embeddings);
  if (!config.tie_word_embeddings) {
    specs.push_back(
        {"lm_head.weight", Shape{config.vocab_size, config.n_embd}, Init::normal, true, {}, vocabulary_rows(config)});
  }
  return specs;
}

std::vector<StoredPart> stored_parts(const TensorSpec& spec) {
  if (!spec.stored_as.empty()) return spec.stored_as;
  return {{spec.name, spec.shape.rank() == 0 ? 1 : spec.shape[0]}};
}

std::string embedding_table_name(const GptConfig& config) {
  return config.is_llama() ? "model.embed_tokens.weight" : "wte.weight";
}

std::string lm_head_name(const GptConfig& config) {
  return config.tie_word_embeddings ? embedding_table_name(config) : "lm_head.weight";
}

std::vector<TensorSpec> gpt2_tensor_specs(const GptConfig& config, bool decay_embeddings) {
  const int64_t C = config.n_embd;
  // Attention's heads: c_attn's q, k and v columns, c_proj's rows; the MLP's 4C columns, then rows.
  const TensorSplit::Section heads{config.n_head, config.head_size(), "model.n_head"}, mlp{4 * C};
  const TensorSplit qkv{TensorSplit::columns, {heads, heads, heads}}, attention_out{TensorSplit::rows, {heads}};
  const TensorSplit mlp_in{TensorSplit::columns, {mlp}}, mlp_out{TensorSplit::rows, {mlp}};
  const TensorSplit partial{.partial_gradient = true};
  std::vector<TensorSpec> specs{
      {"wte.weight", Shape{config.vocab_size, C}, Init::normal, decay_embeddings, {}, vocabulary_rows(config)},
      {"wpe.weight", Shape{config.n_positions, C}, Init::normal, decay_embeddings, {}, partial},
  };
  for (int64_t layer = 0; layer < config.n_layer; ++layer) {
    std::string prefix = config.block_prefix() + std::to_string(layer) + ".";
    std::vector<TensorSpec> block{
        {prefix + "ln_1.weight", Shape{C}, Init::ones, false},
        {prefix + "ln_1.bias", Shape{C}, Init::zeros, false},
        {prefix + "attn.c_attn.weight", Shape{C, 3 * C}, Init::normal, true, {}, qkv},
        {prefix + "attn.c_attn.bias", Shape{3 * C}, Init::zeros, false, {}, qkv},
        {prefix + "attn.c_proj.weight", Shape{C, C}, Init::residual_projection, true, {}, attention_out},
        {prefix + "attn.c_proj.bias", Shape{C}, Init::zeros, false, {}, partial},
        {prefix + "ln_2.weight", Shape{C}, Init::ones, false},
        {prefix + "ln_2.bias", Shape{C}, Init::zeros, false},
        {prefix + "mlp.c_fc.weight", Shape{C, 4 * C}, Init::normal, true, {}, mlp_in},
        {prefix + "mlp.c_fc.bias", Shape{4 * C}, Init::zeros, false, {}, mlp_in},
        {prefix + "mlp.c_proj.weight", Shape{4 * C, C}, Init::residual_projection, true, {}, mlp_out},
        {prefix + "mlp.c_proj.bias", Shape{C}, Init::zeros, false, {}, partial},
    };
    specs.insert(specs.end(), block.begin(), block.end());
  }
  specs.push_back({"ln_f.weight", Shape{C}, Init::ones, false});
  specs.push_back({"ln_f.bias", Shape{C}, Init::zeros, false});
  return specs;
}

namespace {

// The block a tensor belongs to (GPT-2's "h.<i>.…", the Llama family's "model.layers.<i>.…"), or -1.
int64_t block_of(const std::string& name) {
  for (const std::string prefix : {"h.", "model.layers."}) {
    if (name.rfind(prefix, 0) == 0) return std::stoll(name.substr(prefix.size()));
  }
  return -1;
}

}  // namespace

std::vector<TensorSpec> stage_tensor_specs(const std::vector<TensorSpec>& specs, const LayerRange& range) {
  const bool tied = std::none_of(specs.begin(), specs.end(), [](const TensorSpec& spec) {
    return spec.name == "lm_head.weight";
  });
  std::vector<TensorSpec> held;
  for (const TensorSpec& spec : specs) {
    bool holds = false;
    if (const int64_t block = block_of(spec.name); block >= 0) {
      holds = range.holds_layer(block);
    } else if (spec.name == "wte.weight" || spec.name == "model.embed_tokens.weight") {
      holds = range.first || (range.last && tied);
    } else if (spec.name == "wpe.weight") {
      holds = range.first;
    } else {  // the final norm, an untied head
      holds = range.last;
    }
    if (holds) held.push_back(spec);
  }
  return held;
}

namespace {

// A tensor as [outer, dim, inner], dim the one its TensorSplit splits (the whole tensor's size).
struct SplitGeometry {
  int64_t outer = 1, dim = 0, inner = 1;
};

SplitGeometry split_geometry(const TensorSpec& spec) {
  const size_t axis = spec.split.kind == TensorSplit::rows ? 0 : spec.shape.rank() - 1;
  SplitGeometry g;
  for (size_t i = 0; i < spec.shape.rank(); ++i) {
    if (i < axis) g.outer *= spec.shape[i];
    if (i > axis) g.inner *= spec.shape[i];
  }
  for (const TensorSplit::Section& section : spec.split.sections) g.dim += section.units * section.unit;
  return g;
}

// A shard's units of a section: the first and how many.
std::pair<int64_t, int64_t> units_of(const TensorSplit::Section& section, const TensorShard& shard) {
  return {shard.rank * section.units / shard.size, std::max<int64_t>(section.units / shard.size, 1)};
}

// Whether other shards hold this shard's units of the section too (k/v heads fewer than the
// shards), and whether this shard is the first of those holders.
bool shares_units(const TensorSplit::Section& section, const TensorShard& shard) { return section.units < shard.size; }
bool first_holder_of(const TensorSplit::Section& section, const TensorShard& shard) {
  return !shares_units(section, shard) || shard.rank % (shard.size / section.units) == 0;
}

// A shard's part of a tensor as runs of elements: where each lies in the shard's tensor and in the
// whole one, whether other shards hold it too (`shared`) and whether this shard is its first
// holder (`counted`). Adjacent runs alike are merged.
struct Piece {
  int64_t in_shard, in_whole, count;
  bool shared, counted;
};

std::vector<Piece> pieces(const TensorSpec& spec, const TensorShard& shard) {
  if (spec.split.kind == TensorSplit::whole || shard.size == 1) {
    return {{0, 0, whole_numel(spec), shard.size > 1, shard.rank == 0}};
  }
  const SplitGeometry g = split_geometry(spec);
  std::vector<Piece> result;
  int64_t at = 0;
  for (int64_t o = 0; o < g.outer; ++o) {
    int64_t begin = 0;
    for (const TensorSplit::Section& section : spec.split.sections) {
      const auto [first, count] = units_of(section, shard);
      const Piece piece{at, (o * g.dim + begin + first * section.unit) * g.inner, count * section.unit * g.inner,
                        shares_units(section, shard), first_holder_of(section, shard)};
      Piece* last = result.empty() ? nullptr : &result.back();
      if (last != nullptr && last->in_shard + last->count == piece.in_shard &&
          last->in_whole + last->count == piece.in_whole && last->shared == piece.shared &&
          last->counted == piece.counted) {
        last->count += piece.count;
      } else {
        result.push_back(piece);
      }
      at += piece.count;
      begin += section.units * section.unit;
    }
  }
  return result;
}

}  // namespace

int64_t whole_numel(const TensorSpec& spec) {
  if (spec.split.kind == TensorSplit::whole) return spec.shape.numel();
  const SplitGeometry g = split_geometry(spec);
  return g.outer * g.dim * g.inner;
}

bool splits_vocabulary(const TensorSpec& spec) {
  return spec.split.kind == TensorSplit::rows && spec.split.sections.size() == 1 &&
         spec.split.sections[0].setting == kVocabulary;
}

std::vector<TensorSpec> shard_tensor_specs(const std::vector<TensorSpec>& specs, const TensorShard& shard) {
  std::vector<TensorSpec> sharded = specs;
  for (TensorSpec& spec : sharded) {
    if (spec.split.kind == TensorSplit::whole) continue;
    const char* dim_name = spec.split.kind == TensorSplit::rows ? "rows" : "columns";
    int64_t size = 0;
    for (const TensorSplit::Section& section : spec.split.sections) {
      if (section.replicable) {
        check(section.units % shard.size == 0 || (section.units < shard.size && shard.size % section.units == 0),
              "dist.tensor_parallel ({}) and {} ({}): one must divide the other (k/v heads are split over the shards, "
              "or each shared by several shards when fewer)",
              shard.size, section.setting, section.units);
      } else if (!section.setting.empty()) {
        check(section.units % shard.size == 0, "{} ({}) is not a multiple of dist.tensor_parallel ({}): {}'s {} are "
              "split evenly over the shards", section.setting, section.units, shard.size, spec.name, dim_name);
      } else {
        check(section.units % shard.size == 0, "dist.tensor_parallel ({}) does not divide {}'s {} ({})", shard.size,
              spec.name, dim_name, section.units);
      }
      size += units_of(section, shard).second * section.unit;
    }
    std::vector<int64_t> dims = spec.shape.dims();
    dims[spec.split.kind == TensorSplit::rows ? 0 : dims.size() - 1] = size;
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

std::vector<SlicePlacement> shard_slices(const TensorSpec& spec, const TensorShard& shard) {
  std::vector<int64_t> dims = spec.shape.dims();
  if (spec.split.kind == TensorSplit::whole || shard.size == 1) {
    const TensorSlice whole = TensorSlice::whole(spec.shape);
    return {{whole, whole, shard.rank == 0}};
  }
  // Rows split dimension 0; columns the last (a 1-D bias is one row of columns).
  const size_t axis = spec.split.kind == TensorSplit::rows ? 0 : dims.size() - 1;
  dims[axis] = split_geometry(spec).dim;  // the whole tensor's, whether `spec` is the whole's or a shard's
  const TensorSlice whole = TensorSlice::whole(Shape(dims));
  std::vector<SlicePlacement> placements;
  int64_t begin = 0, local = 0;
  for (const TensorSplit::Section& section : spec.split.sections) {
    const auto [first, count] = units_of(section, shard);
    SlicePlacement placement{whole, whole, first_holder_of(section, shard)};
    placement.global.offsets[axis] = begin + first * section.unit;
    placement.global.lengths[axis] = placement.local.lengths[axis] = count * section.unit;
    placement.local.offsets[axis] = local;
    placements.push_back(placement);
    local += count * section.unit;
    begin += section.units * section.unit;
  }
  return placements;
}

std::vector<ShardRun> partial_gradient_runs(const TensorSpec& spec, const TensorShard& shard) {
  std::vector<ShardRun> runs;
  const bool whole = spec.split.kind == TensorSplit::whole;
  if (whole && !spec.split.partial_gradient) return runs;
  for (const Piece& piece : pieces(spec, shard)) {
    if (piece.shared) runs.push_back({piece.in_shard, piece.in_whole, piece.count});
  }
  return runs;
}

std::vector<std::pair<int64_t, int64_t>> counted_runs(const TensorSpec& spec, const TensorShard& shard) {
  std::vector<std::pair<int64_t, int64_t>> runs;
  for (const Piece& piece : pieces(spec, shard)) {
    if (piece.counted) runs.push_back({piece.in_shard, piece.count});
  }
  return runs;
}

ParameterSet::ParameterSet(std::vector<TensorSpec> specs, Backend& backend, DType dtype)
    : backend_(&backend), specs_(std::move(specs)) {
  place();
  view(backend.empty(Shape{numel_}, dtype));
}

ParameterSet ParameterSet::for_file_values(std::vector<TensorSpec> specs, Backend& backend) {
  ParameterSet set(std::move(specs), backend);
  if (set.flat_.host_accessible()) keep_small_pages(set.flat_.raw(), static_cast<char*>(set.flat_.raw()) + set.flat_.nbytes());
  return set;
}

ParameterSet ParameterSet::over_mapping(std::vector<TensorSpec> specs, Backend& backend, std::vector<Tensor> views) {
  ParameterSet set;
  set.backend_ = &backend;
  set.specs_ = std::move(specs);
  set.place();
  check(views.size() == set.specs_.size(), "over_mapping: {} views for {} tensors", views.size(), set.specs_.size());
  for (size_t i = 0; i < views.size(); ++i) {
    check(views[i].dtype() == DType::f32 && views[i].shape() == set.specs_[i].shape, "over_mapping: {} is {} {}, expected f32 {}",
          set.specs_[i].name, dtype_name(views[i].dtype()), views[i].shape().to_string(), set.specs_[i].shape.to_string());
  }
  set.views_ = std::move(views);
  set.mapped_ = true;
  return set;
}

void ParameterSet::place() {
  for (size_t i = 0; i < specs_.size(); ++i) {
    offsets_.push_back(numel_);
    numel_ += specs_[i].shape.numel();
    index_[specs_[i].name] = i;
  }
}

void report_quantization_fallbacks(DType requested, const std::vector<std::string>& names, const std::vector<DType>& types) {
  std::vector<std::string> patterns;  // the names with layer numbers as N, each once, in order
  size_t count = 0;
  for (size_t i = 0; i < names.size(); ++i) {
    if (types[i] == requested) continue;
    ++count;
    std::string pattern;
    for (size_t c = 0; c < names[i].size(); ++c) {
      const bool digit = std::isdigit(static_cast<unsigned char>(names[i][c])) != 0;
      if (!digit) pattern += names[i][c];
      else if (c == 0 || !std::isdigit(static_cast<unsigned char>(names[i][c - 1]))) pattern += 'N';
    }
    if (std::find(patterns.begin(), patterns.end(), pattern) == patterns.end()) patterns.push_back(pattern);
  }
  if (count == 0) return;
  const DType fallback = *std::find_if(types.begin(), types.end(), [&](DType type) { return type != requested; });
  fmt::print(stderr, "{}: {} of {} matrices have rows that are not whole {}-value blocks: {} instead, as llama.cpp falls back ({})\n",
             dtype_name(requested), count, names.size(), dtype_block_elements(requested), dtype_name(fallback),
             fmt::join(patterns, ", "));
}

ParameterSet::ParameterSet(std::vector<TensorSpec> specs, Backend& backend, const std::vector<DType>& dtypes)
    : backend_(&backend), specs_(std::move(specs)) {
  check(dtypes.size() == specs_.size(), "ParameterSet: {} dtypes for {} tensors", dtypes.size(), specs_.size());
  if (std::all_of(dtypes.begin(), dtypes.end(), [&](DType dtype) { return dtype == dtypes.front(); })) {
    *this = ParameterSet(std::move(specs_), backend, dtypes.empty() ? DType::f32 : dtypes.front());
    return;
  }
  constexpr size_t kAlignment = 64, kWord = 2;
  std::vector<size_t> byte_offsets;
  size_t bytes = 0;
  for (size_t i = 0; i < specs_.size(); ++i) {
    byte_offsets.push_back(bytes);
    bytes += (dtype_bytes(dtypes[i], specs_[i].shape.numel()) + kAlignment - 1) / kAlignment * kAlignment;
  }
  flat_ = backend.empty(Shape{static_cast<int64_t>(bytes / kWord)}, DType::u16);
  for (size_t i = 0; i < specs_.size(); ++i) {
    numel_ += specs_[i].shape.numel();
    offsets_.push_back(static_cast<int64_t>(byte_offsets[i] / kWord));
    views_.push_back(flat_.view(byte_offsets[i], specs_[i].shape, dtypes[i]));
    index_[specs_[i].name] = i;
  }
}

void ParameterSet::view(Tensor flat) {
  flat_ = std::move(flat);
  for (size_t i = 0; i < specs_.size(); ++i) {
    views_.push_back(flat_.slice_flat(offsets_[i], specs_[i].shape.numel()).reshape(specs_[i].shape));
  }
}

const Tensor& ParameterSet::flat() const {
  check(!mapped_, "parameters mapped from a file have no flat buffer (their tensors lie where the file holds them)");
  read_every_file_tensor();
  return flat_;
}

std::set<std::string> StoredLayouts::names() const {
  std::set<std::string> all = transposed;
  all.insert(interleaved.begin(), interleaved.end());
  all.insert(tiled.begin(), tiled.end());
  return all;
}

const Tensor& ParameterSet::get(const std::string& name) const {
  auto found = index_.find(name);
  if (found == index_.end()) throw Error("model has no tensor named '" + name + "'");
  return values(found->second);
}

const ParameterSet::FileValues* ParameterSet::file_values(const std::string& name) const {
  const auto found = file_values_.find(name);
  return found == file_values_.end() ? nullptr : found->second.get();
}

namespace {

// A tensor's rows as a copy reads them: its file's (FileTensor: maybe our transpose's rows), or
// its values in memory (a mapped set's: a file's pages, let go once read).
struct HeldRows {
  explicit HeldRows(const FileTensor& file)
      : file(&file), rows(file.rows()), columns(file.columns()), transposed(file.transposed) {}
  HeldRows(const Tensor& values, bool mapped)
      : values(values.data<float>()), rows(values.shape()[0]), columns(values.numel() / values.shape()[0]),
        mapped(mapped) {}

  // Rows [first, first + count) as float32: in memory where they are, else read into `staging`.
  const float* read(int64_t first, int64_t count, std::vector<float>& staging) const {
    if (file == nullptr) return values + first * columns;
    staging.resize(static_cast<size_t>(count * columns));
    file->read(first, count, staging.data());
    return staging.data();
  }
  void let_go(int64_t first, int64_t count) const {
    if (file != nullptr) file->release(first, count);
    else if (mapped) release_mapped_pages(values + first * columns, static_cast<size_t>(count * columns) * sizeof(float));
  }
  // visit(first, count) for a MiB of rows at a time, their pages let go once visited: a big tensor
  // (the embedding table) is never resident whole beside what is made of it.
  template <typename Visit>
  void for_each_chunk(Visit visit) const {
    const int64_t rows_per_mib = std::max<int64_t>(1, (int64_t{1} << 20) / (columns * 4));
    for (int64_t first = 0; first < rows; first += rows_per_mib) {
      const int64_t count = std::min(rows_per_mib, rows - first);
      visit(first, count);
      let_go(first, count);
    }
  }
  // store(offset(row, column), value) for every value, (row, column) its place in the tensor
  // written: the held rows' own, or their transpose's when `flip`.
  template <typename Offset, typename Store>
  void write(bool flip, Offset offset, Store store, std::vector<float>& staging) const {
    for_each_chunk([&](int64_t first, int64_t count) {
      const float* held = read(first, count, staging);
      for (int64_t r = 0; r < count; ++r) {
        for (int64_t c = 0; c < columns; ++c) {
          store(flip ? offset(c, first + r) : offset(first + r, c), held[r * columns + c]);
        }
      }
    });
  }

  const FileTensor* file = nullptr;
  const float* values = nullptr;
  int64_t rows, columns;
  bool transposed = false, mapped = false;
};

}  // namespace

const Tensor& ParameterSet::values(size_t index) const {
  const Tensor& view = views_[index];
  const auto found = file_values_.find(specs_[index].name);
  if (found == file_values_.end() || found->second->read) return view;
  FileValues& file = *found->second;
  const std::lock_guard<std::mutex> lock(file.reading);
  if (file.read) return view;
  // Into host memory in our layout, a MiB of the file's rows at a time.
  const HeldRows held(file.tensor);
  const int64_t columns = held.transposed ? held.rows : held.columns;
  Tensor host = view.host_accessible() ? view : Tensor::zeros(view.shape(), DType::f32);
  std::vector<float> staging;
  held.write(
      held.transposed, [&](int64_t row, int64_t column) { return row * columns + column; },
      [to = host.data<float>()](int64_t at, float value) { to[at] = value; }, staging);
  if (!view.host_accessible()) backend_->upload(host.raw(), view);
  file.read = true;
  return view;
}

std::optional<Tensor> ParameterSet::stored_rows(const std::string& name) const {
  const FileValues* file = file_values(name);
  if (file == nullptr || file->tensor.transposed || file->tensor.parts.size() != 1 ||
      !file->tensor.parts.front().file_row.empty()) {
    return std::nullopt;
  }
  return file->tensor.parts.front().rows;
}

void ParameterSet::read_every_file_tensor() const {
  for (size_t i = 0; i < views_.size(); ++i) values(i);
}

void ParameterSet::read_from_file(const std::string& name, FileTensor file) {
  const Tensor& view = views_.at(index_.at(name));
  const Shape& shape = view.shape();
  check(!mapped_ && view.dtype() == DType::f32 && shape.rank() == 2 &&
            Shape{file.rows(), file.columns()} == (file.transposed ? Shape{shape[1], shape[0]} : shape),
        "read_from_file: {} {} cannot take the file's {} rows of {}{}", name, shape.to_string(), file.rows(),
        file.columns(), file.transposed ? " (transposed)" : "");
  auto values = std::make_shared<FileValues>();
  values->tensor = std::move(file);
  file_values_[name] = std::move(values);
  if (!view.host_accessible()) this->values(index_.at(name));  // a device's get() must not write
}

void ParameterSet::assign_converted(const ParameterSet& source) {
  check_writable();
  file_values_.clear();  // every value overwritten
  if (!source.mapped_) {
    backend_->launch(Cast{.src = source.flat(), .dst = flat_});
    return;
  }
  for (size_t i = 0; i < views_.size(); ++i) backend_->launch(Cast{.src = source.views_[i], .dst = views_[i]});
}

void ParameterSet::check_writable() const {
  check(!mapped_, "parameters mapped from a file are read-only: write a copy (assign_converted)");
}

ParameterSet ParameterSet::converted_copy(Backend& backend, DType dtype, const StoredLayouts& layouts,
                                          const std::set<std::string>* only) const {
  check(dtype == DType::bf16 || dtype == DType::f16 || dtype == DType::f32 || is_block_quantized(dtype),
        "converted_copy: {} is not f32, bf16, f16, q8_0 or q4_k", dtype_name(dtype));
  std::vector<size_t> sources;  // indices into specs_ of the tensors copied
  std::vector<TensorSpec> specs;
  std::vector<DType> types;  // each copy's: `dtype`, or its fallback
  for (size_t i = 0; i < specs_.size(); ++i) {
    if (only != nullptr && !only->count(specs_[i].name)) continue;
    TensorSpec spec = specs_[i];
    if (layouts.transposed.count(spec.name)) spec.shape = Shape{spec.shape[1], spec.shape[0]};
    const bool interleaved = layouts.interleaved.count(spec.name) > 0, tiled = layouts.tiled.count(spec.name) > 0;
    check((!interleaved && !tiled) || spec.shape.rank() == 2,
          "converted_copy: {} {} cannot be stored interleaved or tiled (not 2-D)", spec.name, spec.shape.to_string());
    const DType type = is_block_quantized(dtype) ? quantized_type_for_rows(dtype, spec.shape[spec.shape.rank() - 1]) : dtype;
    if (is_block_quantized(type)) {
      const int64_t block = dtype_block_elements(type), columns = spec.shape[spec.shape.rank() - 1];
      check(!interleaved && (!tiled || has_quantized_tiles(type)),
            "converted_copy: {} weights are read as blocks of rows, not interleaved{} ({})", dtype_name(type),
            has_quantized_tiles(type) ? "" : " or tiled", spec.name);
      check(columns % block == 0, "{} {} cannot be quantized to {}: its rows of {} are not a whole number of {}-value blocks",
            spec.name, spec.shape.to_string(), dtype_name(type), columns, block);
    }
    sources.push_back(i);
    specs.push_back(std::move(spec));
    types.push_back(type);
  }
  std::vector<std::string> names;
  for (const TensorSpec& spec : specs) names.push_back(spec.name);
  report_quantization_fallbacks(dtype, names, types);
  const ParameterSet source = on_host();
  ParameterSet copy(std::move(specs), backend, types);
  copy.write_on_host([&](ParameterSet& host) {
    std::vector<float> staging, stored;  // a MiB of rows read from a file; a quantized tensor's f32 values, stored
    for (size_t i = 0; i < sources.size(); ++i) {
      const std::string& name = specs_[sources[i]].name;
      const bool transpose = layouts.transposed.count(name) > 0;
      const bool interleave = layouts.interleaved.count(name) > 0;
      const FileValues* file = source.file_values(name);
      const bool takes_file_blocks = file != nullptr && file->tensor.type() == types[i] &&
                                     is_block_quantized(types[i]) && file->tensor.transposed == transpose;
      // Where the values are read: their file's rows (maybe our transpose's), or our memory's.
      const HeldRows held = file != nullptr && (!file->read || takes_file_blocks)
                                ? HeldRows(file->tensor)
                                : HeldRows(source.views_[sources[i]], source.mapped_);
      // The copy stores the held rows' transpose when exactly one of the two is our transpose.
      const bool flip = transpose != held.transposed;
      const int64_t stored_rows = flip ? held.columns : held.rows, stored_columns = flip ? held.rows : held.columns;
      // Block-quantized weights are written as rows of blocks, then their groups tiled.
      const bool tile = layouts.tiled.count(name) > 0 && !is_block_quantized(types[i]);
      auto write = [&](auto store) {
        held.write(
            flip,
            [&](int64_t row, int64_t column) {
              return interleave ? interleaved_offset(row, column, stored_rows, stored_columns)
                     : tile     ? tiles_offset(row, column, stored_rows, stored_columns)
                                : row * stored_columns + column;
            },
            store, staging);
      };
      char* const out = static_cast<char*>(host.at(i).raw());
      switch (dtype) {
        case DType::f32: write([to = host.at(i).data<float>()](int64_t at, float value) { to[at] = value; }); break;
        case DType::bf16:
          write([to = host.at(i).data<uint16_t>()](int64_t at, float value) { to[at] = f32_to_bf16(value); });
          break;
        case DType::f16:
          write([to = host.at(i).data<uint16_t>()](int64_t at, float value) { to[at] = f32_to_f16(value); });
          break;
        default: {  // block-quantized: the file's blocks, else the stored rows in f32 quantized block by block
          const int64_t row_bytes = dtype_bytes(types[i], stored_columns);
          if (takes_file_blocks) {
            held.for_each_chunk([&](int64_t first, int64_t count) { file->tensor.copy_bytes(first, count, out + first * row_bytes); });
          } else if (!flip) {  // stored as held: quantized a MiB of rows at a time
            held.for_each_chunk([&](int64_t first, int64_t count) {
              quantize_blocks(types[i], held.read(first, count, staging), out + first * row_bytes, count * held.columns);
            });
          } else {
            stored.resize(static_cast<size_t>(stored_rows * stored_columns));
            write([&](int64_t at, float value) { stored[static_cast<size_t>(at)] = value; });
            quantize_blocks(types[i], stored.data(), out, stored_rows * stored_columns);
          }
          if (layouts.tiled.count(name)) tile_quantized_rows(types[i], out, stored_rows, stored_columns);
          break;
        }
      }
    }
  });
  // The page cache may hold a file in large folios, and a fault maps a whole folio: reading the
  // next tensor mapped the end of one let go before (Qwen2.5-0.5B's bf16 file: 112 MB of its
  // matrices' pages were left mapped, a folio at each tensor's edge). Let every page read go.
  for (size_t index : sources) {
    if (const FileValues* file = source.file_values(specs_[index].name)) file->tensor.release(0, file->tensor.rows());
    else if (source.mapped_) release_mapped_pages(source.views_[index].raw(), source.views_[index].nbytes());
  }
  return copy;
}

ParameterSet ParameterSet::on_host() const {
  if (mapped_ || flat_.host_accessible()) return *this;
  ParameterSet copy(specs_, cpu_backend(), flat_.dtype());
  backend_->download(flat_, copy.flat_.raw());
  copy.file_values_ = file_values_;  // all read: a device's are read at read_from_file
  return copy;
}

void ParameterSet::write_on_host(const std::function<void(ParameterSet&)>& write) {
  check_writable();
  read_every_file_tensor();  // `write` may change some values only
  file_values_.clear();
  if (flat_.host_accessible()) {
    write(*this);
    return;
  }
  ParameterSet copy(specs_, cpu_backend(), flat_.dtype());
  write(copy);
  backend_->upload(copy.flat_.raw(), flat_);
}

void initialize_gpt(ParameterSet& parameters, const GptConfig& config, uint64_t seed, const TensorShard& shard,
                    int64_t begin, int64_t end) {
  const std::vector<TensorSpec> whole = gpt_tensor_specs(config);
  std::map<std::string, const TensorSpec*> by_name;
  for (const TensorSpec& spec : whole) by_name.emplace(spec.name, &spec);
  const double std_normal = 0.02;
  const double std_residual = 0.02 / std::sqrt(2.0 * static_cast<double>(config.n_layer));
  parameters.write_on_host([&](ParameterSet& host) {
    float* flat = host.flat().data<float>();
    // Element (r, c) of a held box is element (row + r, column + c) of the whole tensor, and of
    // the local one; a 1-D tensor is one row. Only the boxes of [begin, end) are touched, so a
    // ZeRO-3 shard never writes (and the kernel never backs) the pages of the rest.
    for (const PartBox& box : part_boxes(host, whole, shard, begin, end < 0 ? host.numel() : end)) {
      const TensorSpec& spec = host.specs()[box.tensor];
      const bool matrix = box.local.offsets.size() == 2;
      const int64_t rows = matrix ? box.local.lengths[0] : 1, width = box.local.lengths.back();
      const int64_t global_columns = by_name.at(spec.name)->shape.dims().back(), local_columns = spec.shape.dims().back();
      const int64_t global_row = matrix ? box.global.offsets[0] : 0, global_column = box.global.offsets.back();
      const int64_t local_row = matrix ? box.local.offsets[0] : 0, local_column = box.local.offsets.back();
      const double scale = spec.init == Init::normal ? std_normal : std_residual;
      const uint64_t key = stream_key(seed, spec.name);
      for (int64_t r = 0; r < rows; ++r) {
        float* out = flat + host.offset_of(box.tensor) + (local_row + r) * local_columns + local_column;
        for (int64_t c = 0; c < width; ++c) {
          const auto element = static_cast<uint64_t>((global_row + r) * global_columns + global_column + c);
          out[c] = spec.init == Init::ones    ? 1.0f
                   : spec.init == Init::zeros ? 0.0f
                                              : static_cast<float>(normal_at(key, element) * scale);
        }
      }
    }
  });
}

}  // namespace paraflow::model
