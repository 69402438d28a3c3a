#include "data/tokenizer.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <fmt/format.h>
#include <queue>
#include <unordered_map>

#include "base/error.h"

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

namespace {

std::vector<AddedToken> specials_of(const std::vector<TokenId>& ids) {
  std::vector<AddedToken> added;
  for (TokenId id : ids) added.push_back({.id = id});
  return added;
}

}  // namespace

Tokenizer::Tokenizer(std::vector<std::string> tokens, std::vector<std::pair<TokenId, TokenId>> merges,
                     std::vector<TokenId> special_ids)
    : Tokenizer(std::move(tokens), std::move(merges), specials_of(special_ids), TokenizerOptions{}) {}

Tokenizer::Tokenizer(std::vector<std::string> tokens, std::vector<std::pair<TokenId, TokenId>> merges,
                     std::vector<AddedToken> added, TokenizerOptions options)
    : merges_(std::move(merges)), added_(std::move(added)), options_(std::move(options)), uid_(next_uid++) {
  check(!tokens.empty() && tokens.size() < (1u << 31), "tokenizer: vocabulary size {} out of range", tokens.size());
  offsets_.reserve(tokens.size() + 1);
  offsets_.push_back(0);
  for (const std::string& token : tokens) {
    arena_ += token;
    check(arena_.size() < (uint64_t{1} << 32), "tokenizer: vocabulary bytes exceed 4 GiB");
    offsets_.push_back(static_cast<uint32_t>(arena_.size()));
  }
  std::sort(added_.begin(), added_.end(), [](const AddedToken& a, const AddedToken& b) { return a.id < b.id; });
  std::vector<bool> is_added(tokens.size(), false);
  skip_on_decode_.assign(tokens.size(), false);
  for (const AddedToken& a : added_) {
    check(a.id >= 0 && a.id < vocab_size(), "tokenizer: added token id {} out of range [0, {})", a.id, vocab_size());
    check(!tokens[a.id].empty(), "tokenizer: added token {} is empty", a.id);
    check(!is_added[a.id], "tokenizer: token {} is added twice", a.id);
    is_added[a.id] = true;
    skip_on_decode_[a.id] = a.special;
    special_ids_.push_back(a.id);
  }
  for (uint32_t k = 0; k < added_.size(); ++k) {
    const AddedToken& a = added_[k];
    added_by_first_[a.normalized][static_cast<unsigned char>(tokens[a.id][0])].push_back(k);
    any_normalized_added_ = any_normalized_added_ || a.normalized;
  }
  for (auto& kind : added_by_first_) {
    for (auto& list : kind) {
      std::stable_sort(list.begin(), list.end(),
                       [&](uint32_t a, uint32_t b) { return tokens[added_[a].id].size() > tokens[added_[b].id].size(); });
    }
  }
  auto check_id = [&](TokenId id, const char* what) {
    check(id >= -1 && id < vocab_size(), "tokenizer: {} id {} out of range [0, {})", what, id, vocab_size());
  };
  check_id(options_.unk_id, "unk");
  for (TokenId id : options_.template_prefix) check_id(id, "template");
  for (TokenId id : options_.template_suffix) check_id(id, "template");

  // bytes -> id of the ordinary tokens: what merges make, what ignore_merges and SentencePiece's
  // characters look up. SentencePiece's `<0xNN>` tokens are matched by their place in
  // byte_fallback only (their byte would clash with the character's own token).
  std::fill(std::begin(byte_token_), std::end(byte_token_), -1);
  check(options_.byte_fallback.empty() || options_.byte_fallback.size() == 256,
        "tokenizer: byte_fallback must list 256 ids, not {}", options_.byte_fallback.size());
  std::vector<bool> is_fallback(tokens.size(), false);
  for (TokenId id : options_.byte_fallback) {
    check_id(id, "byte fallback");
    if (id >= 0) is_fallback[id] = true;
  }
  index_.reserve(tokens.size() * 2);
  for (TokenId id = 0; id < vocab_size(); ++id) {
    if (is_added[id] || is_fallback[id]) continue;
    auto [it, inserted] = index_.emplace(token_bytes(id), id);
    check(inserted || options_.sentencepiece == false,
          "tokenizer: tokens {} and {} both decode to {:?}; they cannot be told apart", it->second, id,
          std::string(token_bytes(id)));
    if (!inserted) continue;  // GPT-2-style: the first of duplicates, as before
    if (tokens[id].size() == 1) byte_token_[static_cast<unsigned char>(tokens[id][0])] = id;
  }
  if (options_.sentencepiece) {
    for (int b = 0; b < 256; ++b) byte_token_[b] = options_.byte_fallback.empty() ? -1 : options_.byte_fallback[b];
  } else {
    for (int b = 0; b < 256; ++b) {
      check(byte_token_[b] >= 0, "tokenizer: the vocabulary has no token for byte 0x{:02X}", b);
    }
  }

  if (options_.pre_tokenizer == PreTokenizer::kWhole) {
    // A merge joins two parts into a token, so a token that spans a cut holds the byte pair there.
    joinable_.assign(1 << 16, false);
    for (const auto& [bytes, id] : index_) {
      for (size_t i = 0; i + 1 < bytes.size(); ++i) {
        joinable_[static_cast<unsigned char>(bytes[i]) << 8 | static_cast<unsigned char>(bytes[i + 1])] = true;
      }
    }
    const bool unk_possible = std::any_of(std::begin(byte_token_), std::end(byte_token_), [](TokenId t) { return t < 0; });
    cut_words_ = !options_.ignore_merges && !(options_.fuse_unk && unk_possible);
  }

  pairs_ = std::make_unique<PairTable>(merges_.size());
  // Each merge's result: the ordinary token whose bytes are left + right.
  std::string merged;
  for (size_t rank = 0; rank < merges_.size(); ++rank) {
    auto [left, right] = merges_[rank];
    check(left >= 0 && left < vocab_size() && right >= 0 && right < vocab_size(),
          "tokenizer: merge {} refers to token ids ({}, {}) outside [0, {})", rank, left, right, vocab_size());
    merged.assign(token_bytes(left));
    merged += token_bytes(right);
    auto it = index_.find(merged);
    check(it != index_.end(), "tokenizer: merge {} ({} + {}) makes bytes that are not in the vocabulary", rank, left, right);
    check(pairs_->insert(pair_key(left, right), static_cast<uint32_t>(rank), it->second),
          "tokenizer: merge {} ({} + {}) repeats an earlier merge", rank, left, right);
  }
}

Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

std::string_view Tokenizer::token_bytes(TokenId id) const {
  check(id >= 0 && id < vocab_size(), "tokenizer: token id {} out of range [0, {})", id, vocab_size());
  return std::string_view(arena_).substr(offsets_[id], offsets_[id + 1] - offsets_[id]);
}

bool Tokenizer::is_special(TokenId id) const { return id >= 0 && id < vocab_size() && skip_on_decode_[id]; }

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
  // What else changes the ids, for tokenizers other than GPT-2's (whose fingerprints stay as they were).
  const TokenizerOptions& o = options_;
  if (o.pre_tokenizer != PreTokenizer::kGpt2 || o.ignore_merges || o.nfc || o.sentencepiece ||
      !o.template_prefix.empty() || !o.template_suffix.empty() ||
      std::any_of(added_.begin(), added_.end(), [](const AddedToken& a) { return !a.special || a.normalized || a.lstrip || a.rstrip; })) {
    uint8_t flags[] = {static_cast<uint8_t>(o.pre_tokenizer), o.ignore_merges, o.nfc, o.sentencepiece,
                       static_cast<uint8_t>(o.prepend_space), o.fuse_unk, o.strip_leading_space};
    feed(flags, sizeof flags);
    feed(&o.unk_id, sizeof o.unk_id);
    feed(o.byte_fallback.data(), o.byte_fallback.size() * sizeof(TokenId));
    feed(o.template_prefix.data(), o.template_prefix.size() * sizeof(TokenId));
    feed(o.template_suffix.data(), o.template_suffix.size() * sizeof(TokenId));
    for (const AddedToken& a : added_) {
      uint8_t f[] = {a.special, a.normalized, a.lstrip, a.rstrip};
      feed(f, sizeof f);
    }
  }
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

namespace {
constexpr size_t kShort = 128;  // parts merged in arrays on the stack; more in a heap
}  // namespace

// Byte-level: the parts start as the bytes' tokens.
void Tokenizer::bpe(const unsigned char* bytes, size_t size, std::vector<TokenId>& out) const {
  if (size == 1) {
    out.push_back(byte_token_[bytes[0]]);
    return;
  }
  if (size > kShort) {
    std::vector<TokenId> parts(size);
    for (size_t i = 0; i < size; ++i) parts[i] = byte_token_[bytes[i]];
    merge_parts_long(parts.data(), size, out);
    return;
  }
  TokenId parts[kShort];
  for (size_t i = 0; i < size; ++i) parts[i] = byte_token_[bytes[i]];
  merge_parts(parts, size, out);
}

// Short runs of parts: tiktoken's scheme, an array of parts with the rank of each part and its
// right neighbour; each merge recomputes two ranks and shifts the tail. `parts` is overwritten.
void Tokenizer::merge_parts(TokenId* parts, size_t n, std::vector<TokenId>& out) const {
  if (n > kShort) {
    merge_parts_long(parts, n, out);
    return;
  }
  constexpr uint32_t kNone = ~uint32_t{0};
  uint32_t ranks[kShort];  // ranks[i]: rank of (parts[i], parts[i+1]), kNone if no merge
  TokenId merged[kShort];
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

// Long pieces (runs of digits, spaces, symbols; SentencePiece's sections): a heap of candidate
// merges over a linked list, O(n log n). Ordered by (rank, start position), which is the order
// the short path merges in.
void Tokenizer::merge_parts_long(const TokenId* parts, size_t size, std::vector<TokenId>& out) const {
  struct Node {
    TokenId id;
    int32_t prev, next;  // -1 at the ends
    uint32_t version;    // bumped when the node changes, to drop stale heap entries
  };
  struct Candidate {
    uint32_t rank;
    int32_t left;  // node index: the position of the pair's first part
    uint32_t left_version, right_version;
    TokenId merged;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
  };
  std::vector<Node> nodes(size);
  for (size_t i = 0; i < size; ++i) {
    nodes[i] = {parts[i], static_cast<int32_t>(i) - 1, i + 1 < size ? static_cast<int32_t>(i + 1) : -1, 0};
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
// One word (pre-token)

Tokenizer::Cache& Tokenizer::thread_cache() const {
  thread_local Cache cache;
  if (cache.owner != uid_) {
    cache.clear();
    cache.owner = uid_;
  }
  return cache;
}

void Tokenizer::encode_word(const unsigned char* piece, size_t size, std::vector<TokenId>& out) const {
  if (options_.ignore_merges) {
    auto it = index_.find(std::string_view(reinterpret_cast<const char*>(piece), size));
    if (it != index_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  if (!options_.sentencepiece) {
    bpe(piece, size, out);
    return;
  }
  thread_local std::vector<TokenId> parts;
  parts.clear();
  sentencepiece_symbols(piece, size, parts);
  merge_parts(parts.data(), parts.size(), out);
}

void Tokenizer::encode_word_cached(const unsigned char* piece, size_t size, std::vector<TokenId>& out,
                                   Cache& cache) const {
  if (size == 1 && !options_.sentencepiece) {
    out.push_back(byte_token_[piece[0]]);
    return;
  }
  if (size > Cache::kMaxPiece) {
    encode_word(piece, size, out);
    return;
  }
  const uint64_t cache_mask = Cache::kCapacity - 1;
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
    return;
  }
  size_t before = out.size();
  encode_word(piece, size, out);
  if (cache.used * 2 >= Cache::kCapacity) {
    cache.clear();
    return;  // the slot found above is stale now; cache again on the next occurrence
  }
  slot = {h, static_cast<uint32_t>(cache.keys.size()), static_cast<uint32_t>(size),
          static_cast<uint32_t>(cache.values.size()), static_cast<uint32_t>(out.size() - before)};
  cache.keys.append(reinterpret_cast<const char*>(piece), size);
  cache.values.insert(cache.values.end(), out.begin() + static_cast<ptrdiff_t>(before), out.end());
  ++cache.used;
}

// ---------------------------------------------------------------------------------------------
// Decoding

void Tokenizer::decode_append(std::span<const TokenId> ids, std::string& out, bool skip_special) const {
  const size_t start = out.size();
  size_t total = start;
  for (TokenId id : ids) {
    check(id >= 0 && id < vocab_size(), "tokenizer: cannot decode token id {}: outside [0, {})", id, vocab_size());
    total += offsets_[id + 1] - offsets_[id];
  }
  out.reserve(total);
  for (TokenId id : ids) {
    if (!(skip_special && skip_on_decode_[id])) out.append(arena_, offsets_[id], offsets_[id + 1] - offsets_[id]);
  }
  // SentencePiece's Strip decoder: the space its encoder put before the text.
  if (options_.strip_leading_space && out.size() > start && out[start] == ' ') out.erase(start, 1);
}

std::string Tokenizer::decode(std::span<const TokenId> ids, bool skip_special) const {
  std::string out;
  decode_append(ids, out, skip_special);
  return out;
}

}  // namespace paraflow::data
