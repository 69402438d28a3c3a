// The safetensors format: 8-byte little-endian header length, a JSON header mapping each tensor
// name to {dtype, shape, data_offsets}, then the raw little-endian data. The reader validates
// every field before touching the data, and names the file and the problem when it refuses.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tensor/tensor.h"

namespace paraflow::model {

struct SafetensorsEntry {
  DType dtype;
  Shape shape;
  size_t begin = 0, end = 0;  // byte offsets into the data section
};

class SafetensorsFile {
 public:
  // `origin` names the bytes in error messages (usually the path).
  static SafetensorsFile parse(std::string bytes, const std::string& origin);
  static SafetensorsFile load(const std::string& path);
  // Maps the file instead of reading it: only the pages of the tensors read are loaded, and they
  // are the page cache's, not a copy.
  static SafetensorsFile map(const std::string& path);

  const std::map<std::string, SafetensorsEntry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool contains(const std::string& name) const { return entries_.count(name) != 0; }
  const SafetensorsEntry& entry(const std::string& name) const;
  // A host tensor holding a copy of the named tensor's bytes.
  Tensor tensor(const std::string& name) const;
  // Copies the named tensor into `destination`, converting to f32 from f32/f16/bf16/f64; checks shape.
  void read_into(const std::string& name, const Tensor& destination) const;
  // The named tensor's values where the file holds them; refuses a dtype other than f32.
  const float* f32_data(const std::string& name) const;
  // A mapped file: lets the kernel drop the named tensor's pages from this process (they stay in
  // the page cache, and are read again if touched again), so reading a file tensor by tensor
  // keeps about one tensor resident. Nothing for a file read into memory.
  void release(const std::string& name) const;
  // A mapped file: `count` f32 values from byte `begin` of the data section, as a tensor viewing
  // the mapping (and keeping it alive): nothing copied, and never to be written (its pages are
  // read-only). None for a file read into memory, a run past the data's end, or one not 4-byte aligned.
  std::optional<Tensor> mapped_f32(size_t begin, int64_t count) const;
  // A mapped file: the named tensor as it is stored (f32, f16 or bf16), a tensor viewing the
  // mapping as mapped_f32's do. None for a file read into memory, another dtype, or one not
  // aligned to its element size.
  std::optional<Tensor> mapped(const std::string& name) const;
  const std::string& origin() const { return origin_; }

 private:
  static SafetensorsFile parse_bytes(std::shared_ptr<const void> owner, std::string_view bytes, const std::string& origin);
  // `shape` of `dtype` from byte `begin` of the data section, viewing the mapping (see mapped_f32).
  std::optional<Tensor> mapped_view(size_t begin, const Shape& shape, DType dtype) const;

  std::string origin_;
  std::shared_ptr<const void> owner_;  // keeps `bytes_` alive: a string, or a mapping
  std::string_view bytes_;
  bool mapped_ = false;
  size_t data_start_ = 0;
  std::map<std::string, SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

// The start of a safetensors file holding tensors of these names, dtypes and shapes in this order
// (the 8-byte header length and the header): the tensors' bytes follow, in order.
struct SafetensorsHeaderEntry {
  std::string name;
  DType dtype;
  Shape shape;
};
std::string safetensors_header(const std::vector<SafetensorsHeaderEntry>& entries,
                               const std::map<std::string, std::string>& metadata = {});

// Serialises host tensors (in the given order) with optional string metadata.
std::string serialize_safetensors(const std::vector<std::pair<std::string, Tensor>>& tensors,
                                  const std::map<std::string, std::string>& metadata = {});

}  // namespace paraflow::model
