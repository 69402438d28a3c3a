// The safetensors format: 8-byte little-endian header length, a JSON header mapping each tensor
// name to {dtype, shape, data_offsets}, then the raw little-endian data. The reader validates
// every field before touching the data, and names the file and the problem when it refuses.
#pragma once

#include <map>
#include <string>
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

  const std::map<std::string, SafetensorsEntry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool contains(const std::string& name) const { return entries_.count(name) != 0; }
  const SafetensorsEntry& entry(const std::string& name) const;
  // A host tensor holding a copy of the named tensor's bytes.
  Tensor tensor(const std::string& name) const;
  // Copies the named tensor into `destination`, converting to f32 from f32/f16/bf16/f64; checks shape.
  void read_into(const std::string& name, const Tensor& destination) const;
  const std::string& origin() const { return origin_; }

 private:
  std::string origin_;
  std::string bytes_;
  size_t data_start_ = 0;
  std::map<std::string, SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

// Serialises host tensors (in the given order) with optional string metadata.
std::string serialize_safetensors(const std::vector<std::pair<std::string, Tensor>>& tensors,
                                  const std::map<std::string, std::string>& metadata = {});

}  // namespace paraflow::model
