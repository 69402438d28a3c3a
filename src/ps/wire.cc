#include "ps/wire.h"

#include <cstring>

#include "base/error.h"

namespace paraflow::ps {

std::string to_bytes(const float* values, int64_t count) {
  return std::string(reinterpret_cast<const char*>(values), static_cast<size_t>(count) * sizeof(float));
}

void from_bytes(const std::string& bytes, float* values, int64_t count, const std::string& what) {
  check(bytes.size() == static_cast<size_t>(count) * sizeof(float), "{}: {} bytes where {} float32 values ({} bytes) "
        "belong", what, bytes.size(), count, static_cast<size_t>(count) * sizeof(float));
  std::memcpy(values, bytes.data(), bytes.size());
}

std::string gather_pieces(const float* whole, const std::vector<Piece>& pieces) {
  std::string bytes;
  for (const Piece& piece : pieces) bytes += to_bytes(whole + piece.offset, piece.count);
  return bytes;
}

void scatter_pieces(const std::string& bytes, const std::vector<Piece>& pieces, float* whole, const std::string& what) {
  int64_t total = 0;
  for (const Piece& piece : pieces) total += piece.count;
  check(bytes.size() == static_cast<size_t>(total) * sizeof(float), "{}: {} bytes where the shard's {} float32 "
        "values belong", what, bytes.size(), total);
  const char* at = bytes.data();
  for (const Piece& piece : pieces) {
    std::memcpy(whole + piece.offset, at, static_cast<size_t>(piece.count) * sizeof(float));
    at += piece.count * static_cast<int64_t>(sizeof(float));
  }
}

}  // namespace paraflow::ps
