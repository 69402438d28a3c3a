#include "model/part_slices.h"

#include <algorithm>
#include <map>

#include "base/error.h"

namespace paraflow::model {

namespace {

// A 1-D tensor is one row: its boxes are made 2-D here and 1-D again at the end.
TensorSlice as_rank(const TensorSlice& box, size_t rank) {
  if (rank == 2) return box;
  return {{box.offsets[1]}, {box.lengths[1]}};
}

// Elements [from, to) of a [rows, columns] tensor as at most three boxes: the rest of the first
// row, whole rows, the start of the last row.
std::vector<TensorSlice> range_boxes(int64_t columns, int64_t from, int64_t to) {
  std::vector<TensorSlice> boxes;
  int64_t row = from / columns, column = from % columns;
  const int64_t last_row = to / columns, last_column = to % columns;
  if (row == last_row) {
    if (to > from) boxes.push_back({{row, column}, {1, last_column - column}});
    return boxes;
  }
  if (column > 0) boxes.push_back({{row++, column}, {1, columns - column}});
  if (last_row > row) boxes.push_back({{row, 0}, {last_row - row, columns}});
  if (last_column > 0) boxes.push_back({{last_row, 0}, {1, last_column}});
  return boxes;
}

// Where row `r` of `box` starts in a window holding elements [begin, ...) of the part's buffer.
int64_t row_in_window(const ParameterSet& part, const PartBox& box, int64_t begin, int64_t r) {
  const Shape& shape = part.specs()[box.tensor].shape;
  const int64_t row = shape.rank() == 2 ? box.local.offsets[0] + r : 0;
  return part.offset_of(box.tensor) + row * shape.dims().back() + box.local.offsets.back() - begin;
}

int64_t box_rows(const PartBox& box) { return box.local.offsets.size() == 2 ? box.local.lengths[0] : 1; }

}  // namespace

std::vector<PartBox> part_boxes(const ParameterSet& part, const std::vector<TensorSpec>& whole,
                                const TensorShard& shard, int64_t begin, int64_t end) {
  std::map<std::string, const TensorSpec*> by_name;
  for (const TensorSpec& spec : whole) by_name[spec.name] = &spec;
  std::vector<PartBox> boxes;
  for (size_t i = 0; i < part.specs().size(); ++i) {
    const TensorSpec& spec = part.specs()[i];
    const int64_t offset = part.offset_of(i);
    const int64_t from = std::max(begin, offset) - offset, to = std::min(end, offset + spec.shape.numel()) - offset;
    if (to <= from) continue;
    auto found = by_name.find(spec.name);
    check(found != by_name.end(), "part_boxes: {} is not a tensor of the model", spec.name);
    const size_t rank = spec.shape.rank();
    check(rank == 1 || rank == 2, "part_boxes: {} is {}-D", spec.name, rank);
    const int64_t columns = spec.shape.dims().back();
    for (const TensorSlice& range : range_boxes(columns, from, to)) {
      const TensorSlice local = as_rank(range, rank);
      // The range may span several placements (qkv's sections): one box per overlap.
      for (const SlicePlacement& placement : shard_slices(*found->second, shard)) {
        const std::optional<TensorSlice> overlap = placement.local.intersect(local);
        if (!overlap) continue;
        boxes.push_back({i, *overlap, overlap->moved(placement.local.offsets, placement.global.offsets),
                         placement.first_holder});
      }
    }
  }
  return boxes;
}

std::vector<SliceValues> part_slice_values(const ParameterSet& part, const std::vector<TensorSpec>& whole,
                                           const TensorShard& shard, const std::string& prefix, const float* window,
                                           int64_t begin, int64_t end) {
  std::map<std::string, Shape> shapes;
  for (const TensorSpec& spec : whole) shapes[spec.name] = spec.shape;
  std::vector<SliceValues> slices;
  for (const PartBox& box : part_boxes(part, whole, shard, begin, end)) {
    if (!box.first_holder) continue;  // another shard writes these elements
    const std::string& name = part.specs()[box.tensor].name;
    slices.push_back({prefix + name, shapes.at(name), box.global, [&part, box, window, begin] {
                        std::vector<float> values(static_cast<size_t>(box.global.numel()));
                        const int64_t width = box.local.lengths.back();
                        for (int64_t r = 0; r < box_rows(box); ++r) {
                          const float* row = window + row_in_window(part, box, begin, r);
                          std::copy(row, row + width, values.begin() + r * width);
                        }
                        return values;
                      }});
  }
  return slices;
}

void read_part(SliceReader& reader, const ParameterSet& part, const std::vector<TensorSpec>& whole,
               const TensorShard& shard, const std::string& prefix, float* window, int64_t begin, int64_t end) {
  for (const PartBox& box : part_boxes(part, whole, shard, begin, end)) {
    std::vector<float> values = reader.read(prefix + part.specs()[box.tensor].name, box.global);
    const int64_t width = box.local.lengths.back();
    for (int64_t r = 0; r < box_rows(box); ++r) {
      std::copy(values.begin() + r * width, values.begin() + (r + 1) * width, window + row_in_window(part, box, begin, r));
    }
  }
}

}  // namespace paraflow::model
