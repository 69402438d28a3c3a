#include "model/file_tensor.h"

#include <algorithm>
#include <cstring>

#include "base/error.h"
#include "base/system_memory.h"
#include "tensor/quantized.h"

namespace paraflow::model {

int64_t FileTensor::rows() const {
  int64_t rows = 0;
  for (const Part& part : parts) rows += part.rows.shape()[0];
  return rows;
}

int64_t FileTensor::columns() const { return parts.front().rows.shape()[1]; }

std::optional<DType> FileTensor::type() const {
  const DType first = parts.front().rows.dtype();
  const bool one = std::all_of(parts.begin(), parts.end(), [&](const Part& part) { return part.rows.dtype() == first; });
  return one ? std::optional(first) : std::nullopt;
}

std::pair<const FileTensor::Part*, int64_t> FileTensor::locate(int64_t row) const {
  for (const Part& part : parts) {
    const int64_t rows = part.rows.shape()[0];
    if (row < rows) return {&part, part.file_row.empty() ? row : part.file_row[static_cast<size_t>(row)]};
    row -= rows;
  }
  fail("FileTensor: row {} is past its {} rows", row, rows());
}

const char* FileTensor::row_bytes(int64_t row) const {
  const auto [part, at] = locate(row);
  return static_cast<const char*>(part->rows.raw()) + dtype_bytes(part->rows.dtype(), at * columns());
}

void FileTensor::read(int64_t first, int64_t count, float* out) const {
  const int64_t width = columns();
  for (int64_t r = 0; r < count; ++r) {
    stored_values_as_f32(locate(first + r).first->rows.dtype(), row_bytes(first + r), out + r * width, width);
  }
}

void FileTensor::copy_bytes(int64_t first, int64_t count, void* out) const {
  const std::optional<DType> stored = type();
  check(stored.has_value(), "FileTensor: its parts' types differ, so its rows are no one type's bytes");
  const size_t width = dtype_bytes(*stored, columns());
  for (int64_t r = 0; r < count; ++r) std::memcpy(static_cast<char*>(out) + static_cast<size_t>(r) * width, row_bytes(first + r), width);
}

void FileTensor::release(int64_t first, int64_t count) const {
  // Each part's rows among them, as one run of the file from the lowest to the highest (a part's
  // rows are reordered within heads only, so the run is about the rows read).
  int64_t begin = 0;
  for (const Part& part : parts) {
    const int64_t rows = part.rows.shape()[0], from = std::max(first, begin), to = std::min(first + count, begin + rows);
    if (from < to) {
      int64_t low = from - begin, high = to - 1 - begin;
      if (!part.file_row.empty()) {
        const auto [lowest, highest] = std::minmax_element(part.file_row.begin() + low, part.file_row.begin() + high + 1);
        low = *lowest;
        high = *highest;
      }
      const size_t width = dtype_bytes(part.rows.dtype(), columns());
      release_mapped_pages(static_cast<const char*>(part.rows.raw()) + static_cast<size_t>(low) * width,
                           static_cast<size_t>(high - low + 1) * width);
    }
    begin += rows;
  }
}

}  // namespace paraflow::model
