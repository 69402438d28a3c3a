#include "infer/kv_blocks.h"

#include <algorithm>

#include "base/error.h"

namespace paraflow::infer {

KvBlockPool::KvBlockPool(int64_t blocks, int64_t block_size)
    : block_size_(block_size),
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

uint64_t KvBlockPool::chain_hash(uint64_t previous, const int32_t* tokens, int64_t count) {
  // FNV-1a over the previous hash and the token ids.
  uint64_t hash = 0xcbf29ce484222325ull;
  auto mix = [&](uint64_t word) {
    for (int byte = 0; byte < 8; ++byte) {
      hash ^= (word >> (8 * byte)) & 0xff;
      hash *= 0x100000001b3ull;
    }
  };
  mix(previous);
  for (int64_t i = 0; i < count; ++i) mix(static_cast<uint32_t>(tokens[i]));
  return hash;
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
