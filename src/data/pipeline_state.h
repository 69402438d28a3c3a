// The input pipeline's resumable state: everything its record order depends on, with records as
// references (file, offset) rather than tokens, and its JSON form in checkpoints
// ("paraflow.pipeline/1"), read back with every field range-checked.
#pragma once

#include <nlohmann/json.hpp>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace paraflow::data {

struct Ref {
  uint32_t file = 0;
  uint64_t offset = 0;
};

// Everything of the sequencer that the order depends on, with records as references.
struct SeqState {
  int64_t next_batch = 0;
  int64_t epoch = 0;
  std::vector<int64_t> slots;          // interleave cycle: file stream index g, or -1
  std::vector<uint64_t> slot_offsets;  // next record offset in each slot's file
  int cycle_index = 0;
  int64_t next_g = 0;  // next file (stream index g = epoch·n + position) to open
  bool filling = true;
  std::array<uint64_t, 4> rng{};
  std::vector<Ref> buffer;
  int64_t carry = -1;  // first token of the next sample (the last of the previous one)
  bool has_record = false;
  Ref record;
  int64_t record_pos = 0;
};

std::string hex64(uint64_t v);

nlohmann::json state_to_json(const SeqState& s, const std::string& fingerprint);

// A state from a checkpoint, for `fingerprint`'s shards and order options, a cycle of `C` slots
// and `files` files: every field read and range-checked, any malformed one an InputError naming
// it rather than an out-of-range index later.
SeqState state_from_json(const nlohmann::json& j, const std::string& fingerprint, int C, int64_t files);

}  // namespace paraflow::data
