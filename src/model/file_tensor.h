// A 2-D parameter's values where a mapped model file holds them: GGUF's tensors, or a safetensors
// file that cannot be computed on in place (bf16 values, a fused projection's q, k and v apart).
// ParameterSet::read_from_file reads them only when they are needed, as float32 rows, or, for a
// copy in the file's own block-quantized type, as its very blocks; either way a MiB of the
// file's pages at a time, let go once read.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "tensor/tensor.h"

namespace paraflow::model {

struct FileTensor {
  // One of the file's tensors: [rows, columns] in its stored type, a read-only view of the
  // mapping (which it keeps alive).
  struct Part {
    Tensor rows;
    std::vector<int64_t> file_row;  // file_row[i]: the file's row that is the part's i-th (empty: row i)
  };
  std::vector<Part> parts;  // their rows one after another
  // The rows are those of our tensor's transpose (GPT-2's [in, out] Conv1D weights, which GGUF
  // stores [out, in]).
  bool transposed = false;

  int64_t rows() const;
  int64_t columns() const;
  // The parts' stored type, when they all have the same.
  std::optional<DType> type() const;
  // Rows [first, first + count) as float32, count * columns() values.
  void read(int64_t first, int64_t count, float* out) const;
  // The same rows as the file's bytes (type() must be one type).
  void copy_bytes(int64_t first, int64_t count, void* out) const;
  // Lets this process's pages of those rows go (they stay in the page cache).
  void release(int64_t first, int64_t count) const;

 private:
  // Row `row`'s part, and its row in that part's tensor.
  std::pair<const Part*, int64_t> locate(int64_t row) const;
  const char* row_bytes(int64_t row) const;
};

}  // namespace paraflow::model
