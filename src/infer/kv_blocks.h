// The paged KV cache's bookkeeping (the serving decoder's pools hold the keys and values): a
// pool of fixed-size blocks with reference counts, and a prefix cache mapping the contents of a
// full block — its tokens and, through a chained hash, every token before them — to the block
// holding their keys and values, so requests that share a prompt prefix share its blocks.
// Unreferenced blocks stay cached until reused, least recently released first.
#pragma once

#include <array>
#include <cstdint>
#include <list>
#include <optional>
#include <unordered_map>
#include <vector>

namespace paraflow::infer {

// SipHash-2-4 (Aumasson and Bernstein) of `bytes` under a 128-bit key.
uint64_t siphash24(const std::array<uint64_t, 2>& key, const uint8_t* bytes, size_t count);

class KvBlockPool {
 public:
  KvBlockPool(int64_t blocks, int64_t block_size);

  int64_t total() const { return static_cast<int64_t>(ref_counts_.size()); }
  int64_t block_size() const { return block_size_; }
  // Blocks no sequence holds (cached ones included: they are reclaimed on demand).
  int64_t free_blocks() const { return static_cast<int64_t>(free_.size()); }
  int64_t cached_blocks() const { return static_cast<int64_t>(cache_.size()); }
  int ref_count(int32_t block) const { return ref_counts_.at(static_cast<size_t>(block)); }
  // Whether lookup() may hand the block out (it holds a published full block's contents).
  bool cached(int32_t block) const { return hash_of_.at(static_cast<size_t>(block)).has_value(); }

  // A block for new contents (reference count 1), evicting the least recently released cached
  // block if it must; nullopt when every block is held.
  std::optional<int32_t> allocate();
  void retain(int32_t block);
  // Drops one reference; at zero the block becomes free, its cache entry kept until reuse.
  void release(int32_t block);

  // The chained hash of a full block: `previous` is the hash of the block before it (0 first).
  // SipHash-2-4 under a key drawn per pool: a lookup compares a block's own tokens but trusts
  // the hash for every token before them, so the hash must not be open to forged collisions
  // (a crafted prompt whose cached blocks another request would then read).
  uint64_t chain_hash(uint64_t previous, const int32_t* tokens, int64_t count) const;
  // A block whose contents are `tokens` after the prefix hashed into `previous`, retained for the
  // caller; nullopt on a miss.
  std::optional<int32_t> lookup(uint64_t hash, const int32_t* tokens);
  // Records that `block` (held by the caller) now holds `tokens`, hashed to `hash`.
  void publish(int32_t block, uint64_t hash, const int32_t* tokens);

 private:
  struct CacheEntry {
    int32_t block;
    std::vector<int32_t> tokens;  // checked on lookup: a hash collision must not share a block
  };
  void take_from_free_list(int32_t block);
  void forget(int32_t block);

  int64_t block_size_;
  std::array<uint64_t, 2> hash_key_;
  std::vector<int> ref_counts_;
  std::list<int32_t> free_;                            // least recently released first
  std::vector<std::list<int32_t>::iterator> free_at_;  // per block, valid while it is free
  std::vector<std::optional<uint64_t>> hash_of_;       // per block, when cached
  std::unordered_map<uint64_t, CacheEntry> cache_;
};

}  // namespace paraflow::infer
