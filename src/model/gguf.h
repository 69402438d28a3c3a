// GGUF files (llama.cpp's format, version 3; version 2 has the same layout), read: the header,
// the metadata (key -> typed value, every GGUF value type, arrays nested), the tensor infos and
// the aligned data section, memory-mapped so that a tensor is a view of the file's bytes (a Q8_0
// or Q4_K tensor is our blocks as they are). Tensor types F32, F16, BF16, Q8_0, Q4_K and Q5_0; any other is
// refused naming the tensor, its type and where its info lies. Every error names the file, the
// key or tensor at fault and the byte offset.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace paraflow::model {

// GGUF's value types, numbered as the format numbers them.
enum class GgufType : uint32_t { u8 = 0, i8, u16, i16, u32, i32, f32, boolean, string, array, u64, i64, f64 };
const char* gguf_type_name(GgufType type);

struct GgufValue {
  GgufType type = GgufType::u8;
  GgufType element_type = GgufType::u8;  // of an array
  uint64_t unsigned_value = 0;           // u8 .. u64, and bool
  int64_t signed_value = 0;              // i8 .. i64
  double float_value = 0;                // f32, f64
  std::string string_value;
  std::vector<GgufValue> elements;  // an array's

  // The value as that kind, checked (an unsigned or signed integer either way if it fits);
  // errors name `key`.
  int64_t as_int(const std::string& key) const;
  double as_float(const std::string& key) const;
  const std::string& as_string(const std::string& key) const;
  const std::vector<GgufValue>& as_array(const std::string& key, GgufType element) const;
};

struct GgufTensorInfo {
  std::string name;
  Shape shape;  // row-major: GGUF's ne[] reversed (ne[0], the innermost, is the last dimension)
  DType dtype = DType::f32;
  uint64_t offset = 0;  // in the data section
  size_t bytes = 0;
};

class GgufFile {
 public:
  // Maps and parses `path`; throws InputError naming the path, the field and the byte offset.
  static GgufFile open(const std::filesystem::path& path);

  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  const std::map<std::string, GgufValue>& metadata() const { return metadata_; }
  // The key's value; fails naming the file and the key when it is missing.
  const GgufValue& value(const std::string& key) const;
  bool contains(const std::string& key) const { return metadata_.count(key) > 0; }
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  bool contains_tensor(const std::string& name) const { return index_.count(name) > 0; }
  const GgufTensorInfo& tensor_info(const std::string& name) const;
  // A host tensor viewing the mapped bytes (read-only: the file is mapped so), kept valid by the
  // tensor itself.
  Tensor tensor(const std::string& name) const;
  const std::string& path() const { return path_; }

 private:
  struct Mapping;
  std::string path_;
  std::shared_ptr<Mapping> mapping_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_start_ = 0;
  std::map<std::string, GgufValue> metadata_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t> index_;
};

// Writes a GGUF file (version 3) atomically: `metadata` in order, then the tensors' infos and
// their bytes (F32, F16, BF16, Q8_0, Q4_K or Q5_0 host tensors, as they are), each aligned to `alignment`
// (general.alignment is written when it is not GGUF's default 32).
void write_gguf(const std::filesystem::path& path, const std::vector<std::pair<std::string, GgufValue>>& metadata,
                const std::vector<std::pair<std::string, Tensor>>& tensors, uint64_t alignment = 32);

// Values to write: a string, a uint32, a float32, a bool, an array of strings, of int32 or of float32.
GgufValue gguf_string(std::string value);
GgufValue gguf_u32(uint32_t value);
GgufValue gguf_f32(float value);
GgufValue gguf_strings(const std::vector<std::string>& values);
GgufValue gguf_bool(bool value);
GgufValue gguf_i32s(const std::vector<int32_t>& values);
GgufValue gguf_f32s(const std::vector<float>& values);

}  // namespace paraflow::model
