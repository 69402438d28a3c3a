// BPE tokenizers as GPT-2 defines them (and tiktoken / Hugging Face tokenizers run them), and the
// Llama family's variants of it that Hugging Face `tokenizer.json` files describe.
//
// Byte-level BPE (GPT-2, Llama 3, Qwen2): text is cut into pre-tokens by the family's split
// pattern (tokenizer_pretokenize.h), each pre-token's bytes start as single-byte tokens, and
// adjacent pairs are merged lowest merge rank first (leftmost on ties) until no listed merge
// applies; with `ignore_merges` (Llama 3) a pre-token that is itself a token is taken whole.
// SentencePiece-style BPE (Llama 2, Mistral): spaces are spelled U+2581 "▁" in the files, a
// section of text is one pre-token starting as its characters, and a character that is not a
// token falls back to its UTF-8 bytes as `<0xNN>` tokens (tokenizer_sentencepiece.cc). Tokens are
// held as the bytes they decode to ("▁" as a space), so both kinds share the merge machinery.
//
// Added tokens (`<|endoftext|>`, `<|begin_of_text|>`, `<s>`) are matched in the raw text before
// everything else when allowed. Any byte string round-trips through byte-level BPE:
// decode(encode(b)) == b. Merge ranks are the merges' order, as in Hugging Face tokenizers;
// tiktoken ranks a pair by the id of its concatenated bytes instead. The two agree when token
// 256 + r is made by merge r (GPT-2's vocabulary, and the ones BpeTrainer makes):
// tests/data/tokenizer_interop_test.cc checks both.
//
// A Tokenizer is immutable once built; encode/decode may be called from any number of threads.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace paraflow::data {

using TokenId = int32_t;

inline constexpr std::string_view kEndOfText = "<|endoftext|>";
// U+2581, SentencePiece's spelling of a space.
inline constexpr std::string_view kMetaspace = "\xE2\x96\x81";

// How text becomes pre-tokens: GPT-2's regex, Llama 3's and Qwen2's split patterns (which differ
// in digit runs: up to 3 digits, or one), or SentencePiece's whole sections.
enum class PreTokenizer : uint8_t { kGpt2, kLlama3, kQwen2, kWhole };

// When a space is put before a section of text (SentencePiece's "▁" prefix; sections are the
// text between added tokens): never; before the section that starts the text unless it starts
// with a space (Metaspace prepend_scheme "first"); before every section unless it starts with a
// space (Metaspace "always"); before every section (Llama 2's legacy Prepend normalizer).
enum class PrependSpace : uint8_t { kNever, kFirst, kAlways, kAlwaysEvenAfterSpace };

struct TokenizerOptions {
  PreTokenizer pre_tokenizer = PreTokenizer::kGpt2;
  // A pre-token that is a token of the vocabulary is that token, merges or not (Llama 3).
  bool ignore_merges = false;
  // Text is put in Unicode NFC before pre-tokenisation (Qwen2).
  bool nfc = false;
  // SentencePiece-style: pieces start as characters; bytes of a character missing from the
  // vocabulary become byte_fallback[byte] (`<0xNN>`), else unk_id (runs fused when fuse_unk), else
  // they are dropped, as Hugging Face's BPE model does.
  bool sentencepiece = false;
  PrependSpace prepend_space = PrependSpace::kNever;
  std::vector<TokenId> byte_fallback;  // 256 ids, or empty
  TokenId unk_id = -1;
  bool fuse_unk = false;
  // Decoding drops one leading space (SentencePiece's Strip decoder).
  bool strip_leading_space = false;
  // Ids put around every encoded text by encode_with_template (the post-processor's template:
  // Llama's BOS).
  std::vector<TokenId> template_prefix, template_suffix;
};

// A token matched verbatim in text before pre-tokenisation (tokenizer.json's added_tokens).
// special: skipped by decode(ids, skip_special). normalized: matched in the normalized text (else
// in the raw text, first). lstrip / rstrip: the match takes the whitespace on that side with it.
struct AddedToken {
  TokenId id = -1;
  bool special = true;
  bool normalized = false;
  bool lstrip = false, rstrip = false;
};

// GGUF's tokenizer.ggml.* values as the file holds them (infer/gguf_tokenizer.h reads and writes
// the keys).
struct GgufVocabulary {
  std::string model;             // "gpt2" (byte-level BPE) or "llama" (SentencePiece-style)
  std::string pre = "default";   // gpt2: the split pattern: default / gpt-2, llama-bpe, qwen2
  std::vector<std::string> tokens;  // as the files spell them (GPT-2's byte-to-unicode map, or "▁")
  std::vector<int32_t> token_types;  // llama.cpp's: 1 normal, 2 unknown, 3 control, 4 user-defined, 6 byte
  std::vector<std::string> merges;   // gpt2: "LEFT RIGHT" in rank order
  std::vector<float> scores;         // llama: a piece's priority when merging, highest first
  TokenId bos = -1, eos = -1, unk = -1;
  std::optional<bool> add_bos, add_eos;  // unset: BOS for llama and llama-bpe, as llama.cpp does
  bool add_space_prefix = true;          // llama: a space before each section of text
};

class Tokenizer {
 public:
  // tokens[id] = the token's bytes (all 256 single bytes must be present); merges in rank order
  // as (left id, right id), each producing the token whose bytes are left + right; special[id]
  // marks tokens matched verbatim in text (never produced by merges). A pair listed twice is an
  // error.
  Tokenizer(std::vector<std::string> tokens, std::vector<std::pair<TokenId, TokenId>> merges,
            std::vector<TokenId> special_ids);
  // The general form: tokens as the bytes they decode to; added tokens' bytes are their text;
  // with options.sentencepiece the 256 single bytes need not be tokens.
  Tokenizer(std::vector<std::string> tokens, std::vector<std::pair<TokenId, TokenId>> merges,
            std::vector<AddedToken> added, TokenizerOptions options);
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // ---- Files (tokenizer_files.cc) ----
  // GPT-2's encoder.json + vocab.bpe, or Hugging Face's vocab.json + merges.txt (same formats:
  // token strings through GPT-2's byte-to-unicode map). `<|endoftext|>` in the vocab is special.
  static Tokenizer load_vocab_merges(const std::filesystem::path& vocab_json,
                                     const std::filesystem::path& merges_txt);
  // GGUF's tokenizer.ggml.* (tokenizer_gguf.cc): a byte-level BPE ("gpt2": GPT-2's, Llama 3's or
  // Qwen2's split pattern by tokenizer.ggml.pre) or a SentencePiece-style one ("llama": pieces
  // with scores, byte fallback). Errors name `where` and the key.
  static Tokenizer from_gguf(const GgufVocabulary& vocabulary, const std::string& where);
  // This tokenizer as those keys hold it (bos / eos from the template's ids when it has them).
  GgufVocabulary gguf_vocabulary() const;
  // A Hugging Face `tokenizer.json` with a BPE model: GPT-2's, Llama 3's and Qwen2's byte-level
  // ones, Llama 2's and Mistral's SentencePiece-style ones (tokenizer_json.cc). Anything else is
  // refused naming the field and its value.
  static Tokenizer load_tokenizer_json(const std::filesystem::path& path);
  // The same, with what transformers takes from tokenizer_config.json over it: for Llama's
  // tokenizer classes (Llama 2, Mistral), add_bos_token (default true) and add_eos_token
  // (default false) rebuild the template, as LlamaTokenizerFast does. A missing config is none.
  static Tokenizer load_tokenizer_json(const std::filesystem::path& path,
                                       const std::filesystem::path& tokenizer_config);
  // tiktoken's `.tiktoken` ranks (base64 token, space, rank per line; ranks = ids, dense), with
  // `<|endoftext|>` appended as the next id. Merges are recovered as tiktoken's ranks imply:
  // token r is the pair that BPE with the merges of rank < r leaves its bytes in.
  static Tokenizer load_tiktoken(const std::filesystem::path& path);
  // A directory: tokenizer.json (with its tokenizer_config.json) if present, else vocab.json +
  // merges.txt, else encoder.json + vocab.bpe.
  static Tokenizer load(const std::filesystem::path& dir);
  // Whether `dir` holds one of the file sets load() reads.
  static bool present_in(const std::filesystem::path& dir);
  // Writes vocab.json, merges.txt, tokenizer.json and tokenizer_config.json (GPT2TokenizerFast).
  // GPT-2-style tokenizers only (default options, special added tokens).
  void save(const std::filesystem::path& dir) const;
  // Puts this tokenizer, loaded from `source_dir`, into an export `dir`: save() for GPT-2-style
  // ones, else a copy of the source's tokenizer.json, tokenizer_config.json and
  // special_tokens_map.json (what transformers reads).
  void export_to(const std::filesystem::path& source_dir, const std::filesystem::path& dir) const;

  // ---- Encoding ----
  // Added tokens in `text` become their ids when allow_special, else they are plain text.
  std::vector<TokenId> encode(std::string_view text, bool allow_special = true) const;
  // encode() between the post-processor's template ids (Llama's BOS), as Hugging Face's
  // encode(text, add_special_tokens=True) and transformers' tokenizer(text) give.
  std::vector<TokenId> encode_with_template(std::string_view text) const;
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
  // The bytes of the tokens (added tokens' text; skipped when special and skip_special), less one
  // leading space when options().strip_leading_space. Bytes that are not UTF-8 are kept (Hugging
  // Face shows each as U+FFFD).
  std::string decode(std::span<const TokenId> ids, bool skip_special = false) const;
  void decode_append(std::span<const TokenId> ids, std::string& out, bool skip_special = false) const;

  // ---- Vocabulary ----
  int vocab_size() const { return static_cast<int>(offsets_.size()) - 1; }
  std::string_view token_bytes(TokenId id) const;
  const std::vector<std::pair<TokenId, TokenId>>& merges() const { return merges_; }
  // Added tokens' ids, special or not (all matched verbatim in text, never made by merges).
  const std::vector<TokenId>& special_ids() const { return special_ids_; }
  // Whether `id` is an added token marked special (decode's skip_special drops it).
  bool is_special(TokenId id) const;
  const TokenizerOptions& options() const { return options_; }
  // The id of a special token by its text, or -1.
  TokenId special_id(std::string_view text) const;
  // The id of `<|endoftext|>`, or -1 when the vocabulary has none.
  TokenId eot_id() const { return special_id(kEndOfText); }
  // 16 hex digits: FNV-1a 64 of tokens + merges + special ids, for data manifests.
  std::string fingerprint() const;

 private:
  struct PairTable;
  struct Cache;
  // Encoding, outside in (tokenizer_encode.cc): raw text -> sections between raw-matched added
  // tokens -> normalized sections -> between normalized added tokens -> pre-tokens -> words.
  void encode_section(std::string_view text, bool at_start, std::vector<TokenId>& out, Cache& cache) const;
  void encode_ordinary(std::string_view text, std::vector<TokenId>& out, Cache& cache) const;
  size_t piece_end(std::string_view text, size_t pos) const;
  size_t whole_word_end(std::string_view text, size_t pos) const;
  bool is_safe_split(std::string_view text, size_t pos) const;
  // One pre-token, through the thread's cache (tokenizer.cc).
  void encode_word_cached(const unsigned char* piece, size_t size, std::vector<TokenId>& out, Cache& cache) const;
  void encode_word(const unsigned char* piece, size_t size, std::vector<TokenId>& out) const;
  void bpe(const unsigned char* bytes, size_t size, std::vector<TokenId>& out) const;
  void merge_parts(TokenId* parts, size_t n, std::vector<TokenId>& out) const;
  void merge_parts_long(const TokenId* parts, size_t n, std::vector<TokenId>& out) const;
  // SentencePiece-style (tokenizer_sentencepiece.cc): a section's characters as tokens.
  void sentencepiece_symbols(const unsigned char* bytes, size_t size, std::vector<TokenId>& parts) const;
  bool sentencepiece_spaces(std::string_view text, bool at_start, std::string& out) const;
  Cache& thread_cache() const;

  std::string arena_;              // all tokens' bytes, back to back
  std::vector<uint32_t> offsets_;  // token id -> [offsets_[id], offsets_[id + 1]) in arena_
  TokenId byte_token_[256];
  std::vector<std::pair<TokenId, TokenId>> merges_;
  std::vector<TokenId> special_ids_;    // added tokens, ascending
  std::vector<AddedToken> added_;      // by id, as special_ids_
  std::vector<bool> skip_on_decode_;   // id -> special added token
  // Added tokens by first byte, longest first (indices into added_): [0] matched in the raw text,
  // [1] in the normalized text.
  std::array<std::vector<uint32_t>, 256> added_by_first_[2];
  bool any_normalized_added_ = false;
  TokenizerOptions options_;
  std::unordered_map<std::string_view, TokenId> index_;  // bytes -> id of the ordinary tokens
  // SentencePiece-style sections are single words, cut (exactly) where no token can span: between
  // bytes a and b when no token holds a then b (joinable_[a << 8 | b] false). Off when the word as
  // a whole matters (ignore_merges; fuse_unk with unknown characters possible).
  std::vector<bool> joinable_;
  bool cut_words_ = false;
  std::unique_ptr<PairTable> pairs_;
  uint64_t uid_;  // tells thread-local caches of different tokenizers apart
};

// GPT-2's reversible byte <-> printable-unicode map used by its files (byte 0x20 -> "Ġ").
const std::string& byte_to_unicode_utf8(unsigned char byte);
// The byte of one such character, or -1.
int unicode_to_byte(char32_t code_point);

}  // namespace paraflow::data
