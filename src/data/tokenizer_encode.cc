// Encoding a text, outside in, as Hugging Face's tokenizers does it:
//   1. added tokens matched in the raw text (leftmost, longest; those not `normalized`);
//   2. each section between them normalized (NFC; SentencePiece's "▁" for spaces and its
//      leading space), and the `normalized` added tokens matched in it;
//   3. the rest cut into pre-tokens by the family's pattern (tokenizer_pretokenize.h);
//   4. each pre-token encoded by BPE (tokenizer.cc), through a per-thread cache.
#include <algorithm>
#include <array>
#include <atomic>
#include <thread>

#include "base/error.h"
#include "data/tokenizer.h"
#include "data/tokenizer_normalize.h"
#include "data/tokenizer_pretokenize.h"

namespace paraflow::data {
namespace {

int resolve_threads(int threads) {
  if (threads > 0) return threads;
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

// The length of the whitespace character (Unicode White_Space, Rust's char::is_whitespace, what
// lstrip takes) that ends at `end` > 0, or 0.
size_t space_before(std::string_view text, size_t end) {
  size_t start = end - 1;
  while (start > 0 && end - start < 4 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
  return white_space_at(text, start) == end - start ? end - start : 0;
}

// The sections of `text` between added tokens, in order: calls section(text, offset) for plain
// text and token(id) for each match. `by_first[b]`: the added tokens (indices into `added`) that
// start with byte b, longest first, so the first that matches at the leftmost position is
// Hugging Face's leftmost-longest match (its Aho-Corasick's). lstrip / rstrip widen a match over
// the whitespace beside it, never into the previous match.
template <typename Section, typename Token>
void split_added(std::string_view text, const std::vector<AddedToken>& added,
                 const std::array<std::vector<uint32_t>, 256>& by_first, const Tokenizer& tok, Section&& section,
                 Token&& token) {
  size_t pos = 0;  // end of the previous match
  for (size_t i = 0; i < text.size();) {
    const AddedToken* match = nullptr;
    size_t size = 0;
    for (uint32_t k : by_first[static_cast<unsigned char>(text[i])]) {
      std::string_view s = tok.token_bytes(added[k].id);
      if (text.compare(i, s.size(), s) == 0) {
        match = &added[k];
        size = s.size();
        break;
      }
    }
    if (!match) {
      ++i;
      continue;
    }
    size_t start = i, end = i + size;
    if (match->lstrip) {
      while (start > pos) {
        size_t n = space_before(text, start);
        if (n == 0 || start - n < pos) break;
        start -= n;
      }
    }
    if (match->rstrip) {
      while (end < text.size()) {
        size_t n = white_space_at(text, end);
        if (n == 0) break;
        end += n;
      }
    }
    if (start > pos) section(text.substr(pos, start - pos), pos);
    token(match->id);
    pos = i = end;
  }
  if (pos < text.size()) section(text.substr(pos), pos);
}

}  // namespace

void Tokenizer::encode_append(std::string_view text, std::vector<TokenId>& out, bool allow_special) const {
  Cache& cache = thread_cache();
  if (!allow_special || added_.empty()) {
    if (!text.empty()) encode_section(text, true, out, cache);
    return;
  }
  split_added(
      text, added_, added_by_first_[0], *this,
      [&](std::string_view section, size_t offset) { encode_section(section, offset == 0, out, cache); },
      [&](TokenId id) { out.push_back(id); });
}

// Step 2: one non-empty section of raw text (`at_start`: it begins the text).
void Tokenizer::encode_section(std::string_view text, bool at_start, std::vector<TokenId>& out, Cache& cache) const {
  std::string normalized, spaced;
  if (options_.nfc && to_nfc(text, normalized)) text = normalized;
  if (options_.sentencepiece && sentencepiece_spaces(text, at_start, spaced)) text = spaced;
  if (!any_normalized_added_) {
    encode_ordinary(text, out, cache);
    return;
  }
  split_added(
      text, added_, added_by_first_[1], *this,
      [&](std::string_view section, size_t) { encode_ordinary(section, out, cache); },
      [&](TokenId id) { out.push_back(id); });
}

size_t Tokenizer::piece_end(std::string_view text, size_t pos) const {
  switch (options_.pre_tokenizer) {
    case PreTokenizer::kGpt2: return gpt2_piece_end(text, pos);
    case PreTokenizer::kLlama3: return llama3_piece_end(text, pos, 3);
    case PreTokenizer::kQwen2: return llama3_piece_end(text, pos, 1);
    case PreTokenizer::kWhole: return whole_word_end(text, pos);
  }
  return text.size();
}

// SentencePiece-style: the section is one word, but BPE of it equals BPE of its parts cut where no
// token can span (see joinable_): the parts are cached like pre-tokens. Cuts fall on character
// starts (bytes that are not UTF-8 continuations), so the parts' characters are the word's.
size_t Tokenizer::whole_word_end(std::string_view text, size_t pos) const {
  if (!cut_words_) return text.size();
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  for (size_t i = pos + 1; i < text.size(); ++i) {
    if ((p[i] & 0xC0) != 0x80 && !joinable_[p[i - 1] << 8 | p[i]]) return i;
  }
  return text.size();
}

// Steps 3 and 4.
void Tokenizer::encode_ordinary(std::string_view text, std::vector<TokenId>& out, Cache& cache) const {
  const auto* base = reinterpret_cast<const unsigned char*>(text.data());
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = piece_end(text, pos);
    encode_word_cached(base + pos, end - pos, out, cache);
    pos = end;
  }
}

std::vector<TokenId> Tokenizer::encode(std::string_view text, bool allow_special) const {
  std::vector<TokenId> out;
  out.reserve(text.size() / 4 + 16);
  encode_append(text, out, allow_special);
  return out;
}

std::vector<TokenId> Tokenizer::encode_with_template(std::string_view text) const {
  std::vector<TokenId> out(options_.template_prefix);
  encode_append(text, out, true);
  out.insert(out.end(), options_.template_suffix.begin(), options_.template_suffix.end());
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

// Where a text can be cut and its parts encoded apart with the same ids.
bool Tokenizer::is_safe_split(std::string_view text, size_t pos) const {
  switch (options_.pre_tokenizer) {
    case PreTokenizer::kGpt2: return is_safe_split_point(text, pos);
    case PreTokenizer::kLlama3:
    case PreTokenizer::kQwen2: return is_safe_split_point_llama3(text, pos);
    case PreTokenizer::kWhole: return false;  // a section is one word
  }
  return false;
}

std::vector<TokenId> Tokenizer::encode_parallel(std::string_view text, int threads, bool allow_special) const {
  int n = resolve_threads(threads);
  constexpr size_t kMinChunk = 256 * 1024;
  // SentencePiece's sections are single words; an lstrip / rstrip token takes spaces across a cut.
  const bool strips = std::any_of(added_.begin(), added_.end(), [](const AddedToken& a) { return a.lstrip || a.rstrip; });
  if (n == 1 || text.size() < 2 * kMinChunk || options_.pre_tokenizer == PreTokenizer::kWhole || strips) {
    return encode(text, allow_special);
  }
  // Chunks of about size / (4n) bytes, each ending at a safe split point (none found: one chunk).
  size_t target = std::max(kMinChunk, text.size() / (4 * static_cast<size_t>(n)));
  // An added token with whitespace in it could straddle a split point: never cut inside one.
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
    while (cut < text.size() && (!is_safe_split(text, cut) || (allow_special && inside_special(cut)))) ++cut;
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

}  // namespace paraflow::data
