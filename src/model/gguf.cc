#include "model/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <limits>

#include "base/error.h"
#include "base/file_io.h"

namespace paraflow::model {

const char* gguf_type_name(GgufType type) {
  switch (type) {
    case GgufType::u8: return "uint8";
    case GgufType::i8: return "int8";
    case GgufType::u16: return "uint16";
    case GgufType::i16: return "int16";
    case GgufType::u32: return "uint32";
    case GgufType::i32: return "int32";
    case GgufType::f32: return "float32";
    case GgufType::boolean: return "bool";
    case GgufType::string: return "string";
    case GgufType::array: return "array";
    case GgufType::u64: return "uint64";
    case GgufType::i64: return "int64";
    case GgufType::f64: return "float64";
  }
  return "?";
}

int64_t GgufValue::as_int(const std::string& key) const {
  switch (type) {
    case GgufType::u8:
    case GgufType::u16:
    case GgufType::u32:
    case GgufType::u64:
      check(unsigned_value <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), "{}: {} is out of range", key,
            unsigned_value);
      return static_cast<int64_t>(unsigned_value);
    case GgufType::i8:
    case GgufType::i16:
    case GgufType::i32:
    case GgufType::i64: return signed_value;
    default: fail("{}: expected an integer, found a {}", key, gguf_type_name(type));
  }
}

double GgufValue::as_float(const std::string& key) const {
  if (type == GgufType::f32 || type == GgufType::f64) return float_value;
  return static_cast<double>(as_int(key));
}

const std::string& GgufValue::as_string(const std::string& key) const {
  check(type == GgufType::string, "{}: expected a string, found a {}", key, gguf_type_name(type));
  return string_value;
}

const std::vector<GgufValue>& GgufValue::as_array(const std::string& key, GgufType element) const {
  check(type == GgufType::array && element_type == element, "{}: expected an array of {}, found a {}{}{}", key,
        gguf_type_name(element), gguf_type_name(type), type == GgufType::array ? " of " : "",
        type == GgufType::array ? gguf_type_name(element_type) : "");
  return elements;
}

// The file's bytes, mapped read-only for the life of the GgufFile and of every tensor viewing them.
struct GgufFile::Mapping {
  const char* data = nullptr;
  size_t size = 0;
  ~Mapping() {
    if (data != nullptr && size > 0) munmap(const_cast<char*>(data), size);
  }
};

namespace {

// ggml's tensor types that we read, by their GGUF numbers; others are named in the refusal.
struct GgmlType {
  uint32_t id;
  const char* name;
};
constexpr GgmlType kGgmlTypes[] = {{0, "F32"},   {1, "F16"},   {2, "Q4_0"},  {3, "Q4_1"},  {6, "Q5_0"},  {7, "Q5_1"},
                                   {8, "Q8_0"},  {9, "Q8_1"},  {10, "Q2_K"}, {11, "Q3_K"}, {12, "Q4_K"}, {13, "Q5_K"},
                                   {14, "Q6_K"}, {15, "Q8_K"}, {16, "IQ2_XXS"}, {17, "IQ2_XS"}, {18, "IQ3_XXS"},
                                   {19, "IQ1_S"}, {20, "IQ4_NL"}, {21, "IQ3_S"}, {22, "IQ2_S"}, {23, "IQ4_XS"},
                                   {24, "I8"},   {25, "I16"},  {26, "I32"},  {27, "I64"},  {28, "F64"},  {29, "IQ1_M"},
                                   {30, "BF16"}, {34, "TQ1_0"}, {35, "TQ2_0"}, {39, "MXFP4"}};

std::string ggml_type_name(uint32_t id) {
  for (const GgmlType& type : kGgmlTypes) {
    if (type.id == id) return type.name;
  }
  return "unknown";
}

bool dtype_of_ggml(uint32_t id, DType& dtype) {
  switch (id) {
    case 0: dtype = DType::f32; return true;
    case 1: dtype = DType::f16; return true;
    case 6: dtype = DType::q5_0; return true;
    case 8: dtype = DType::q8_0; return true;
    case 12: dtype = DType::q4_k; return true;
    case 30: dtype = DType::bf16; return true;
    default: return false;
  }
}

// A cursor over the header: every read checks that the bytes are there, naming what it reads.
class Reader {
 public:
  Reader(const char* data, size_t size, const std::string& path) : data_(data), size_(size), path_(path) {}

  size_t offset() const { return offset_; }

  const char* take(uint64_t bytes, const std::string& what) {
    check(bytes <= size_ - offset_, "{}: truncated: {} at byte {} needs {} bytes, the file ends at {}", path_, what,
          offset_, bytes, size_);
    const char* at = data_ + offset_;
    offset_ += bytes;
    return at;
  }
  template <typename T>
  T read(const std::string& what) {
    T value;
    std::memcpy(&value, take(sizeof(T), what), sizeof(T));
    return value;
  }
  std::string string(const std::string& what) {
    const auto length = read<uint64_t>(what + "'s length");
    return std::string(take(length, what), length);
  }
  // An element count, checked against the bytes left (each element takes at least `min_bytes`),
  // so that a corrupt count is refused before anything is allocated for it.
  uint64_t count(const std::string& what, uint64_t min_bytes) {
    const size_t at = offset_;
    const auto n = read<uint64_t>(what);
    check(n <= (size_ - offset_) / min_bytes, "{}: {} at byte {} is {}, more than the {} bytes left can hold", path_,
          what, at, n, size_ - offset_);
    return n;
  }
  const std::string& path() const { return path_; }

 private:
  const char* data_;
  size_t size_;
  const std::string& path_;
  size_t offset_ = 0;
};

// The smallest encoding of a value of `type` (for the count checks).
uint64_t min_value_bytes(GgufType type) {
  switch (type) {
    case GgufType::u8:
    case GgufType::i8:
    case GgufType::boolean: return 1;
    case GgufType::u16:
    case GgufType::i16: return 2;
    case GgufType::u32:
    case GgufType::i32:
    case GgufType::f32: return 4;
    case GgufType::array: return 12;  // element type and count
    default: return 8;                // u64, i64, f64, and a string's length
  }
}

GgufValue read_value(Reader& in, GgufType type, const std::string& key, int depth) {
  GgufValue value;
  value.type = type;
  switch (type) {
    case GgufType::u8: value.unsigned_value = in.read<uint8_t>(key); break;
    case GgufType::i8: value.signed_value = in.read<int8_t>(key); break;
    case GgufType::u16: value.unsigned_value = in.read<uint16_t>(key); break;
    case GgufType::i16: value.signed_value = in.read<int16_t>(key); break;
    case GgufType::u32: value.unsigned_value = in.read<uint32_t>(key); break;
    case GgufType::i32: value.signed_value = in.read<int32_t>(key); break;
    case GgufType::u64: value.unsigned_value = in.read<uint64_t>(key); break;
    case GgufType::i64: value.signed_value = in.read<int64_t>(key); break;
    case GgufType::f32: value.float_value = in.read<float>(key); break;
    case GgufType::f64: value.float_value = in.read<double>(key); break;
    case GgufType::boolean: {
      const size_t at = in.offset();
      const auto byte = in.read<uint8_t>(key);
      check(byte <= 1, "{}: {} at byte {}: bool {} is neither 0 nor 1", in.path(), key, at, byte);
      value.unsigned_value = byte;
      break;
    }
    case GgufType::string: value.string_value = in.string(key); break;
    case GgufType::array: {
      check(depth < 8, "{}: {} at byte {}: arrays nested deeper than 8", in.path(), key, in.offset());
      const size_t at = in.offset();
      const auto element = in.read<uint32_t>(key + "'s element type");
      check(element <= static_cast<uint32_t>(GgufType::f64), "{}: {} at byte {}: unknown element type {}", in.path(), key,
            at, element);
      value.element_type = static_cast<GgufType>(element);
      const uint64_t n = in.count(key + "'s element count", min_value_bytes(value.element_type));
      value.elements.reserve(n);
      for (uint64_t i = 0; i < n; ++i) value.elements.push_back(read_value(in, value.element_type, key, depth + 1));
      break;
    }
  }
  return value;
}

}  // namespace

GgufFile GgufFile::open(const std::filesystem::path& path) {
  GgufFile file;
  file.path_ = path.string();
  const std::string& where = file.path_;
  file.mapping_ = std::make_shared<Mapping>();
  {
    const int fd = ::open(where.c_str(), O_RDONLY | O_CLOEXEC);
    check(fd >= 0, "{}: cannot open: {}", where, std::strerror(errno));
    struct stat status {};
    const bool stated = fstat(fd, &status) == 0;
    if (stated && status.st_size > 0) {
      void* data = mmap(nullptr, static_cast<size_t>(status.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
      if (data != MAP_FAILED) {
        file.mapping_->data = static_cast<const char*>(data);
        file.mapping_->size = static_cast<size_t>(status.st_size);
      }
    }
    ::close(fd);
    check(stated && (status.st_size == 0 || file.mapping_->data != nullptr), "{}: cannot map: {}", where,
          std::strerror(errno));
  }
  Reader in(file.mapping_->data, file.mapping_->size, where);
  const char* magic = in.take(4, "the magic 'GGUF'");
  check(std::memcmp(magic, "GGUF", 4) == 0, "{}: not a GGUF file (byte 0: no magic 'GGUF')", where);
  file.version_ = in.read<uint32_t>("the version");
  check(file.version_ == 2 || file.version_ == 3, "{}: GGUF version {} at byte 4 (versions 2 and 3 are read)", where,
        file.version_);
  // A tensor info takes at least 8 + 4 + 4 + 8 bytes (an empty name, no dims), a key-value pair 8 + 4 + 1.
  const uint64_t tensor_count = in.count("the tensor count", 24);
  const uint64_t kv_count = in.count("the metadata count", 13);
  for (uint64_t k = 0; k < kv_count; ++k) {
    const size_t at = in.offset();
    std::string key = in.string(fmt::format("metadata key {}", k));
    const auto type = in.read<uint32_t>(key + "'s type");
    check(type <= static_cast<uint32_t>(GgufType::f64), "{}: metadata '{}' at byte {}: unknown value type {}", where, key,
          at, type);
    GgufValue value = read_value(in, static_cast<GgufType>(type), key, 0);
    check(file.metadata_.emplace(key, std::move(value)).second, "{}: metadata '{}' at byte {} appears twice", where, key,
          at);
  }
  if (file.contains("general.alignment")) {
    const uint64_t alignment = static_cast<uint64_t>(file.value("general.alignment").as_int("general.alignment"));
    check(alignment > 0 && alignment % 8 == 0 && alignment <= 65536,
          "{}: general.alignment {} is not a multiple of 8 in [8, 65536]", where, alignment);
    file.alignment_ = alignment;
  }
  std::vector<size_t> info_offsets;
  for (uint64_t t = 0; t < tensor_count; ++t) {
    const size_t at = in.offset();
    info_offsets.push_back(at);
    GgufTensorInfo info;
    info.name = in.string(fmt::format("tensor info {}'s name", t));
    const std::string what = fmt::format("tensor '{}' (info at byte {})", info.name, at);
    const auto rank = in.read<uint32_t>(what + "'s rank");
    check(rank >= 1 && rank <= 4, "{}: {} has {} dimensions (1 to 4)", where, what, rank);
    std::vector<int64_t> dims(rank);
    uint64_t elements = 1;
    for (uint32_t d = 0; d < rank; ++d) {
      const auto size = in.read<uint64_t>(what + "'s dimension");
      check(size >= 1 && size <= (uint64_t{1} << 40) && !__builtin_mul_overflow(elements, size, &elements) &&
                elements <= (uint64_t{1} << 50),
            "{}: {}: dimension {} of {} is implausible", where, what, d, size);
      dims[rank - 1 - d] = static_cast<int64_t>(size);  // ne[0] is the innermost
    }
    info.shape = Shape(dims);
    const auto type = in.read<uint32_t>(what + "'s type");
    check(dtype_of_ggml(type, info.dtype), "{}: {} has ggml type {} ({}): only F32, F16, BF16, Q8_0, Q4_K and Q5_0 are read", where,
          what, type, ggml_type_name(type));
    const int64_t block = dtype_block_elements(info.dtype);
    check(dims.back() % block == 0, "{}: {}: its rows of {} are not whole {}-value blocks of {}", where, what, dims.back(),
          block, dtype_name(info.dtype));
    info.bytes = dtype_bytes(info.dtype, static_cast<int64_t>(elements));
    info.offset = in.read<uint64_t>(what + "'s offset");
    check(info.offset % file.alignment_ == 0, "{}: {}: offset {} is not a multiple of the alignment {}", where, what,
          info.offset, file.alignment_);
    check(file.index_.emplace(info.name, file.tensors_.size()).second, "{}: {}: a second tensor of that name", where,
          what);
    file.tensors_.push_back(std::move(info));
  }
  file.data_start_ = (in.offset() + file.alignment_ - 1) / file.alignment_ * file.alignment_;
  const uint64_t data_size = file.mapping_->size >= file.data_start_ ? file.mapping_->size - file.data_start_ : 0;
  for (size_t t = 0; t < file.tensors_.size(); ++t) {
    const GgufTensorInfo& info = file.tensors_[t];
    check(info.offset <= data_size && info.bytes <= data_size - info.offset,
          "{}: tensor '{}' (info at byte {}): its {} bytes at data offset {} (file byte {}) run past the end of the file "
          "(byte {}; truncated?)",
          where, info.name, info_offsets[t], info.bytes, info.offset, file.data_start_ + info.offset, file.mapping_->size);
  }
  return file;
}

const GgufValue& GgufFile::value(const std::string& key) const {
  auto found = metadata_.find(key);
  check(found != metadata_.end(), "{}: no metadata '{}'", path_, key);
  return found->second;
}

const GgufTensorInfo& GgufFile::tensor_info(const std::string& name) const {
  auto found = index_.find(name);
  check(found != index_.end(), "{}: no tensor '{}'", path_, name);
  return tensors_[found->second];
}

Tensor GgufFile::tensor(const std::string& name) const {
  const GgufTensorInfo& info = tensor_info(name);
  // A storage over the tensor's mapped bytes that holds the mapping alive.
  auto mapping = mapping_;
  void* data = const_cast<char*>(mapping_->data + data_start_ + info.offset);
  auto storage = std::make_shared<Storage>(data, info.bytes, Device{}, true, [mapping](void*) {});
  return Tensor(std::move(storage), 0, info.shape, info.dtype);
}

namespace {

uint32_t ggml_type_of(DType dtype, const std::string& name) {
  switch (dtype) {
    case DType::f32: return 0;
    case DType::f16: return 1;
    case DType::q5_0: return 6;
    case DType::q8_0: return 8;
    case DType::q4_k: return 12;
    case DType::bf16: return 30;
    default: fail("GGUF: tensor '{}' is {}, not F32, F16, BF16, Q8_0, Q4_K or Q5_0", name, dtype_name(dtype));
  }
}

template <typename T>
void put(std::string& out, T value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof(T));
}

void put_string(std::string& out, const std::string& text) {
  put<uint64_t>(out, text.size());
  out += text;
}

void put_value(std::string& out, const GgufValue& value) {
  switch (value.type) {
    case GgufType::u8: put(out, static_cast<uint8_t>(value.unsigned_value)); break;
    case GgufType::i8: put(out, static_cast<int8_t>(value.signed_value)); break;
    case GgufType::u16: put(out, static_cast<uint16_t>(value.unsigned_value)); break;
    case GgufType::i16: put(out, static_cast<int16_t>(value.signed_value)); break;
    case GgufType::u32: put(out, static_cast<uint32_t>(value.unsigned_value)); break;
    case GgufType::i32: put(out, static_cast<int32_t>(value.signed_value)); break;
    case GgufType::u64: put(out, value.unsigned_value); break;
    case GgufType::i64: put(out, value.signed_value); break;
    case GgufType::f32: put(out, static_cast<float>(value.float_value)); break;
    case GgufType::f64: put(out, value.float_value); break;
    case GgufType::boolean: put(out, static_cast<uint8_t>(value.unsigned_value)); break;
    case GgufType::string: put_string(out, value.string_value); break;
    case GgufType::array:
      put(out, static_cast<uint32_t>(value.element_type));
      put<uint64_t>(out, value.elements.size());
      for (const GgufValue& element : value.elements) put_value(out, element);
      break;
  }
}

void pad(std::string& out, uint64_t alignment) { out.append((alignment - out.size() % alignment) % alignment, '\0'); }

}  // namespace

void write_gguf(const std::filesystem::path& path, const std::vector<std::pair<std::string, GgufValue>>& metadata,
                const std::vector<std::pair<std::string, Tensor>>& tensors, uint64_t alignment) {
  std::vector<std::pair<std::string, GgufValue>> keys = metadata;
  if (alignment != 32) keys.emplace_back("general.alignment", gguf_u32(static_cast<uint32_t>(alignment)));
  std::string out = "GGUF";
  put<uint32_t>(out, 3);
  put<uint64_t>(out, tensors.size());
  put<uint64_t>(out, keys.size());
  for (const auto& [key, value] : keys) {
    put_string(out, key);
    put(out, static_cast<uint32_t>(value.type));
    put_value(out, value);
  }
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    put_string(out, name);
    const std::vector<int64_t>& dims = tensor.shape().dims();
    put<uint32_t>(out, static_cast<uint32_t>(dims.size()));
    for (auto dim = dims.rbegin(); dim != dims.rend(); ++dim) put<uint64_t>(out, static_cast<uint64_t>(*dim));  // ne[0] innermost
    put(out, ggml_type_of(tensor.dtype(), name));
    put<uint64_t>(out, offset);
    offset += (tensor.nbytes() + alignment - 1) / alignment * alignment;
  }
  pad(out, alignment);
  for (const auto& [name, tensor] : tensors) {
    out.append(static_cast<const char*>(tensor.raw()), tensor.nbytes());
    pad(out, alignment);
  }
  write_file_atomic(path, out);
}

GgufValue gguf_string(std::string value) {
  GgufValue result;
  result.type = GgufType::string;
  result.string_value = std::move(value);
  return result;
}

GgufValue gguf_u32(uint32_t value) {
  GgufValue result;
  result.type = GgufType::u32;
  result.unsigned_value = value;
  return result;
}

GgufValue gguf_f32(float value) {
  GgufValue result;
  result.type = GgufType::f32;
  result.float_value = value;
  return result;
}

GgufValue gguf_bool(bool value) {
  GgufValue result;
  result.type = GgufType::boolean;
  result.unsigned_value = value ? 1 : 0;
  return result;
}

GgufValue gguf_strings(const std::vector<std::string>& values) {
  GgufValue result;
  result.type = GgufType::array;
  result.element_type = GgufType::string;
  for (const std::string& value : values) result.elements.push_back(gguf_string(value));
  return result;
}

GgufValue gguf_i32s(const std::vector<int32_t>& values) {
  GgufValue result;
  result.type = GgufType::array;
  result.element_type = GgufType::i32;
  for (int32_t value : values) {
    GgufValue element;
    element.type = GgufType::i32;
    element.signed_value = value;
    result.elements.push_back(element);
  }
  return result;
}

GgufValue gguf_f32s(const std::vector<float>& values) {
  GgufValue result;
  result.type = GgufType::array;
  result.element_type = GgufType::f32;
  for (float value : values) result.elements.push_back(gguf_f32(value));
  return result;
}

}  // namespace paraflow::model
