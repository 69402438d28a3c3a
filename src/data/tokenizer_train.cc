#include "data/tokenizer_train.h"

#include <algorithm>
#include <atomic>
#include <queue>
#include <thread>
#include <unordered_set>

#include "base/error.h"
#include "data/tokenizer_pretokenize.h"

namespace paraflow::data {
namespace {

inline uint64_t pair_key(TokenId left, TokenId right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

struct HeapEntry {
  int64_t count;
  uint64_t key;
  // priority_queue pops the largest: higher count, then the smaller (left, right) key.
  bool operator<(const HeapEntry& o) const { return count != o.count ? count < o.count : key > o.key; }
};

}  // namespace

BpeTrainer::BpeTrainer(BpeTrainOptions options) : options_(std::move(options)) {
  check(options_.vocab_size >= 256 + static_cast<int>(options_.special_tokens.size()),
        "tokenizer train: vocab_size {} is below 256 bytes + {} special tokens", options_.vocab_size,
        options_.special_tokens.size());
  for (const std::string& s : options_.special_tokens) check(!s.empty(), "tokenizer train: empty special token");
}

void BpeTrainer::count_into(std::string_view text, std::unordered_map<std::string, int64_t>& counts) const {
  // Cut at special tokens first so that they are never counted as text.
  while (!text.empty()) {
    size_t cut = text.size(), cut_size = 0;
    for (const std::string& s : options_.special_tokens) {
      size_t at = text.find(s);
      if (at < cut) {
        cut = at;
        cut_size = s.size();
      }
    }
    gpt2_split(text.substr(0, cut), [&](std::string_view piece) { ++counts[std::string(piece)]; });
    text.remove_prefix(std::min(text.size(), cut + cut_size));
  }
}

void BpeTrainer::add_text(std::string_view text) { count_into(text, words_); }

void BpeTrainer::add_texts(std::span<const std::string_view> texts) {
  int threads = options_.threads > 0 ? options_.threads : static_cast<int>(std::thread::hardware_concurrency());
  threads = std::clamp<int>(threads, 1, static_cast<int>(std::max<size_t>(texts.size(), 1)));
  std::vector<std::unordered_map<std::string, int64_t>> partial(threads);
  std::atomic<size_t> next{0};
  {
    std::vector<std::jthread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        for (size_t i; (i = next++) < texts.size();) count_into(texts[i], partial[t]);
      });
    }
  }
  for (auto& counts : partial) {
    for (auto& [word, count] : counts) words_[word] += count;
  }
}

Tokenizer BpeTrainer::train() const {
  const int n_special = static_cast<int>(options_.special_tokens.size());
  const int target_merges = options_.vocab_size - 256 - n_special;

  // Words in byte order, so nothing below depends on hash-map iteration order.
  std::vector<std::pair<std::string_view, int64_t>> sorted;
  sorted.reserve(words_.size());
  for (const auto& [word, count] : words_) sorted.emplace_back(word, count);
  std::sort(sorted.begin(), sorted.end());

  std::vector<std::vector<TokenId>> symbols(sorted.size());
  std::vector<int64_t> counts(sorted.size());
  std::unordered_map<uint64_t, int64_t> pair_count;
  std::unordered_map<uint64_t, std::vector<uint32_t>> where;  // pair -> words that (may) hold it
  for (size_t w = 0; w < sorted.size(); ++w) {
    const auto& [word, count] = sorted[w];
    counts[w] = count;
    auto& s = symbols[w];
    for (char c : word) s.push_back(static_cast<unsigned char>(c));
    for (size_t i = 0; i + 1 < s.size(); ++i) {
      uint64_t key = pair_key(s[i], s[i + 1]);
      pair_count[key] += count;
      auto& list = where[key];
      if (list.empty() || list.back() != w) list.push_back(static_cast<uint32_t>(w));
    }
  }

  std::vector<std::string> tokens(256);
  for (int b = 0; b < 256; ++b) tokens[b] = std::string(1, static_cast<char>(b));
  std::unordered_set<std::string> existing(tokens.begin(), tokens.end());
  std::unordered_set<uint64_t> skipped;
  std::vector<std::pair<TokenId, TokenId>> merges;

  std::priority_queue<HeapEntry> heap;
  for (const auto& [key, count] : pair_count) heap.push({count, key});
  std::vector<uint32_t> seen(sorted.size(), ~uint32_t{0});
  std::unordered_map<uint64_t, int64_t> delta;

  while (static_cast<int>(merges.size()) < target_merges && !heap.empty()) {
    HeapEntry top = heap.top();
    heap.pop();
    auto found = pair_count.find(top.key);
    int64_t current = found == pair_count.end() ? 0 : found->second;
    if (current != top.count) {  // stale entry: re-queue with the current count
      if (current > 0) heap.push({current, top.key});
      continue;
    }
    if (current < options_.min_pair_count) break;
    if (skipped.count(top.key)) continue;
    auto left = static_cast<TokenId>(top.key >> 32);
    auto right = static_cast<TokenId>(top.key & 0xFFFFFFFFu);
    std::string merged = tokens[left] + tokens[right];
    if (!existing.insert(merged).second) {
      skipped.insert(top.key);
      continue;
    }
    const auto id = static_cast<TokenId>(tokens.size());
    const auto merge_index = static_cast<uint32_t>(merges.size());
    tokens.push_back(std::move(merged));
    merges.emplace_back(left, right);

    // Every word holding (left, right): replace its occurrences left to right, and turn the
    // word's pairs before/after into count deltas. New pairs all contain `id`.
    std::vector<uint32_t> holders = std::move(where[top.key]);
    where.erase(top.key);
    delta.clear();
    for (uint32_t w : holders) {
      if (seen[w] == merge_index) continue;
      seen[w] = merge_index;
      auto& s = symbols[w];
      const int64_t c = counts[w];
      bool has = false;
      for (size_t i = 0; i + 1 < s.size() && !has; ++i) has = s[i] == left && s[i + 1] == right;
      if (!has) continue;
      for (size_t i = 0; i + 1 < s.size(); ++i) delta[pair_key(s[i], s[i + 1])] -= c;
      size_t j = 0;
      for (size_t i = 0; i < s.size();) {
        if (i + 1 < s.size() && s[i] == left && s[i + 1] == right) {
          s[j++] = id;
          i += 2;
        } else {
          s[j++] = s[i++];
        }
      }
      s.resize(j);
      for (size_t i = 0; i + 1 < s.size(); ++i) {
        uint64_t key = pair_key(s[i], s[i + 1]);
        delta[key] += c;
        if (s[i] == id || s[i + 1] == id) {
          auto& list = where[key];
          if (list.empty() || list.back() != w) list.push_back(w);
        }
      }
    }
    for (const auto& [key, d] : delta) {
      if (d == 0) continue;
      int64_t& count = pair_count[key];
      count += d;
      if (d > 0) heap.push({count, key});
      if (count == 0) pair_count.erase(key);
    }
  }

  std::vector<TokenId> special_ids;
  for (const std::string& s : options_.special_tokens) {
    special_ids.push_back(static_cast<TokenId>(tokens.size()));
    tokens.push_back(s);
  }
  return Tokenizer(std::move(tokens), std::move(merges), std::move(special_ids));
}

}  // namespace paraflow::data
