#include "ps/wire.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "base/error.h"

namespace paraflow::ps {

int64_t max_message_bytes() {
  const char* text = std::getenv("PARAFLOW_PS_MAX_MESSAGE_BYTES");
  if (text == nullptr) return kMaxMessageBytes;
  char* end = nullptr;
  const long long bytes = std::strtoll(text, &end, 10);
  check(end != text && *end == '\0' && bytes >= 4096 && bytes <= kMaxMessageBytes,
        "PARAFLOW_PS_MAX_MESSAGE_BYTES '{}': not a whole number of bytes in [4096, {}]", text, kMaxMessageBytes);
  return bytes;
}

std::string to_bytes(const float* values, int64_t count) {
  return std::string(reinterpret_cast<const char*>(values), static_cast<size_t>(count) * sizeof(float));
}

void from_bytes(const std::string& bytes, float* values, int64_t count, const std::string& what) {
  check(bytes.size() == static_cast<size_t>(count) * sizeof(float), "{}: {} bytes where {} float32 values ({} bytes) "
        "belong", what, bytes.size(), count, static_cast<size_t>(count) * sizeof(float));
  std::memcpy(values, bytes.data(), bytes.size());
}

namespace {

// Calls visit(whole_offset, position_in_range, count) for each run of the shard's elements
// [first, first + count) that lies in one piece.
template <typename Visit>
void for_each_run(const std::vector<Piece>& pieces, int64_t first, int64_t count, Visit visit) {
  int64_t start = 0;  // the piece's first element within the shard
  for (const Piece& piece : pieces) {
    const int64_t begin = std::max(first, start), end = std::min(first + count, start + piece.count);
    if (begin < end) visit(piece.offset + (begin - start), begin - first, end - begin);
    start += piece.count;
  }
}

}  // namespace

std::string gather_range(const float* whole, const std::vector<Piece>& pieces, int64_t first, int64_t count) {
  std::string bytes(static_cast<size_t>(count) * sizeof(float), '\0');
  for_each_run(pieces, first, count, [&](int64_t from, int64_t at, int64_t n) {
    std::memcpy(bytes.data() + at * static_cast<int64_t>(sizeof(float)), whole + from, static_cast<size_t>(n) * sizeof(float));
  });
  return bytes;
}

void scatter_range(const std::string& bytes, const std::vector<Piece>& pieces, int64_t first, float* whole,
                   const std::string& what) {
  const int64_t total = element_count(pieces);
  const auto count = static_cast<int64_t>(bytes.size() / sizeof(float));
  check(bytes.size() % sizeof(float) == 0 && first >= 0 && count <= total - first, "{}: {} bytes at element {} where "
        "the shard has {} float32 values", what, bytes.size(), first, total);
  for_each_run(pieces, first, count, [&](int64_t to, int64_t at, int64_t n) {
    std::memcpy(whole + to, bytes.data() + at * static_cast<int64_t>(sizeof(float)), static_cast<size_t>(n) * sizeof(float));
  });
}

}  // namespace paraflow::ps
