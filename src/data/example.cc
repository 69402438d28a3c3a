#include "data/example.h"

#include <algorithm>
#include <limits>

#include "base/error.h"

namespace paraflow::data {

std::string RecordSource::describe() const { return fmt::format("{}: record at byte offset {}", file, offset); }

std::string make_int64_example(std::string_view key, std::span<const int64_t> values) {
  tf::Example example;
  auto& list = *(*example.mutable_features()->mutable_feature())[std::string(key)].mutable_int64_list()->mutable_value();
  list.Add(values.begin(), values.end());
  return example.SerializeAsString();
}

tf::Example parse_example(std::string_view record, const RecordSource& source) {
  tf::Example example;
  check(record.size() <= static_cast<size_t>(std::numeric_limits<int>::max()),
        "{}: a record of {} bytes is over protobuf's 2 GiB limit for a message", source.describe(), record.size());
  if (!example.ParseFromArray(record.data(), static_cast<int>(record.size()))) {
    fail("{}: not a tf.train.Example ({} bytes that do not parse as one)", source.describe(), record.size());
  }
  return example;
}

namespace {

std::string_view kind_name(tf::Feature::KindCase kind) {
  switch (kind) {
    case tf::Feature::kBytesList: return "bytes_list";
    case tf::Feature::kFloatList: return "float_list";
    case tf::Feature::kInt64List: return "int64_list";
    default: return "empty (no kind set)";
  }
}

// The feature `key` of kind `want`; a feature with no kind set reads as an empty list, as
// TensorFlow's parsers read it.
const tf::Feature& feature(const tf::Example& example, std::string_view key, tf::Feature::KindCase want,
                           const RecordSource& source) {
  const auto& map = example.features().feature();
  auto it = map.find(std::string(key));
  if (it == map.end()) {
    std::vector<std::string> keys;
    for (const auto& [name, value] : map) keys.push_back(name);
    std::sort(keys.begin(), keys.end());
    fail("{}: tf.train.Example has no feature '{}' (it has: {})", source.describe(), key,
         keys.empty() ? std::string("none") : fmt::format("{}", fmt::join(keys, ", ")));
  }
  auto kind = it->second.kind_case();
  if (kind != want && kind != tf::Feature::KIND_NOT_SET) {
    fail("{}: feature '{}' is a {}, expected a {}", source.describe(), key, kind_name(kind), kind_name(want));
  }
  return it->second;
}

}  // namespace

std::span<const int64_t> int64_feature(const tf::Example& example, std::string_view key, const RecordSource& source) {
  const auto& values = feature(example, key, tf::Feature::kInt64List, source).int64_list().value();
  return {values.data(), static_cast<size_t>(values.size())};
}

std::span<const float> float_feature(const tf::Example& example, std::string_view key, const RecordSource& source) {
  const auto& values = feature(example, key, tf::Feature::kFloatList, source).float_list().value();
  return {values.data(), static_cast<size_t>(values.size())};
}

const google::protobuf::RepeatedPtrField<std::string>& bytes_feature(const tf::Example& example, std::string_view key,
                                                                     const RecordSource& source) {
  return feature(example, key, tf::Feature::kBytesList, source).bytes_list().value();
}

// --- wire-format fast path ----------------------------------------------------------------

namespace {

enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLen = 2, kFixed32 = 5 };

struct Wire {
  const uint8_t* p;
  const uint8_t* end;

  bool done() const { return p == end; }
  bool varint(uint64_t& value) {
    value = 0;
    for (int shift = 0; shift < 64 && p < end; shift += 7) {
      uint8_t byte = *p++;
      value |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if (!(byte & 0x80)) return true;
    }
    return false;
  }
  bool tag(uint32_t& field, uint32_t& type) {
    uint64_t key;
    if (!varint(key) || (key >> 3) == 0 || (key >> 3) > UINT32_MAX) return false;
    field = static_cast<uint32_t>(key >> 3);
    type = static_cast<uint32_t>(key & 7);
    return true;
  }
  bool bytes(std::string_view& out) {
    uint64_t size;
    if (!varint(size) || size > static_cast<uint64_t>(end - p)) return false;
    out = {reinterpret_cast<const char*>(p), static_cast<size_t>(size)};
    p += size;
    return true;
  }
  bool skip(uint32_t type) {
    uint64_t ignored;
    std::string_view ignored_bytes;
    switch (type) {
      case kVarint: return varint(ignored);
      case kFixed64: return end - p >= 8 ? (p += 8, true) : false;
      case kLen: return bytes(ignored_bytes);
      case kFixed32: return end - p >= 4 ? (p += 4, true) : false;
      default: return false;  // groups are not in these messages
    }
  }
};

Wire wire(std::string_view bytes) {
  auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
  return {p, p + bytes.size()};
}

// Appends the values of a serialized Int64List (packed or not).
bool decode_int64_list(std::string_view bytes, std::vector<int64_t>& out) {
  Wire w = wire(bytes);
  uint32_t field, type;
  while (!w.done()) {
    if (!w.tag(field, type)) return false;
    uint64_t value;
    if (field == 1 && type == kLen) {
      std::string_view packed;
      if (!w.bytes(packed)) return false;
      Wire values = wire(packed);
      while (!values.done()) {
        if (!values.varint(value)) return false;
        out.push_back(static_cast<int64_t>(value));
      }
    } else if (field == 1 && type == kVarint) {
      if (!w.varint(value)) return false;
      out.push_back(static_cast<int64_t>(value));
    } else if (!w.skip(type)) {
      return false;
    }
  }
  return true;
}

// Outcome of the fast path; anything but `ok` is handed to the protobuf path for its message.
enum class Decoded { ok, missing, other_kind, malformed };

Decoded decode(std::string_view record, std::string_view key, std::vector<int64_t>& out) {
  // Feature values of the last map entry whose key matches (map semantics: a later entry
  // replaces an earlier one; repeated `value` fields inside one entry merge, i.e. concatenate).
  std::vector<std::string_view> match;
  bool found = false;
  std::vector<std::string_view> values;
  Wire example = wire(record);
  uint32_t field, type;
  while (!example.done()) {
    if (!example.tag(field, type)) return Decoded::malformed;
    if (field != 1 || type != kLen) {
      if (!example.skip(type)) return Decoded::malformed;
      continue;
    }
    std::string_view features_bytes;
    if (!example.bytes(features_bytes)) return Decoded::malformed;
    Wire features = wire(features_bytes);
    while (!features.done()) {
      if (!features.tag(field, type)) return Decoded::malformed;
      if (field != 1 || type != kLen) {
        if (!features.skip(type)) return Decoded::malformed;
        continue;
      }
      std::string_view entry_bytes, entry_key;
      if (!features.bytes(entry_bytes)) return Decoded::malformed;
      Wire entry = wire(entry_bytes);
      values.clear();
      while (!entry.done()) {
        if (!entry.tag(field, type)) return Decoded::malformed;
        std::string_view part;
        if (field == 1 && type == kLen) {
          if (!entry.bytes(entry_key)) return Decoded::malformed;
        } else if (field == 2 && type == kLen) {
          if (!entry.bytes(part)) return Decoded::malformed;
          values.push_back(part);
        } else if (!entry.skip(type)) {
          return Decoded::malformed;
        }
      }
      if (entry_key == key) {
        found = true;
        match = values;
      }
    }
  }
  if (!found) return Decoded::missing;

  out.clear();
  bool other_kind = false;  // the oneof's last field is bytes_list or float_list
  for (std::string_view part : match) {
    Wire feature = wire(part);
    while (!feature.done()) {
      if (!feature.tag(field, type)) return Decoded::malformed;
      std::string_view list;
      if ((field == 1 || field == 2 || field == 3) && type == kLen) {
        if (!feature.bytes(list)) return Decoded::malformed;
        if (field == 3) {
          if (other_kind) out.clear();  // a oneof switch clears the old field
          if (!decode_int64_list(list, out)) return Decoded::malformed;
          other_kind = false;
        } else {
          other_kind = true;
        }
      } else if (!feature.skip(type)) {
        return Decoded::malformed;
      }
    }
  }
  return other_kind ? Decoded::other_kind : Decoded::ok;
}

}  // namespace

void decode_int64_feature(std::string_view record, std::string_view key, std::vector<int64_t>& out,
                          const RecordSource& source) {
  if (decode(record, key, out) == Decoded::ok) return;
  // Rare: let protobuf parse it, so errors read the same on both paths (and it is the arbiter).
  tf::Example example = parse_example(record, source);
  auto values = int64_feature(example, key, source);
  out.assign(values.begin(), values.end());
}

}  // namespace paraflow::data
