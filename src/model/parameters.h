// The model's tensors, listed once (gemma.cpp's ForEachTensor idea): loading, saving,
// initialisation, the optimizer and gradient all-reduce all walk this one list. Every tensor
// is a view into one flat buffer, in list order, so whole-model operations are flat loops.
#pragma once

#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "base/random.h"
#include "model/gpt_config.h"

namespace paraflow::model {

enum class Init : uint8_t { normal, residual_projection, zeros, ones };

// A Hugging Face tensor stored as `rows` consecutive rows of one of ours (a fused projection).
struct StoredPart {
  std::string name;
  int64_t rows;
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
};

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

// Tensor parallelism (Megatron-LM's): shard `rank` of `size` holds attention's qkv projection and
// the MLP's first matrix split by columns (qkv by heads: its q, k and v sections each), their
// second matrices split by rows, and the token embedding split by vocabulary rows; layernorms and
// the position embedding whole. The row-split layers' biases and the position embedding are
// whole on every shard but added by shard 0 only, so their gradients are summed over the shards.
struct TensorShard {
  int rank = 0, size = 1;
};
std::vector<TensorSpec> shard_tensor_specs(const std::vector<TensorSpec>& specs, const TensorShard& shard);
// One rank's part of the model: the tensors of its stage, as its shard holds them.
std::vector<TensorSpec> part_tensor_specs(const std::vector<TensorSpec>& whole, const LayerRange& range,
                                          const TensorShard& shard);
int64_t element_count(const std::vector<TensorSpec>& specs);
// Where shard `shard`'s elements of the whole tensor `spec` lie in it: (offset, count) runs, in
// the shard's order.
std::vector<std::pair<int64_t, int64_t>> shard_runs(const TensorSpec& spec, const TensorShard& shard);
// The row-split layers' biases and wpe: whole on every shard, with a gradient on shard 0 only.
bool is_partial_gradient(const std::string& name);
// Tensors every shard holds whole (a gradient norm counts them once).
bool is_replicated(const std::string& name);

// Names of 2-D tensors that decoding stores in another layout than the checkpoint's [rows,
// columns]: transposed ([columns, rows]), then, if also interleaved, out_in_interleaved
// (interleaved_offset in backend/kernel_args.h), or, if tiled, out_in_tiles (tiles_offset).
struct StoredLayouts {
  std::set<std::string> transposed, interleaved, tiled;
};

class ParameterSet {
 public:
  ParameterSet() = default;
  ParameterSet(std::vector<TensorSpec> specs, Backend& backend, DType dtype = DType::f32);

  const std::vector<TensorSpec>& specs() const { return specs_; }
  const Tensor& flat() const { return flat_; }
  const Tensor& get(const std::string& name) const;
  const Tensor& at(size_t index) const { return views_[index]; }
  int64_t offset_of(size_t index) const { return offsets_[index]; }
  int64_t numel() const { return flat_.numel(); }

  // Overwrites these values with `source`'s (same specs), converted to this set's dtype.
  void assign_converted(const ParameterSet& source);
  // A copy in `dtype` (f32, bf16, f16 or q8_0) on `backend`, with the named 2-D tensors stored in
  // the given layouts (converted on the host once: for weights that decoding reads in another
  // layout); of the tensors named in `only` when given (those a decoding graph reads in `dtype`).
  // q8_0 quantizes each stored row (its columns a multiple of 32) and takes neither interleaving
  // nor tiles.
  ParameterSet converted_copy(Backend& backend, DType dtype, const StoredLayouts& layouts,
                              const std::set<std::string>* only = nullptr) const;
  // These parameters in host memory: themselves when the host can read them, else a copy.
  ParameterSet on_host() const;
  // Lets `write` fill the parameters on the host (directly, or in a copy uploaded afterwards).
  void write_on_host(const std::function<void(ParameterSet&)>& write);

 private:
  Backend* backend_ = nullptr;
  std::vector<TensorSpec> specs_;
  Tensor flat_;
  std::vector<Tensor> views_;
  std::vector<int64_t> offsets_;
  std::map<std::string, size_t> index_;
};

// GPT-2's initialisation: N(0, 0.02) for weights and embeddings, N(0, 0.02/sqrt(2·n_layer)) for
// the projections that write into the residual stream, zeros for biases, ones for layernorm gains.
// (The Llama family's specs ask for N(0, 0.02) everywhere, as transformers initialises them.)
void initialize_gpt(ParameterSet& parameters, const GptConfig& config, Rng& rng);

}  // namespace paraflow::model
