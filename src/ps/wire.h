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

std::string gather_pieces(const float* whole, const std::vector<Piece>& pieces);
void scatter_pieces(const std::string& bytes, const std::vector<Piece>& pieces, float* whole, const std::string& what);

}  // namespace paraflow::ps
