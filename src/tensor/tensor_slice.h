// One notion of a slice (DESIGN.md §10): "a box of tensor T of global shape S", used by
// initialisation, checkpoints and export alike. It is TensorFlow's TensorSlice (a start and a
// length per dimension; its text form "0,2:-" is the one TF's checkpoints write after the shape,
// as in "4 6 0,2:-") and PyTorch distributed checkpoint's ChunkStorageMetadata (offsets, sizes).
// A rank's part of a tensor is a list of placements: which box of the global tensor it holds, and
// where that box lies in the rank's own (local) tensor.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace paraflow {

struct TensorSlice {
  std::vector<int64_t> offsets, lengths;  // one of each per dimension

  static TensorSlice whole(const Shape& shape);
  Shape shape() const { return Shape(lengths); }
  int64_t numel() const { return shape().numel(); }
  bool operator==(const TensorSlice&) const = default;
  // Whether the slice lies inside a tensor of `global` shape.
  bool fits(const Shape& global) const;
  // The overlap of two slices of one tensor; none when they do not overlap.
  std::optional<TensorSlice> intersect(const TensorSlice& other) const;
  // This slice moved by `from` -> `to` (a box of the same tensor re-anchored: the part of a
  // placement's global box seen in its local coordinates, and back).
  TensorSlice moved(const std::vector<int64_t>& from, const std::vector<int64_t>& to) const;

  // TensorFlow's spec: "start,length" per dimension joined by ':', "-" for a whole dimension.
  std::string to_spec(const Shape& global) const;
  // Reads to_spec's form for a tensor of `global` shape; `origin` names the text in errors.
  static TensorSlice parse_spec(const std::string& spec, const Shape& global, const std::string& origin);
};

// A box of the global tensor that a rank holds, and the box of its local tensor where it lies
// (same lengths).
struct SlicePlacement {
  TensorSlice global, local;
  // Whether this holder writes the box: false where another holder of the same elements does.
  bool first_holder = true;
};

// Copies the box `region` (of `region`'s lengths) between two row-major buffers: from `source`
// (shape `source_shape`, the box starting at `source_at`) to `target` (shape `target_shape`,
// starting at `target_at`). A 0-D region is one element.
void copy_box(const float* source, const Shape& source_shape, const std::vector<int64_t>& source_at, float* target,
              const Shape& target_shape, const std::vector<int64_t>& target_at, const Shape& region);

}  // namespace paraflow
