#include "infer/kv_blocks.h"

#include <algorithm>
#include <random>

#include "base/error.h"

namespace paraflow::infer {

namespace {

inline uint64_t rotate_left(uint64_t x, int bits) { return (x << bits) | (x >> (64 - bits)); }

std::array<uint64_t, 2> random_key() {
  std::random_device device;
  auto word = [&] { return (static_cast<uint64_t>(device()) << 32) | device(); };
  return {word(), word()};
}

}  // namespace

uint64_t siphash24(const std::array<uint64_t, 2>& key, const uint8_t* bytes, size_t count) {
  uint64_t v0 = key[0] ^ 0x736f6d6570736575ull, v1 = key[1] ^ 0x646f72616e646f6dull;
  uint64_t v2 = key[0] ^ 0x6c7967656e657261ull, v3 = key[1] ^ 0x7465646279746573ull;
  auto round = [&] {
    v0 += v1, v1 = rotate_left(v1, 13), v1 ^= v0, v0 = rotate_left(v0, 32);
    v2 += v3, v3 = rotate_left(v3, 16), v3 ^= v2;
    v0 += v3, v3 = rotate_left(v3, 21), v3 ^= v0;
    v2 += v1, v1 = rotate_left(v1, 17), v1 ^= v2, v2 = rotate_left(v2, 32);
  };
  auto absorb = [&](uint64_t word) {
    v3 ^= word;
    round(), round();
    v0 ^= word;
  };
  size_t at = 0;
  for (; at + 8 <= count; at += 8) {
    uint64_t word = 0;
    for (int byte = 0; byte < 8; ++byte) word |= static_cast<uint64_t>(bytes[at + byte]) << (8 * byte);
    absorb(word);
  }
  uint64_t last = static_cast<uint64_t>(count & 0xff) << 56;
  for (size_t byte = 0; at + byte < count; ++byte) last |= static_cast<uint64_t>(bytes[at + byte]) << (8 * byte);
  absorb(last);
  v2 ^= 0xff;
  round(), round(), round(), round();
  return v0 ^ v1 ^ v2 ^ v3;
}

KvBlockPool::KvBlockPool(int64_t blocks, int64_t block_size)
    : block_size_(block_size),
      hash_key_(random_key()),
      ref_counts_(static_cast<size_t>(blocks), 0),
      free_at_(static_cast<size_t>(blocks)),
      hash_of_(static_cast<size_t>(blocks)) {
  check(blocks >= 1 && block_size >= 1, "a KV pool needs at least one block of at least one token (got {} of {})",
        blocks, block_size);
  for (int32_t block = 0; block < blocks; ++block) free_at_[static_cast<size_t>(block)] = free_.insert(free_.end(), block);
}

void KvBlockPool::take_from_free_list(int32_t block) {
  free_.erase(free_at_[static_cast<size_t>(block)]);
  ref_counts_[static_cast<size_t>(block)] = 1;
}

void KvBlockPool::forget(int32_t block) {
  std::optional<uint64_t>& hash = hash_of_[static_cast<size_t>(block)];
  if (hash) cache_.erase(*hash);
  hash.reset();
}

std::optional<int32_t> KvBlockPool::allocate() {
  if (free_.empty()) return std::nullopt;
  const int32_t block = free_.front();
  take_from_free_list(block);
  forget(block);
  return block;
}

void KvBlockPool::retain(int32_t block) {
  int& count = ref_counts_.at(static_cast<size_t>(block));
  if (count == 0) {
    take_from_free_list(block);
  } else {
    ++count;
  }
}

void KvBlockPool::release(int32_t block) {
  int& count = ref_counts_.at(static_cast<size_t>(block));
  if (count <= 0) throw Error(fmt::format("KV block {} released more often than it was held", block));
  if (--count == 0) free_at_[static_cast<size_t>(block)] = free_.insert(free_.end(), block);
}

uint64_t KvBlockPool::chain_hash(uint64_t previous, const int32_t* tokens, int64_t count) const {
  // The previous hash, then the token ids, each little-endian.
  std::vector<uint8_t> bytes(8 + 4 * static_cast<size_t>(count));
  for (int byte = 0; byte < 8; ++byte) bytes[static_cast<size_t>(byte)] = static_cast<uint8_t>(previous >> (8 * byte));
  for (int64_t i = 0; i < count; ++i) {
    const auto id = static_cast<uint32_t>(tokens[i]);
    for (int byte = 0; byte < 4; ++byte) bytes[static_cast<size_t>(8 + 4 * i + byte)] = static_cast<uint8_t>(id >> (8 * byte));
  }
  return siphash24(hash_key_, bytes.data(), bytes.size());
}

std::optional<int32_t> KvBlockPool::lookup(uint64_t hash, const int32_t* tokens) {
  auto found = cache_.find(hash);
  if (found == cache_.end() || !std::equal(found->second.tokens.begin(), found->second.tokens.end(), tokens)) {
    return std::nullopt;
  }
  retain(found->second.block);
  return found->second.block;
}

void KvBlockPool::publish(int32_t block, uint64_t hash, const int32_t* tokens) {
  if (hash_of_[static_cast<size_t>(block)] || cache_.count(hash)) return;  // already known (a shared block)
  cache_[hash] = CacheEntry{block, std::vector<int32_t>(tokens, tokens + block_size_)};
  hash_of_[static_cast<size_t>(block)] = hash;
}

}  // namespace paraflow::infer
