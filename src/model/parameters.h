// The model's tensors, listed once (gemma.cpp's ForEachTensor idea): loading, saving,
// initialisation, the optimizer and gradient all-reduce all walk this one list. Every tensor
// is a view into one flat buffer, in list order, so whole-model operations are flat loops; or,
// for serving a file in place, a view of that file's mapping (ParameterSet::over_mapping).
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "base/random.h"
#include "model/file_tensor.h"
#include "model/gpt_config.h"
#include "tensor/tensor_slice.h"

namespace paraflow::model {

enum class Init : uint8_t { normal, residual_projection, zeros, ones };

// A Hugging Face tensor stored as `rows` consecutive rows of one of ours (a fused projection).
struct StoredPart {
  std::string name;
  int64_t rows;
};

// How tensor parallelism (Megatron-LM's) splits a tensor: along its rows (dim 0) or its last
// dim, in sections (a fused projection's q, k and v), each of `units` units of `unit` rows or
// columns (heads of head_size, vocabulary rows, MLP columns). Shard r of n holds units
// [r·units/n, r·units/n + units/n) of each section; a `replicable` section with fewer units than
// shards (k/v heads below the tensor-parallel degree, as Megatron replicates them) gives each
// shard the one unit r·units/n that its q heads read, shared by n/units shards. A whole tensor is
// on every shard; `partial_gradient`: added by shard 0 only (a row-split layer's bias), so each
// shard holds part of its gradient.
struct TensorSplit {
  enum Kind : uint8_t { whole, rows, columns } kind = whole;
  struct Section {
    int64_t units, unit = 1;
    std::string setting;  // the config key that sets `units`, named when shards do not divide it
    bool replicable = false;
  };
  std::vector<Section> sections;
  bool partial_gradient = false;
};

struct TensorSpec {
  // Hugging Face's name: GPT2Model's ("h.0.attn.c_attn.weight"), or LlamaForCausalLM's
  // ("model.layers.0.mlp.up_proj.weight"); "lm_head.weight" for an untied head.
  std::string name;
  // GPT-2's linear weights [in, out], as HF's Conv1D stores them; the Llama family's [out, in],
  // as nn.Linear does.
  Shape shape;
  Init init;
  bool weight_decay;  // AdamW decays the linear layers' matrices; not biases, norms or (by default) embeddings
  // Where files hold it as several tensors, their names and rows in order (the Llama family's
  // fused q, k, v projection: q_proj, k_proj, v_proj); empty: one tensor named `name`.
  std::vector<StoredPart> stored_as = {};
  TensorSplit split = {};
};

// The Hugging Face tensors `spec` is stored as: its parts (TensorSpec::stored_as), or itself whole.
std::vector<StoredPart> stored_parts(const TensorSpec& spec);

// The model's tensors for `config`'s architecture. `decay_embeddings` puts the embedding tables
// under weight decay too (train.decay_embeddings).
std::vector<TensorSpec> gpt_tensor_specs(const GptConfig& config, bool decay_embeddings = false);
std::vector<TensorSpec> gpt2_tensor_specs(const GptConfig& config, bool decay_embeddings = false);
// The token embedding table's name, and the head's: that table when tied, else "lm_head.weight".
std::string embedding_table_name(const GptConfig& config);
std::string lm_head_name(const GptConfig& config);

// A pipeline stage's part of the model: blocks [first_layer, end_layer), the embeddings on the
// first stage, the final layernorm and the (tied) head on the last. The whole model by default.
struct LayerRange {
  int64_t first_layer = 0;
  int64_t end_layer = -1;  // -1: to the last block
  bool first = true, last = true;
  bool whole_model() const { return first && last; }
  bool holds_layer(int64_t layer) const { return layer >= first_layer && (end_layer < 0 || layer < end_layer); }
};

// The specs of the tensors `range` holds, in gpt_tensor_specs' order. wte is on both the first
// stage (embedding) and the last (head): two copies that stay equal because their gradients are
// summed between those stages.
std::vector<TensorSpec> stage_tensor_specs(const std::vector<TensorSpec>& specs, const LayerRange& range);

// Tensor parallelism: shard `rank` of `size` holds its part of each tensor, as the tensor's
// TensorSplit says: attention's q/k/v projection by heads (its q, k and v sections each; k/v
// heads replicated when fewer than the shards), the MLP's first matrices by columns (outputs),
// both layers' second matrices by rows (inputs), the token embedding and an untied head by
// vocabulary rows; norms, the position embedding and the row-split layers' biases whole.
struct TensorShard {
  int rank = 0, size = 1;
};
std::vector<TensorSpec> shard_tensor_specs(const std::vector<TensorSpec>& specs, const TensorShard& shard);
// One rank's part of the model: the tensors of its stage, as its shard holds them.
std::vector<TensorSpec> part_tensor_specs(const std::vector<TensorSpec>& whole, const LayerRange& range,
                                          const TensorShard& shard);
int64_t element_count(const std::vector<TensorSpec>& specs);
// Where shard `shard`'s part of the whole tensor `spec` lies: the boxes of the whole tensor it
// holds (one, or for qkv one per q, k and v section), each with the box of its own tensor, and
// whether this shard is the first holder of those elements (k/v heads shared by several shards,
// whole tensors: one writes them).
std::vector<SlicePlacement> shard_slices(const TensorSpec& spec, const TensorShard& shard);
// The elements of a shard's tensor (`spec`: the whole's or the shard's) whose gradient is only
// the shard's part, to be summed over the shards that hold them: a partial_gradient tensor, and
// replicated k/v heads (each shard has the gradient through its own q heads). As runs of
// (offset in the shard's tensor, offset in the whole tensor, count); none for other tensors.
struct ShardRun {
  int64_t in_shard, in_whole, count;
};
std::vector<ShardRun> partial_gradient_runs(const TensorSpec& spec, const TensorShard& shard);
// The elements of a shard's tensor that a sum over the whole model (a gradient norm) counts: those
// of which this shard is the first holder. (offset in the shard's tensor, count) runs.
std::vector<std::pair<int64_t, int64_t>> counted_runs(const TensorSpec& spec, const TensorShard& shard);
// The element count of the whole tensor of which `spec` may be a shard's part.
int64_t whole_numel(const TensorSpec& spec);
// Whether the tensor is [vocab_size, n_embd], split by vocabulary rows: the token embedding table,
// an untied head.
bool splits_vocabulary(const TensorSpec& spec);

// Names of 2-D tensors that decoding stores in another layout than the checkpoint's [rows,
// columns]: transposed ([columns, rows]), then, if also interleaved, out_in_interleaved
// (interleaved_offset in backend/kernel_args.h), or, if tiled, out_in_tiles (tiles_offset).
struct StoredLayouts {
  std::set<std::string> transposed, interleaved, tiled;
  std::set<std::string> names() const;  // those stored in any of them
};

// Says on stderr, once, which of the tensors `names` (types[i] the i-th's) are quantized not to
// `requested` but to its fallback (quantized_type_for_rows), their layer numbers written N;
// nothing where none are.
void report_quantization_fallbacks(DType requested, const std::vector<std::string>& names, const std::vector<DType>& types);

class ParameterSet {
 public:
  ParameterSet() = default;
  ParameterSet(std::vector<TensorSpec> specs, Backend& backend, DType dtype = DType::f32);
  // Tensors of several types, dtypes[i] the i-th's (a q4_k copy whose rows of 896 are q5_0:
  // quantized_type_for_rows). flat() is then their bytes, as u16 words (every type's blocks are
  // whole words), each tensor starting 64-byte aligned, at word offset_of(i).
  ParameterSet(std::vector<TensorSpec> specs, Backend& backend, const std::vector<DType>& dtypes);
  // f32 parameters whose matrices a loader reads from their file when needed (read_from_file),
  // the rest written now: on small pages only, so that what is written (the norms and biases
  // between the matrices) costs its own pages, not 2 MiB huge pages holding the matrices' too.
  static ParameterSet for_file_values(std::vector<TensorSpec> specs, Backend& backend);
  // The tensors of `specs` as `views` (one each, in order) of a read-only file mapping
  // (SafetensorsFile::mapped_f32): nothing copied, never written, and no flat buffer.
  static ParameterSet over_mapping(std::vector<TensorSpec> specs, Backend& backend, std::vector<Tensor> views);

  const std::vector<TensorSpec>& specs() const { return specs_; }
  const Tensor& flat() const;  // refused for a mapped set
  const Tensor& get(const std::string& name) const;
  bool contains(const std::string& name) const { return index_.count(name) != 0; }
  const Tensor& at(size_t index) const { return values(index); }
  int64_t offset_of(size_t index) const { return offsets_[index]; }
  int64_t numel() const { return numel_; }
  bool mapped() const { return mapped_; }  // made by over_mapping

  // Overwrites these values with `source`'s (same specs), converted to this set's dtype; refused
  // for a mapped set.
  void assign_converted(const ParameterSet& source);
  // A copy in `dtype` (f32, bf16, f16, q8_0 or q4_k) on `backend`, with the named 2-D tensors stored in
  // the given layouts (converted on the host once: for weights that decoding reads in another
  // layout); of the tensors named in `only` when given (those a decoding graph reads in `dtype`).
  // q8_0 and q4_k quantize each stored row (its columns a multiple of 32, or 256) and take no
  // interleaving, but tiles (backend/quantized_tiles.h); q4_k falls back to q5_0 for a tensor whose rows are not whole
  // super-blocks, as llama.cpp does (quantized_type_for_rows), and says which, once, on stderr; a
  // tensor whose file holds blocks of its type in that orientation (read_from_file) takes those
  // blocks as they are.
  // From a mapped set (over_mapping) or a file's values not yet read, the file's pages are let
  // go as they are read: the copy's peak is the copy plus a MiB (and q8_0/q4_k's f32 staging of
  // one transposed tensor).
  ParameterSet converted_copy(Backend& backend, DType dtype, const StoredLayouts& layouts,
                              const std::set<std::string>* only = nullptr) const;
  // These parameters in host memory: themselves when the host can read them, else a copy.
  ParameterSet on_host() const;
  // Lets `write` fill the parameters on the host (directly, or in a copy uploaded afterwards);
  // values still in their files are read first, and the files forgotten (the values change);
  // refused for a mapped set.
  void write_on_host(const std::function<void(ParameterSet&)>& write);

  // Tensor `name`'s values are `file`'s (its shape, or its transpose's when file.transposed):
  // read from the file when first needed (get, at and flat read them in; a copy reads the rows it
  // converts straight from the file), so a tensor that only a decoding copy reads never takes
  // memory in f32; a quantized copy of the file's block type in its orientation takes the file's
  // blocks as they are (requantizing their values would not give back the same Q4_K blocks: its
  // scales and minimums come from a search over the original values). On a device, read now.
  void read_from_file(const std::string& name, FileTensor file);
  // Tensor `name` as its file stores it, row for row in our order (read_from_file's, of one part
  // in order, not transposed): a view of the mapping in the file's type. None otherwise.
  std::optional<Tensor> stored_rows(const std::string& name) const;

 private:
  // A tensor's file values (read_from_file); `read` once its values are in this set's memory
  // (shared by the copies of this set, which share that memory).
  struct FileValues {
    FileTensor tensor;
    std::mutex reading;
    std::atomic<bool> read = false;
  };
  void place();            // offsets_, numel_ and index_ from specs_
  void view(Tensor flat);  // flat_ and the tensors' views of it
  void check_writable() const;
  const FileValues* file_values(const std::string& name) const;
  // Tensor `index`'s values, read from its file first if they are not yet.
  const Tensor& values(size_t index) const;
  void read_every_file_tensor() const;

  Backend* backend_ = nullptr;
  std::vector<TensorSpec> specs_;
  Tensor flat_;
  std::vector<Tensor> views_;
  std::vector<int64_t> offsets_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::shared_ptr<FileValues>> file_values_;
  int64_t numel_ = 0;
  bool mapped_ = false;  // views_ are of a read-only file mapping; no flat_
};

// GPT-2's initialisation: N(0, 0.02) for weights and embeddings, N(0, 0.02/sqrt(2·n_layer)) for
// the projections that write into the residual stream, zeros for biases, ones for layernorm gains.
// (The Llama family's specs ask for N(0, 0.02) everywhere, as transformers initialises them.)
// Element i of a whole tensor is drawn from the tensor's own counter-based stream (normal_at), so
// `parameters` may hold any part of the model (a stage's tensors, as tensor-parallel shard `shard`
// holds them) and gets exactly the values those elements have in the whole model's. Only elements
// [begin, end) of the flat buffer are written (end -1: to its end): a ZeRO-3 rank's shard.
void initialize_gpt(ParameterSet& parameters, const GptConfig& config, uint64_t seed, const TensorShard& shard = {},
                    int64_t begin = 0, int64_t end = -1);

}  // namespace paraflow::model
