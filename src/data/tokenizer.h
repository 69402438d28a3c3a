// Byte-level BPE as GPT-2 defines it (and tiktoken / Hugging Face tokenizers run it): text is cut
// into pre-tokens by GPT-2's regex (tokenizer_pretokenize.h), each pre-token's bytes start as
// single-byte tokens, and adjacent pairs are merged lowest merge rank first (leftmost on ties)
// until no listed merge applies. Special tokens (`<|endoftext|>`) are matched in the raw text
// before pre-tokenisation when allowed. Any byte string round-trips: decode(encode(b)) == b.
// Merge ranks are the merges' order, as in Hugging Face tokenizers; tiktoken ranks a pair by the
// id of its concatenated bytes instead. The two agree when token 256 + r is made by merge r (GPT-2's
// vocabulary, and the ones BpeTrainer makes): tests/data/tokenizer_interop_test.cc checks both.
//
// A Tokenizer is immutable once built; encode/decode may be called from any number of threads.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace paraflow::data {

using TokenId = int32_t;

inline constexpr std::string_view kEndOfText = "<|endoftext|>";

class Tokenizer {
 public:
  // tokens[id] = the token's bytes (all 256 single bytes must be present); merges in rank order
  // as (left id, right id), each producing the token whose bytes are left + right; special[id]
  // marks tokens matched verbatim in text (never produced by merges). A pair listed twice is an
  // error.
  Tokenizer(std::vector<std::string> tokens, std::vector<std::pair<TokenId, TokenId>> merges,
            std::vector<TokenId> special_ids);
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // ---- Files (tokenizer_files.cc) ----
  // GPT-2's encoder.json + vocab.bpe, or Hugging Face's vocab.json + merges.txt (same formats:
  // token strings through GPT-2's byte-to-unicode map). `<|endoftext|>` in the vocab is special.
  static Tokenizer load_vocab_merges(const std::filesystem::path& vocab_json,
                                     const std::filesystem::path& merges_txt);
  // GPT-2-style strings as GGUF's tokenizer.ggml.tokens and .merges hold them: tokens[id] through
  // the byte-to-unicode map, merges "LEFT RIGHT" in rank order; `specials` (and `<|endoftext|>`)
  // are matched verbatim. Errors name `where`.
  static Tokenizer from_strings(const std::vector<std::string>& tokens, const std::vector<std::string>& merges,
                                const std::vector<std::string>& specials, const std::string& where);
  // A Hugging Face `tokenizer.json` with a byte-level BPE model.
  static Tokenizer load_tokenizer_json(const std::filesystem::path& path);
  // tiktoken's `.tiktoken` ranks (base64 token, space, rank per line; ranks = ids, dense), with
  // `<|endoftext|>` appended as the next id. Merges are recovered as tiktoken's ranks imply:
  // token r is the pair that BPE with the merges of rank < r leaves its bytes in.
  static Tokenizer load_tiktoken(const std::filesystem::path& path);
  // A directory: tokenizer.json if present, else vocab.json + merges.txt, else encoder.json +
  // vocab.bpe.
  static Tokenizer load(const std::filesystem::path& dir);
  // Whether `dir` holds one of the file sets load() reads.
  static bool present_in(const std::filesystem::path& dir);
  // Writes vocab.json, merges.txt, tokenizer.json and tokenizer_config.json (GPT2TokenizerFast).
  void save(const std::filesystem::path& dir) const;

  // ---- Encoding ----
  // Special tokens in `text` become their ids when allow_special, else they are plain text.
  std::vector<TokenId> encode(std::string_view text, bool allow_special = true) const;
  void encode_append(std::string_view text, std::vector<TokenId>& out, bool allow_special = true) const;
  // One text cut at safe split points into chunks encoded on `threads` threads (0: all cores).
  // Same ids as encode().
  std::vector<TokenId> encode_parallel(std::string_view text, int threads = 0, bool allow_special = true) const;
  // Many texts on `threads` threads (0: all cores).
  std::vector<std::vector<TokenId>> encode_batch(std::span<const std::string_view> texts, int threads = 0,
                                                 bool allow_special = true) const;
  // The BPE of one pre-token (no splitting, no cache, no special tokens). Used by tests.
  std::vector<TokenId> encode_piece(std::string_view piece) const;
  // The slow, obvious BPE (rescan all pairs after each merge) that the fast one is tested against.
  std::vector<TokenId> encode_piece_reference(std::string_view piece) const;

  // ---- Decoding ----
  std::string decode(std::span<const TokenId> ids) const;
  void decode_append(std::span<const TokenId> ids, std::string& out) const;

  // ---- Vocabulary ----
  int vocab_size() const { return static_cast<int>(offsets_.size()) - 1; }
  std::string_view token_bytes(TokenId id) const;
  const std::vector<std::pair<TokenId, TokenId>>& merges() const { return merges_; }
  const std::vector<TokenId>& special_ids() const { return special_ids_; }
  bool is_special(TokenId id) const;
  // The id of a special token by its text, or -1.
  TokenId special_id(std::string_view text) const;
  // The id of `<|endoftext|>`, or -1 when the vocabulary has none.
  TokenId eot_id() const { return special_id(kEndOfText); }
  // 16 hex digits: FNV-1a 64 of tokens + merges + special ids, for data manifests.
  std::string fingerprint() const;

 private:
  struct PairTable;
  struct Cache;
  void encode_ordinary(std::string_view text, std::vector<TokenId>& out, Cache& cache) const;
  void bpe(const unsigned char* bytes, size_t size, std::vector<TokenId>& out) const;
  void bpe_long(const unsigned char* bytes, size_t size, std::vector<TokenId>& out) const;
  Cache& thread_cache() const;

  std::string arena_;              // all tokens' bytes, back to back
  std::vector<uint32_t> offsets_;  // token id -> [offsets_[id], offsets_[id + 1]) in arena_
  TokenId byte_token_[256];
  std::vector<std::pair<TokenId, TokenId>> merges_;
  std::vector<TokenId> special_ids_;
  std::unique_ptr<PairTable> pairs_;
  uint64_t uid_;  // tells thread-local caches of different tokenizers apart
};

// GPT-2's reversible byte <-> printable-unicode map used by its files (byte 0x20 -> "Ġ").
const std::string& byte_to_unicode_utf8(unsigned char byte);
// The byte of one such character, or -1.
int unicode_to_byte(char32_t code_point);

}  // namespace paraflow::data
