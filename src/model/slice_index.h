// Where the slices of a model's tensors are stored, and reading any box back from them: the
// index of a sharded checkpoint, as PyTorch distributed checkpoint's .metadata (global shapes,
// chunks) and TensorFlow's tensor-slice checkpoints (a slice spec per stored piece) keep it.
// index.json:
//   {"format": "paraflow.slices.v1",
//    "tensors": {"h.0.attn.c_proj.weight": {"shape": [64, 16],
//                 "chunks": [{"slice": "0,32:-", "file": "slices-00000.safetensors", "key": "h.0.attn.c_proj.weight@0,32:-"}]}}}
// Each chunk is an f32 tensor of the slice's shape, named `key` in safetensors file `file`.
#pragma once

#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/safetensors.h"
#include "tensor/tensor_slice.h"

namespace paraflow::model {

struct StoredChunk {
  TensorSlice slice;
  std::string file, key;
};

struct StoredTensor {
  Shape shape;
  std::vector<StoredChunk> chunks;
};

struct SliceIndex {
  std::map<std::string, StoredTensor> tensors;

  nlohmann::json to_json() const;
  // `origin` names the text in errors (every field is checked).
  static SliceIndex from_json(const nlohmann::json& json, const std::string& origin);
  // Adds `other`'s chunks (another rank's); a tensor's shape must agree and no two chunks overlap.
  void merge(const SliceIndex& other, const std::string& origin);
  // The files the chunks name, each once, sorted.
  std::vector<std::string> files() const;
};

// One box of a tensor, to store: the tensor's name and global shape, the box, and what produces
// its values (row-major in the box's shape) when the box is written, so that a writer holds one
// box's copy at a time.
struct SliceValues {
  std::string name;
  Shape global;
  TensorSlice slice;
  std::function<std::vector<float>()> values;
};

// Writes `slices` as the safetensors file `file` in `dir` (fsynced, renamed into place) and
// returns their index.
SliceIndex write_slices(const std::filesystem::path& dir, const std::string& file, const std::vector<SliceValues>& slices);

// Reads boxes of the indexed tensors from the files under `dir`, mapping each file once: a rank
// loads the pages of the slices it asks for, never a whole file.
class SliceReader {
 public:
  SliceReader(std::filesystem::path dir, SliceIndex index) : dir_(std::move(dir)), index_(std::move(index)) {}
  const SliceIndex& index() const { return index_; }
  bool contains(const std::string& name) const { return index_.tensors.count(name) != 0; }
  // The box `region` of tensor `name`, row-major in its own shape; refuses a region the stored
  // chunks do not cover.
  std::vector<float> read(const std::string& name, const TensorSlice& region);

 private:
  const SafetensorsFile& file(const std::string& name);

  std::filesystem::path dir_;
  SliceIndex index_;
  std::map<std::string, SafetensorsFile> files_;
};

}  // namespace paraflow::model
