#include "data/pipeline_state.h"

#include <fmt/format.h>

#include <charconv>
#include <limits>

#include "base/error.h"

namespace paraflow::data {

using nlohmann::json;

namespace {

uint64_t parse_hex64(const json& j) {
  const std::string text = j.get<std::string>();
  uint64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value, 16);
  check(error == std::errc() && end == text.data() + text.size() && !text.empty(),
        "pipeline state: shuffle.rng holds '{}', not a 64-bit hex number", text);
  return value;
}

SeqState state_fields(const json& j, const std::string& fingerprint, int C, int64_t files) {
  check(j.is_object() && j.value("format", "") == "paraflow.pipeline/1", "pipeline state: not a paraflow.pipeline/1 state");
  check(j.at("fingerprint").get<std::string>() == fingerprint,
        "pipeline state: made for other shards or order options (fingerprint {} here, {} in the state)", fingerprint,
        j.at("fingerprint").get<std::string>());
  SeqState s;
  s.next_batch = j.at("next_batch").get<int64_t>();
  s.epoch = j.at("epoch").get<int64_t>();
  const json& il = j.at("interleave");
  s.slots = il.at("slots").get<std::vector<int64_t>>();
  s.slot_offsets = il.at("offsets").get<std::vector<uint64_t>>();
  s.cycle_index = il.at("cycle_index").get<int>();
  s.next_g = il.at("next_file").get<int64_t>();
  check(static_cast<int>(s.slots.size()) == C && s.slot_offsets.size() == s.slots.size() && s.cycle_index >= 0 &&
            s.cycle_index < C,
        "pipeline state: interleave cycle does not match cycle_length {}", C);
  check(s.next_batch >= 0 && s.epoch >= 0 && s.next_g >= 0 && files > 0 && s.epoch <= s.next_g / files,
        "pipeline state: next_batch {}, epoch {} and next_file {} are out of range for {} files", s.next_batch, s.epoch,
        s.next_g, files);
  for (int64_t slot : s.slots) {
    check(slot >= -1 && slot < s.next_g, "pipeline state: interleave slot {} is out of range (next_file {})", slot,
          s.next_g);
  }
  const json& sh = j.at("shuffle");
  s.filling = sh.at("filling").get<bool>();
  for (size_t i = 0; i < 4; ++i) s.rng[i] = parse_hex64(sh.at("rng").at(i));
  auto file_index = [&](const json& value, const char* what) {
    const auto file = value.get<int64_t>();
    check(file >= 0 && file < files, "pipeline state: {} names file {} of {}", what, file, files);
    return static_cast<uint32_t>(file);
  };
  for (const json& r : sh.at("buffer")) s.buffer.push_back(Ref{file_index(r.at(0), "shuffle.buffer"), r.at(1).get<uint64_t>()});
  const json& pk = j.at("packer");
  s.carry = pk.at("carry").get<int64_t>();
  check(s.carry >= -1 && s.carry <= std::numeric_limits<int32_t>::max(), "pipeline state: packer.carry {} is not a token",
        s.carry);
  if (!pk.at("record").is_null()) {
    s.has_record = true;
    s.record = Ref{file_index(pk["record"].at(0), "packer.record"), pk["record"].at(1).get<uint64_t>()};
    s.record_pos = pk["record"].at(2).get<int64_t>();
    check(s.record_pos >= 0, "pipeline state: packer.record position {} is negative", s.record_pos);
  }
  return s;
}

}  // namespace

std::string hex64(uint64_t v) { return fmt::format("{:016x}", v); }

json state_to_json(const SeqState& s, const std::string& fingerprint) {
  json buffer = json::array();
  for (const Ref& r : s.buffer) buffer.push_back(json::array({r.file, r.offset}));
  json rng = json::array();
  for (uint64_t w : s.rng) rng.push_back(hex64(w));
  return json{{"format", "paraflow.pipeline/1"},
              {"fingerprint", fingerprint},
              {"next_batch", s.next_batch},
              {"epoch", s.epoch},
              {"interleave",
               {{"slots", s.slots}, {"offsets", s.slot_offsets}, {"cycle_index", s.cycle_index}, {"next_file", s.next_g}}},
              {"shuffle", {{"filling", s.filling}, {"rng", rng}, {"buffer", buffer}}},
              {"packer",
               {{"carry", s.carry},
                {"record", s.has_record ? json::array({s.record.file, s.record.offset, s.record_pos}) : json(nullptr)}}}};
}

SeqState state_from_json(const json& j, const std::string& fingerprint, int C, int64_t files) {
  try {
    return state_fields(j, fingerprint, C, files);
  } catch (const json::exception& error) {
    fail("pipeline state: malformed ({})", error.what());
  }
}

}  // namespace paraflow::data
