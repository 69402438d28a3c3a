#include "model/safetensors.h"

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "base/error.h"
#include "base/json.h"
#include "base/system_memory.h"
#include "base/file_io.h"

namespace paraflow::model {

namespace {

constexpr uint64_t kMaxHeaderBytes = 100u << 20;  // the reference implementation's limit

}  // namespace

SafetensorsFile SafetensorsFile::parse(std::string bytes, const std::string& origin) {
  auto owner = std::make_shared<const std::string>(std::move(bytes));
  return parse_bytes(owner, *owner, origin);
}

SafetensorsFile SafetensorsFile::map(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw IoError(fmt::format("{}: cannot open for reading: {}", path, std::strerror(errno)));
  struct stat status {};
  const int stat_result = ::fstat(fd, &status);
  const auto size = static_cast<size_t>(status.st_size);
  void* mapped = stat_result == 0 && size > 0 ? ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0) : MAP_FAILED;
  const int error = errno;
  ::close(fd);
  if (stat_result != 0 || size == 0) return parse(std::string(), path);  // refused as too short
  if (mapped == MAP_FAILED) throw IoError(fmt::format("{}: cannot map: {}", path, std::strerror(error)));
  std::shared_ptr<const void> owner(mapped, [size](const void* at) { ::munmap(const_cast<void*>(at), size); });
  SafetensorsFile file = parse_bytes(owner, std::string_view(static_cast<const char*>(mapped), size), path);
  file.mapped_ = true;
  return file;
}

void SafetensorsFile::release(const std::string& name) const {
  if (!mapped_) return;
  const SafetensorsEntry& e = entry(name);
  release_mapped_pages(bytes_.data() + data_start_ + e.begin, e.end - e.begin);
}

std::optional<Tensor> SafetensorsFile::mapped_view(size_t begin, const Shape& shape, DType dtype) const {
  const size_t bytes = dtype_bytes(dtype, shape.numel());
  if (!mapped_ || begin > bytes_.size() - data_start_ || bytes > bytes_.size() - data_start_ - begin) return std::nullopt;
  void* at = const_cast<char*>(bytes_.data() + data_start_ + begin);
  if (reinterpret_cast<uintptr_t>(at) % dtype_bytes(dtype, 1) != 0) return std::nullopt;  // another writer's padding
  // A storage over those bytes that holds the mapping alive, as GgufFile::tensor's does.
  auto storage = std::make_shared<Storage>(at, bytes, Device{}, true, [mapping = owner_](void*) {});
  return Tensor(std::move(storage), 0, shape, dtype);
}

std::optional<Tensor> SafetensorsFile::mapped_f32(size_t begin, int64_t count) const {
  return mapped_view(begin, Shape{count}, DType::f32);
}

std::optional<Tensor> SafetensorsFile::mapped(const std::string& name) const {
  const SafetensorsEntry& e = entry(name);
  if (e.dtype != DType::f32 && e.dtype != DType::f16 && e.dtype != DType::bf16) return std::nullopt;
  return mapped_view(e.begin, e.shape, e.dtype);
}

SafetensorsFile SafetensorsFile::parse_bytes(std::shared_ptr<const void> owner, std::string_view bytes,
                                             const std::string& origin) {
  SafetensorsFile file;
  file.origin_ = origin;
  check(bytes.size() >= 8, "{}: file is {} bytes, too short for the 8-byte header length", origin, bytes.size());
  uint64_t header_length = 0;
  for (int i = 7; i >= 0; --i) header_length = (header_length << 8) | static_cast<uint8_t>(bytes[static_cast<size_t>(i)]);
  check(header_length <= kMaxHeaderBytes, "{}: header length {} exceeds the {}-byte limit", origin, header_length,
        kMaxHeaderBytes);
  check(header_length <= bytes.size() - 8, "{}: header length {} runs past the end of the {}-byte file", origin,
        header_length, bytes.size());
  const nlohmann::json header = parse_json(bytes.substr(8, header_length), origin + " header");
  check(header.is_object(), "{}: header must be a JSON object", origin);
  file.data_start_ = 8 + header_length;
  const size_t data_size = bytes.size() - file.data_start_;

  std::vector<std::pair<size_t, size_t>> ranges;
  for (auto& [name, info] : header.items()) {
    if (name == "__metadata__") {
      check(info.is_object(), "{}: __metadata__ must be an object of strings", origin);
      for (auto& [key, value] : info.items()) {
        check(value.is_string(), "{}: __metadata__ field '{}' must be a string", origin, key);
        file.metadata_[key] = value.get<std::string>();
      }
      continue;
    }
    std::string where = fmt::format("{}: tensor '{}'", origin, name);
    check(info.is_object(), "{}: entry must be an object", where);
    check(info.contains("dtype") && info["dtype"].is_string(), "{}: missing string field 'dtype'", where);
    check(info.contains("shape") && info["shape"].is_array(), "{}: missing array field 'shape'", where);
    check(info.contains("data_offsets") && info["data_offsets"].is_array() && info["data_offsets"].size() == 2,
          "{}: 'data_offsets' must be [begin, end]", where);
    SafetensorsEntry entry;
    entry.dtype = parse_dtype(info["dtype"].get<std::string>(), where + " field 'dtype'");
    check(!is_block_quantized(entry.dtype), "{} field 'dtype': {} is not a safetensors dtype", where,
          dtype_name(entry.dtype));
    std::vector<int64_t> dims;
    uint64_t elements = 1;  // checked as it grows: a product past 2^63 would wrap
    for (const auto& dim : info["shape"]) {
      check(dim.is_number_integer() && (dim.is_number_unsigned() || dim.get<int64_t>() >= 0),
            "{}: shape entries must be non-negative integers, got {}", where, dim.dump());
      const auto size = dim.get<uint64_t>();
      check(size <= (uint64_t{1} << 40) && !__builtin_mul_overflow(elements, size, &elements) &&
                elements <= (uint64_t{1} << 50),
            "{}: shape {} is implausibly large", where, info["shape"].dump());
      dims.push_back(static_cast<int64_t>(size));
    }
    entry.shape = Shape(dims);
    for (const auto& offset : info["data_offsets"]) {
      check(offset.is_number_unsigned() || (offset.is_number_integer() && offset.get<int64_t>() >= 0),
            "{}: data_offsets must be non-negative integers, got {}", where, offset.dump());
    }
    entry.begin = info["data_offsets"][0].get<size_t>();
    entry.end = info["data_offsets"][1].get<size_t>();
    check(entry.begin <= entry.end, "{}: data_offsets [{}, {}] are reversed", where, entry.begin, entry.end);
    check(entry.end <= data_size, "{}: data_offsets [{}, {}] run past the {}-byte data section (file truncated?)",
          where, entry.begin, entry.end, data_size);
    size_t expected = static_cast<size_t>(entry.shape.numel()) * dtype_size(entry.dtype);
    check(entry.end - entry.begin == expected, "{}: {} {} needs {} bytes but data_offsets span {}", where,
          dtype_name(entry.dtype), entry.shape.to_string(), expected, entry.end - entry.begin);
    ranges.emplace_back(entry.begin, entry.end);
    file.entries_[name] = entry;
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    check(ranges[i].first >= ranges[i - 1].second, "{}: tensors overlap at data byte {}", origin, ranges[i].first);
  }
  file.owner_ = std::move(owner);
  file.bytes_ = bytes;
  return file;
}

SafetensorsFile SafetensorsFile::load(const std::string& path) { return parse(read_file(path), path); }

const float* SafetensorsFile::f32_data(const std::string& name) const {
  const SafetensorsEntry& e = entry(name);
  check(e.dtype == DType::f32, "{}: tensor '{}' has dtype {}, expected F32", origin_, name, dtype_name(e.dtype));
  // A file we wrote starts its data 8-byte aligned; another's may not be, and is refused here.
  const char* at = bytes_.data() + data_start_ + e.begin;
  check(reinterpret_cast<uintptr_t>(at) % alignof(float) == 0, "{}: tensor '{}' is not 4-byte aligned", origin_, name);
  return reinterpret_cast<const float*>(at);
}

const SafetensorsEntry& SafetensorsFile::entry(const std::string& name) const {
  auto found = entries_.find(name);
  if (found == entries_.end()) fail("{}: no tensor named '{}'", origin_, name);
  return found->second;
}

Tensor SafetensorsFile::tensor(const std::string& name) const {
  const SafetensorsEntry& e = entry(name);
  Tensor result = Tensor::zeros(e.shape, e.dtype);
  std::memcpy(result.raw(), bytes_.data() + data_start_ + e.begin, e.end - e.begin);
  return result;
}

void SafetensorsFile::read_into(const std::string& name, const Tensor& destination) const {
  const SafetensorsEntry& e = entry(name);
  check(e.shape == destination.shape(), "{}: tensor '{}' has shape {}, expected {}", origin_, name,
        e.shape.to_string(), destination.shape().to_string());
  const char* source = bytes_.data() + data_start_ + e.begin;
  float* out = destination.data<float>();
  const int64_t n = e.shape.numel();
  switch (e.dtype) {
    case DType::f32: std::memcpy(out, source, static_cast<size_t>(n) * 4); break;
    case DType::f64:
      for (int64_t i = 0; i < n; ++i) {
        double value;
        std::memcpy(&value, source + i * 8, 8);
        out[i] = static_cast<float>(value);
      }
      break;
    case DType::bf16:
    case DType::f16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t bits;
        std::memcpy(&bits, source + i * 2, 2);
        out[i] = e.dtype == DType::bf16 ? bf16_to_f32(bits) : f16_to_f32(bits);
      }
      break;
    default:
      fail("{}: tensor '{}' has dtype {}, expected a floating-point type", origin_, name, dtype_name(e.dtype));
  }
}

std::string safetensors_header(const std::vector<SafetensorsHeaderEntry>& entries,
                               const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  size_t offset = 0;
  for (const SafetensorsHeaderEntry& entry : entries) {
    check(!is_block_quantized(entry.dtype), "safetensors: {} cannot be stored as {} (block-quantized: GGUF holds it)",
          entry.name, dtype_name(entry.dtype));
    const size_t bytes = static_cast<size_t>(entry.shape.numel()) * dtype_size(entry.dtype);
    header[entry.name] = {{"dtype", safetensors_dtype_name(entry.dtype)},
                          {"shape", entry.shape.dims()},
                          {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string header_text = header.dump();
  header_text.append((8 - header_text.size() % 8) % 8, ' ');  // align the data section to 8 bytes
  std::string out;
  uint64_t length = header_text.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((length >> (8 * i)) & 0xFF));
  return out + header_text;
}

std::string serialize_safetensors(const std::vector<std::pair<std::string, Tensor>>& tensors,
                                  const std::map<std::string, std::string>& metadata) {
  std::vector<SafetensorsHeaderEntry> entries;
  size_t bytes = 0;
  for (const auto& [name, tensor] : tensors) {
    entries.push_back({name, tensor.dtype(), tensor.shape()});
    bytes += tensor.nbytes();
  }
  std::string out = safetensors_header(entries, metadata);
  out.reserve(out.size() + bytes);
  for (const auto& [name, tensor] : tensors) out.append(static_cast<const char*>(tensor.raw()), tensor.nbytes());
  return out;
}

}  // namespace paraflow::model
