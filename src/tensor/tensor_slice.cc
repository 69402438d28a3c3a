#include "tensor/tensor_slice.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "base/error.h"

namespace paraflow {

TensorSlice TensorSlice::whole(const Shape& shape) {
  return {std::vector<int64_t>(shape.rank(), 0), shape.dims()};
}

bool TensorSlice::fits(const Shape& global) const {
  if (offsets.size() != global.rank() || lengths.size() != global.rank()) return false;
  for (size_t d = 0; d < global.rank(); ++d) {
    if (offsets[d] < 0 || lengths[d] < 0 || offsets[d] + lengths[d] > global[d]) return false;
  }
  return true;
}

std::optional<TensorSlice> TensorSlice::intersect(const TensorSlice& other) const {
  check(offsets.size() == other.offsets.size(), "slices of rank {} and {} cannot overlap", offsets.size(),
        other.offsets.size());
  TensorSlice overlap;
  for (size_t d = 0; d < offsets.size(); ++d) {
    const int64_t begin = std::max(offsets[d], other.offsets[d]);
    const int64_t end = std::min(offsets[d] + lengths[d], other.offsets[d] + other.lengths[d]);
    if (end <= begin) return std::nullopt;
    overlap.offsets.push_back(begin);
    overlap.lengths.push_back(end - begin);
  }
  return overlap;
}

TensorSlice TensorSlice::moved(const std::vector<int64_t>& from, const std::vector<int64_t>& to) const {
  TensorSlice result = *this;
  for (size_t d = 0; d < offsets.size(); ++d) result.offsets[d] += to[d] - from[d];
  return result;
}

std::string TensorSlice::to_spec(const Shape& global) const {
  std::string spec;
  for (size_t d = 0; d < offsets.size(); ++d) {
    if (d > 0) spec += ':';
    spec += offsets[d] == 0 && lengths[d] == global[d] ? std::string("-") : fmt::format("{},{}", offsets[d], lengths[d]);
  }
  return spec;
}

TensorSlice TensorSlice::parse_spec(const std::string& spec, const Shape& global, const std::string& origin) {
  TensorSlice slice;
  size_t begin = 0;
  for (size_t d = 0; d < global.rank(); ++d) {
    check(begin <= spec.size(), "{}: slice '{}' has fewer dimensions than the tensor's {}", origin, spec,
          global.to_string());
    const size_t end = std::min(spec.find(':', begin), spec.size());
    const std::string part = spec.substr(begin, end - begin);
    if (part == "-") {
      slice.offsets.push_back(0);
      slice.lengths.push_back(global[d]);
    } else {
      const size_t comma = part.find(',');
      size_t used_start = 0, used_length = 0;
      int64_t start = -1, length = -1;
      try {
        start = std::stoll(part.substr(0, comma), &used_start);
        length = std::stoll(part.substr(comma + 1), &used_length);
      } catch (const std::exception&) {
        used_start = 0;
      }
      check(comma != std::string::npos && used_start == comma && used_length == part.size() - comma - 1,
            "{}: slice '{}': dimension {} is '{}', not 'start,length' or '-'", origin, spec, d, part);
      slice.offsets.push_back(start);
      slice.lengths.push_back(length);
    }
    begin = end + 1;
  }
  check(begin == spec.size() + 1 || (global.rank() == 0 && spec.empty()),
        "{}: slice '{}' has more dimensions than the tensor's {}", origin, spec, global.to_string());
  check(slice.fits(global), "{}: slice '{}' does not lie inside shape {}", origin, spec, global.to_string());
  return slice;
}

void copy_box(const float* source, const Shape& source_shape, const std::vector<int64_t>& source_at, float* target,
              const Shape& target_shape, const std::vector<int64_t>& target_at, const Shape& region) {
  const size_t rank = region.rank();
  if (rank == 0) {
    *target = *source;
    return;
  }
  if (region.numel() == 0) return;
  // Row-major strides of both buffers; the last dimension is copied as one contiguous run.
  std::vector<int64_t> source_stride(rank, 1), target_stride(rank, 1);
  for (size_t d = rank - 1; d > 0; --d) {
    source_stride[d - 1] = source_stride[d] * source_shape[d];
    target_stride[d - 1] = target_stride[d] * target_shape[d];
  }
  std::vector<int64_t> index(rank, 0);  // within the region, the last dimension always 0
  const int64_t run = region[rank - 1];
  while (true) {
    int64_t from = 0, to = 0;
    for (size_t d = 0; d < rank; ++d) {
      from += (source_at[d] + index[d]) * source_stride[d];
      to += (target_at[d] + index[d]) * target_stride[d];
    }
    std::memcpy(target + to, source + from, static_cast<size_t>(run) * sizeof(float));
    size_t d = rank - 1;  // the next run: an odometer over every dimension but the last
    while (d > 0 && ++index[d - 1] == region[d - 1]) index[--d] = 0;
    if (d == 0) return;
  }
}

}  // namespace paraflow
