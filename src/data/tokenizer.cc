#include "data/tokenizer.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <fmt/format.h>
#include <queue>
#include <thread>
#include <unordered_map>

#include "base/error.h"
#include "data/tokenizer_pretokenize.h"

namespace paraflow::data {
namespace {

constexpr uint64_t kEmptyKey = ~uint64_t{0};

inline uint64_t pair_key(TokenId left, TokenId right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

inline uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  return x;
}

// Hash of a pre-token's bytes (short strings: 8 bytes at a time).
inline uint64_t hash_bytes(const unsigned char* p, size_t n) {
  uint64_t h = 0x9E3779B97F4A7C15ULL ^ (n * 0xC2B2AE3D27D4EB4FULL);
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    h = (h ^ mix(w)) * 0x9E3779B97F4A7C15ULL;
    p += 8;
    n -= 8;
  }
  if (n) {
    uint64_t w = 0;
    std::memcpy(&w, p, n);
    h = (h ^ mix(w)) * 0x9E3779B97F4A7C15ULL;
  }
  return mix(h);
}

std::atomic<uint64_t> next_uid{1};

int resolve_threads(int threads) {
  if (threads > 0) return threads;
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

}  // namespace

// (left, right) -> (rank, merged id), open addressing with linear probing.
struct Tokenizer::PairTable {
  struct Slot {
    uint64_t key = kEmptyKey;
    uint32_t rank = 0;
    TokenId id = 0;
  };
  std::vector<Slot> slots;
  uint64_t mask = 0;

  explicit PairTable(size_t entries) {
    size_t capacity = 16;
    while (capacity < entries * 2 + 2) capacity *= 2;
    slots.resize(capacity);
    mask = capacity - 1;
  }
  // Returns false when the pair is already present.
  bool insert(uint64_t key, uint32_t rank, TokenId id) {
    for (uint64_t i = mix(key) & mask;; i = (i + 1) & mask) {
      if (slots[i].key == key) return false;
      if (slots[i].key == kEmptyKey) {
        slots[i] = {key, rank, id};
        return true;
      }
    }
  }
  inline const Slot* find(uint64_t key) const {
    for (uint64_t i = mix(key) & mask;; i = (i + 1) & mask) {
      const Slot& s = slots[i];
      if (s.key == key) return &s;
      if (s.key == kEmptyKey) return nullptr;
    }
  }
};

// Pre-token bytes -> token ids, per thread. Open addressing over arenas; cleared when full.
struct Tokenizer::Cache {
  struct Slot {
    uint64_t hash = 0;
    uint32_t key_offset = 0, key_size = 0;  // in keys; key_size 0 marks an empty slot
    uint32_t value_offset = 0, value_size = 0;
  };
  static constexpr size_t kCapacity = 1 << 16;  // slots; filled to half at most
  static constexpr size_t kMaxPiece = 64;       // longer pre-tokens are not cached
  std::vector<Slot> slots = std::vector<Slot>(kCapacity);
  std::string keys;
  std::vector<TokenId> values;
  size_t used = 0;
  uint64_t owner = 0;

  void clear() {
    std::fill(slots.begin(), slots.end(), Slot{});
    keys.clear();
    values.clear();
    used = 0;
  }
};

Tokenizer::Tokenizer(std::vector<std::string> tokens, std::vector<std::pair<TokenId, TokenId>> merges,
                     std::vector<TokenId> special_ids)
    : merges_(std::move(merges)), special_ids_(std::move(special_ids)), uid_(next_uid++) {
  check(!tokens.empty() && tokens.size() < (1u << 31), "tokenizer: vocabulary size {} out of range", tokens.size());
  offsets_.reserve(tokens.size() + 1);
  offsets_.push_back(0);
  for (const std::string& token : tokens) {
    arena_ += token;
    check(arena_.size() < (uint64_t{1} << 32), "tokenizer: vocabulary bytes exceed 4 GiB");
    offsets_.push_back(static_cast<uint32_t>(arena_.size()));
  }
  std::fill(std::begin(byte_token_), std::end(byte_token_), -1);
  std::vector<bool> special(tokens.size(), false);
  for (TokenId id : special_ids_) {
    check(id >= 0 && id < vocab_size(), "tokenizer: special token id {} out of range [0, {})", id, vocab_size());
    check(!tokens[id].empty(), "tokenizer: special token {} is empty", id);
    special[id] = true;
  }
  for (TokenId id = 0; id < vocab_size(); ++id) {
    if (tokens[id].size() == 1 && !special[id] && byte_token_[static_cast<unsigned char>(tokens[id][0])] < 0) {
      byte_token_[static_cast<unsigned char>(tokens[id][0])] = id;
    }
  }
  for (int b = 0; b < 256; ++b) check(byte_token_[b] >= 0, "tokenizer: the vocabulary has no token for byte 0x{:02X}", b);

  pairs_ = std::make_unique<PairTable>(merges_.size());
  // Each merge's result: the non-special token whose bytes are left + right.
  {
    std::unordered_map<std::string_view, TokenId> index;
    index.reserve(tokens.size() * 2);
    for (TokenId id = 0; id < vocab_size(); ++id) {
      if (!special[id]) index.emplace(token_bytes(id), id);
    }
    std::string merged;
    for (size_t rank = 0; rank < merges_.size(); ++rank) {
      auto [left, right] = merges_[rank];
      check(left >= 0 && left < vocab_size() && right >= 0 && right < vocab_size(),
            "tokenizer: merge {} refers to token ids ({}, {}) outside [0, {})", rank, left, right, vocab_size());
      merged.assign(token_bytes(left));
      merged += token_bytes(right);
      auto it = index.find(merged);
      check(it != index.end(), "tokenizer: merge {} ({} + {}) makes bytes that are not in the vocabulary", rank, left, right);
      check(pairs_->insert(pair_key(left, right), static_cast<uint32_t>(rank), it->second),
            "tokenizer: merge {} ({} + {}) repeats an earlier merge", rank, left, right);
    }
  }
}

Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

std::string_view Tokenizer::token_bytes(TokenId id) const {
  check(id >= 0 && id < vocab_size(), "tokenizer: token id {} out of range [0, {})", id, vocab_size());
  return std::string_view(arena_).substr(offsets_[id], offsets_[id + 1] - offsets_[id]);
}

bool Tokenizer::is_special(TokenId id) const {
  return std::find(special_ids_.begin(), special_ids_.end(), id) != special_ids_.end();
}

TokenId Tokenizer::special_id(std::string_view text) const {
  for (TokenId id : special_ids_) {
    if (token_bytes(id) == text) return id;
  }
  return -1;
}

std::string Tokenizer::fingerprint() const {
  uint64_t h = 0xcbf29ce484222325ULL;
  auto feed = [&](const void* data, size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ULL;
  };
  feed(offsets_.data(), offsets_.size() * sizeof(uint32_t));
  feed(arena_.data(), arena_.size());
  feed(merges_.data(), merges_.size() * sizeof(merges_[0]));
  feed(special_ids_.data(), special_ids_.size() * sizeof(TokenId));
  return fmt::format("{:016x}", h);
}

// ---------------------------------------------------------------------------------------------
// BPE of one pre-token

std::vector<TokenId> Tokenizer::encode_piece_reference(std::string_view piece) const {
  std::vector<TokenId> parts;
  for (char c : piece) parts.push_back(byte_token_[static_cast<unsigned char>(c)]);
  while (parts.size() > 1) {
    size_t best = 0;
    const PairTable::Slot* best_slot = nullptr;
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      const PairTable::Slot* s = pairs_->find(pair_key(parts[i], parts[i + 1]));
      if (s && (!best_slot || s->rank < best_slot->rank)) {
        best_slot = s;
        best = i;
      }
    }
    if (!best_slot) break;
    parts[best] = best_slot->id;
    parts.erase(parts.begin() + static_cast<ptrdiff_t>(best) + 1);
  }
  return parts;
}

std::vector<TokenId> Tokenizer::encode_piece(std::string_view piece) const {
  std::vector<TokenId> out;
  bpe(reinterpret_cast<const unsigned char*>(piece.data()), piece.size(), out);
  return out;
}

// Short pieces: tiktoken's scheme, an array of parts with the rank of each part and its right
// neighbour; each merge recomputes two ranks and shifts the tail.
void Tokenizer::bpe(const unsigned char* bytes, size_t size, std::vector<TokenId>& out) const {
  constexpr size_t kShort = 128;
  if (size == 1) {
    out.push_back(byte_token_[bytes[0]]);
    return;
  }
  if (size > kShort) {
    bpe_long(bytes, size, out);
    return;
  }
  constexpr uint32_t kNone = ~uint32_t{0};
  TokenId parts[kShort];
  uint32_t ranks[kShort];  // ranks[i]: rank of (parts[i], parts[i+1]), kNone if no merge
  TokenId merged[kShort];
  size_t n = size;
  for (size_t i = 0; i < n; ++i) parts[i] = byte_token_[bytes[i]];
  auto lookup = [&](size_t i) {
    const PairTable::Slot* s = pairs_->find(pair_key(parts[i], parts[i + 1]));
    if (s) {
      ranks[i] = s->rank;
      merged[i] = s->id;
    } else {
      ranks[i] = kNone;
    }
  };
  for (size_t i = 0; i + 1 < n; ++i) lookup(i);
  while (n > 1) {
    uint32_t best_rank = kNone;
    size_t best = 0;
    for (size_t i = 0; i + 1 < n; ++i) {
      if (ranks[i] < best_rank) {
        best_rank = ranks[i];
        best = i;
      }
    }
    if (best_rank == kNone) break;
    parts[best] = merged[best];
    for (size_t i = best + 1; i + 1 < n; ++i) {
      parts[i] = parts[i + 1];
      ranks[i] = ranks[i + 1];
      merged[i] = merged[i + 1];
    }
    --n;
    if (best + 1 < n) lookup(best);
    else ranks[best] = kNone;
    if (best > 0) lookup(best - 1);
  }
  out.insert(out.end(), parts, parts + n);
}

// Long pieces (runs of digits, spaces, symbols): a heap of candidate merges over a linked list,
// O(n log n). Ordered by (rank, start offset), which is the order the short path merges in.
void Tokenizer::bpe_long(const unsigned char* bytes, size_t size, std::vector<TokenId>& out) const {
  struct Node {
    TokenId id;
    int32_t prev, next;  // -1 at the ends
    uint32_t version;    // bumped when the node changes, to drop stale heap entries
  };
  struct Candidate {
    uint32_t rank;
    int32_t left;  // node index, which is also the byte offset where the pair starts
    uint32_t left_version, right_version;
    TokenId merged;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
  };
  std::vector<Node> nodes(size);
  for (size_t i = 0; i < size; ++i) {
    nodes[i] = {byte_token_[bytes[i]], static_cast<int32_t>(i) - 1, i + 1 < size ? static_cast<int32_t>(i + 1) : -1, 0};
  }
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto push = [&](int32_t left) {
    if (left < 0) return;
    int32_t right = nodes[left].next;
    if (right < 0) return;
    if (const PairTable::Slot* s = pairs_->find(pair_key(nodes[left].id, nodes[right].id))) {
      heap.push({s->rank, left, nodes[left].version, nodes[right].version, s->id});
    }
  };
  for (size_t i = 0; i + 1 < size; ++i) push(static_cast<int32_t>(i));
  while (!heap.empty()) {
    Candidate c = heap.top();
    heap.pop();
    Node& left = nodes[c.left];
    if (left.version != c.left_version || left.id < 0 || left.next < 0) continue;
    Node& right = nodes[left.next];
    if (right.version != c.right_version) continue;
    left.id = c.merged;
    ++left.version;
    right.id = -1;  // removed
    ++right.version;
    left.next = right.next;
    if (right.next >= 0) nodes[right.next].prev = c.left;
    push(left.prev);
    push(c.left);
  }
  for (int32_t i = 0; i >= 0; i = nodes[i].next) out.push_back(nodes[i].id);
}

// ---------------------------------------------------------------------------------------------
// Encoding

Tokenizer::Cache& Tokenizer::thread_cache() const {
  thread_local Cache cache;
  if (cache.owner != uid_) {
    cache.clear();
    cache.owner = uid_;
  }
  return cache;
}

void Tokenizer::encode_ordinary(std::string_view text, std::vector<TokenId>& out, Cache& cache) const {
  const auto* base = reinterpret_cast<const unsigned char*>(text.data());
  size_t pos = 0;
  const uint64_t cache_mask = Cache::kCapacity - 1;
  while (pos < text.size()) {
    size_t end = gpt2_piece_end(text, pos);
    const unsigned char* piece = base + pos;
    size_t size = end - pos;
    pos = end;
    if (size == 1) {
      out.push_back(byte_token_[piece[0]]);
      continue;
    }
    if (size > Cache::kMaxPiece) {
      bpe(piece, size, out);
      continue;
    }
    uint64_t h = hash_bytes(piece, size);
    uint64_t i = h & cache_mask;
    for (;; i = (i + 1) & cache_mask) {
      const Cache::Slot& s = cache.slots[i];
      if (s.key_size == 0) break;
      if (s.hash == h && s.key_size == size && std::memcmp(cache.keys.data() + s.key_offset, piece, size) == 0) break;
    }
    Cache::Slot& slot = cache.slots[i];
    if (slot.key_size != 0) {
      const TokenId* v = cache.values.data() + slot.value_offset;
      out.insert(out.end(), v, v + slot.value_size);
      continue;
    }
    size_t before = out.size();
    bpe(piece, size, out);
    if (cache.used * 2 >= Cache::kCapacity) {
      cache.clear();
      continue;  // the slot found above is stale now; cache again on the next occurrence
    }
    slot = {h, static_cast<uint32_t>(cache.keys.size()), static_cast<uint32_t>(size),
            static_cast<uint32_t>(cache.values.size()), static_cast<uint32_t>(out.size() - before)};
    cache.keys.append(reinterpret_cast<const char*>(piece), size);
    cache.values.insert(cache.values.end(), out.begin() + static_cast<ptrdiff_t>(before), out.end());
    ++cache.used;
  }
}

void Tokenizer::encode_append(std::string_view text, std::vector<TokenId>& out, bool allow_special) const {
  Cache& cache = thread_cache();
  if (!allow_special || special_ids_.empty()) {
    encode_ordinary(text, out, cache);
    return;
  }
  // Each special's next occurrence, searched for again only once the text has passed it: a
  // special that never occurs costs one scan, not one per occurrence of another (quadratic).
  std::vector<size_t> next(special_ids_.size());
  for (size_t k = 0; k < special_ids_.size(); ++k) next[k] = text.find(token_bytes(special_ids_[k]));
  size_t pos = 0;
  while (pos < text.size()) {
    // The earliest special token; the longest one where several start at the same offset.
    size_t found = std::string_view::npos, found_size = 0;
    TokenId found_id = -1;
    for (size_t k = 0; k < special_ids_.size(); ++k) {
      const TokenId id = special_ids_[k];
      std::string_view s = token_bytes(id);
      if (next[k] != std::string_view::npos && next[k] < pos) next[k] = text.find(s, pos);
      const size_t at = next[k];
      if (at < found || (at == found && at != std::string_view::npos && s.size() > found_size)) {
        found = at;
        found_size = s.size();
        found_id = id;
      }
    }
    if (found == std::string_view::npos) {
      encode_ordinary(text.substr(pos), out, cache);
      return;
    }
    encode_ordinary(text.substr(pos, found - pos), out, cache);
    out.push_back(found_id);
    pos = found + found_size;
  }
}

std::vector<TokenId> Tokenizer::encode(std::string_view text, bool allow_special) const {
  std::vector<TokenId> out;
  out.reserve(text.size() / 4 + 16);
  encode_append(text, out, allow_special);
  return out;
}

std::vector<std::vector<TokenId>> Tokenizer::encode_batch(std::span<const std::string_view> texts, int threads,
                                                          bool allow_special) const {
  std::vector<std::vector<TokenId>> results(texts.size());
  int n = std::min<int>(resolve_threads(threads), static_cast<int>(std::max<size_t>(texts.size(), 1)));
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; (i = next++) < texts.size();) results[i] = encode(texts[i], allow_special);
  };
  std::vector<std::jthread> pool;
  for (int t = 1; t < n; ++t) pool.emplace_back(work);
  work();
  return results;
}

std::vector<TokenId> Tokenizer::encode_parallel(std::string_view text, int threads, bool allow_special) const {
  int n = resolve_threads(threads);
  constexpr size_t kMinChunk = 256 * 1024;
  if (n == 1 || text.size() < 2 * kMinChunk) return encode(text, allow_special);
  // Chunks of about size / (4n) bytes, each ending at a safe split point (none found: one chunk).
  size_t target = std::max(kMinChunk, text.size() / (4 * static_cast<size_t>(n)));
  // A special token with whitespace in it could straddle a split point: never cut inside one.
  auto inside_special = [&](size_t cut) {
    for (TokenId id : special_ids_) {
      std::string_view s = token_bytes(id);
      size_t from = cut >= s.size() ? cut - s.size() + 1 : 0;
      size_t at = text.find(s, from);
      if (at != std::string_view::npos && at < cut) return true;
    }
    return false;
  };
  std::vector<std::string_view> chunks;
  size_t start = 0;
  while (start < text.size()) {
    size_t cut = start + target;
    while (cut < text.size() && (!is_safe_split_point(text, cut) || (allow_special && inside_special(cut)))) ++cut;
    if (cut >= text.size()) cut = text.size();
    chunks.push_back(text.substr(start, cut - start));
    start = cut;
  }
  std::vector<std::vector<TokenId>> parts = encode_batch(chunks, n, allow_special);
  size_t total = 0;
  for (const auto& p : parts) total += p.size();
  std::vector<TokenId> out;
  out.reserve(total);
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

// ---------------------------------------------------------------------------------------------
// Decoding

void Tokenizer::decode_append(std::span<const TokenId> ids, std::string& out) const {
  size_t total = out.size();
  for (TokenId id : ids) {
    check(id >= 0 && id < vocab_size(), "tokenizer: cannot decode token id {}: outside [0, {})", id, vocab_size());
    total += offsets_[id + 1] - offsets_[id];
  }
  out.reserve(total);
  for (TokenId id : ids) out.append(arena_, offsets_[id], offsets_[id + 1] - offsets_[id]);
}

std::string Tokenizer::decode(std::span<const TokenId> ids) const {
  std::string out;
  decode_append(ids, out);
  return out;
}

}  // namespace paraflow::data
