// Training a byte-level BPE vocabulary from text, as GPT-2's was: count the pre-tokens
// (tokenizer_pretokenize.h), start from the 256 bytes, and repeatedly merge the most frequent
// adjacent pair across all words (weighted by word count) until the vocabulary is full.
//
// Tie rule (deterministic): among pairs of equal count, the one with the smaller left id wins,
// then the smaller right id. Ids are byte values for 0..255 and creation order after that, so
// the result depends only on the counted words, not on hash or thread order.
// A pair whose bytes already form a token (two ways to spell the same bytes) is skipped, so each
// merge makes a new token and id 256 + rank is the token of merge `rank`, as in GPT-2.
//
// Pair counts are updated incrementally: a merge touches only the words that contain its pair
// (an index pair -> words), and a max-heap with lazy re-checks picks the next pair.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "data/tokenizer.h"

namespace paraflow::data {

struct BpeTrainOptions {
  int vocab_size = 8192;  // 256 bytes + merges + special tokens
  std::vector<std::string> special_tokens = {std::string(kEndOfText)};
  // Stop early when the best pair occurs less often. 1 (as tokenizers' min_frequency 0) fills
  // the vocabulary whenever any adjacent pair is left.
  int64_t min_pair_count = 1;
  int threads = 0;             // for counting words; 0: all cores
};

class BpeTrainer {
 public:
  explicit BpeTrainer(BpeTrainOptions options);

  // Counts the pre-tokens of one document. Special-token text in it is cut out, never learnt.
  void add_text(std::string_view text);
  // Many documents, counted on options.threads threads.
  void add_texts(std::span<const std::string_view> texts);

  size_t distinct_words() const { return words_.size(); }

  // Runs the merges. Tokens: ids 0..255 = bytes 0..255, then merges, then the special tokens.
  Tokenizer train() const;

 private:
  void count_into(std::string_view text, std::unordered_map<std::string, int64_t>& counts) const;

  BpeTrainOptions options_;
  std::unordered_map<std::string, int64_t> words_;
};

}  // namespace paraflow::data
