// Tensors on the wire: float32 little-endian bytes (the hosts' own order: x86 and ARM), and a
// shard's pieces gathered from and scattered into the whole model's flat buffer.
#pragma once

#include <string>
#include <vector>

#include "ps/placement.h"

namespace paraflow::ps {

std::string to_bytes(const float* values, int64_t count);
// Throws naming `what` unless `bytes` holds exactly `count` floats.
void from_bytes(const std::string& bytes, float* values, int64_t count, const std::string& what);

// The most bytes of a shard one message (Fill, Pull, Push, Snapshot) carries: what a call costs
// each side in buffers is a few chunks, whatever the shard's size (a whole shard's message cost a
// ps task about four copies of it per worker: the strings and gRPC's buffers of a pull and of a
// push; and a shard of over 2 GiB could not move at all: gRPC's messages stop there).
constexpr int64_t kChunkBytes = int64_t{1} << 20;
// gRPC's limit on every message of a job, each way: a chunk, and as much again for the fields
// beside it and Load's list of pieces.
constexpr int64_t kMaxMessageBytes = 2 * kChunkBytes;

// kMaxMessageBytes, or the environment's PARAFLOW_PS_MAX_MESSAGE_BYTES: only tests set it, so
// that a small model's pieces and shards span many messages as a large model's do.
int64_t max_message_bytes();
// The elements of a chunk under a message limit of `max_message_bytes`: half of it.
inline int64_t chunk_elements(int64_t max_message_bytes) {
  return max_message_bytes / 2 / static_cast<int64_t>(sizeof(float));
}

// Elements [first, first + count) of a shard (its pieces concatenated), gathered from the whole
// model's flat buffer; and scattered back into it from `bytes` (which must hold whole floats
// within the shard: otherwise throws naming `what`).
std::string gather_range(const float* whole, const std::vector<Piece>& pieces, int64_t first, int64_t count);
void scatter_range(const std::string& bytes, const std::vector<Piece>& pieces, int64_t first, float* whole,
                   const std::string& what);

}  // namespace paraflow::ps
