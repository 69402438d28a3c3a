// `paraflow data prepare`: text corpora -> tokenized TFRecord shards + manifest.json.
//
// Inputs are glob patterns of `.txt` files (cut into documents at blank lines, at another
// separator, or one document per file: DocumentSeparator) and `.jsonl` / `.jsonl.gz` files (one
// JSON object per line; its `text_field` string is the document). Every document is
// tokenized (special-token text in it stays plain text) and followed by `<|endoftext|>`; it is
// written as one tf.train.Example{input_ids: int64 list} record, or as consecutive records of at
// most `record_tokens` tokens when it is longer.
//
// Split: a document goes to "val" when a hash of (seed, the document's text) falls below
// val_fraction, else to "train" — a pure function of the seed and the text, so the output is
// byte-identical for any thread count, a document keeps its split when other lines or files are
// added, removed or fixed, and copies of one text never straddle the splits. Too few documents
// for that (val_fraction x documents < kMinValidationDocuments, e.g. a short story in one .txt
// file): the last val_fraction of the tokens, in input order, are the "val" split instead (the
// document there cut in two), with a warning naming the numbers; the manifest's split.by says
// which ("documents" | "tokens"). (The documents wait in memory until there are enough; past
// 2^27 tokens of them the split is by document, with a warning if that leaves "val" empty.) Within a split, records keep input order (inputs sorted by
// path, documents in file order); the input pipeline does the shuffling.
//
// Output directory:
//   train-00000.tfrecord[.gz|.zlib], ...   shards of at most shard_bytes (uncompressed record
//   val-00000.tfrecord[.gz|.zlib], ...     bytes; a single larger record gets a shard of its own)
//   manifest.json                          written last (atomically): its presence means done
// Stale shards of an earlier run in the directory are removed first; the directory is locked
// (<out>/.lock) while it is written, so a second prepare into it is refused.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/tfrecord_io.h"

namespace paraflow::data {

enum class BadLinePolicy { fail, skip };

// How a .txt file is cut into documents (--document-separator): at blank lines, lines of
// whitespace only (the default, "blank-line"); at every occurrence of a text ("\n\n\n",
// "<|endoftext|>": backslash escapes \n \r \t \\ are read as such); or not at all ("none": the
// whole file is one document). Pieces of whitespace only are no documents; a document cut at
// blank lines ends with its last line's text, without the line break.
struct DocumentSeparator {
  enum class Kind { blank_line, text, none };
  Kind kind = Kind::blank_line;
  std::string text;  // Kind::text
  static DocumentSeparator parse(std::string_view flag);
};

// With fewer documents than this in the validation share, the split is made by tokens.
inline constexpr int kMinValidationDocuments = 10;
BadLinePolicy parse_bad_line_policy(std::string_view name);  // "fail" | "skip"

struct PrepareOptions {
  std::filesystem::path tokenizer;       // a directory Tokenizer::load reads
  std::vector<std::string> inputs;       // glob patterns (or plain paths)
  std::filesystem::path out;             // created if missing
  double val_fraction = 0.0;             // in [0, 1)
  std::string text_field = "text";       // for .jsonl / .jsonl.gz
  DocumentSeparator separator;           // for .txt
  int64_t shard_bytes = 64ll << 20;      // --shard-mb 64
  Compression compression = Compression::none;
  BadLinePolicy on_bad_line = BadLinePolicy::fail;
  uint64_t seed = 0;
  int64_t record_tokens = 1 << 16;       // longer documents are cut into several records
  int threads = 0;                       // 0: all cores
  // Inputs are read in runs of whole .jsonl lines, or whole .txt documents, of at least this
  // many bytes (a .txt file of one document is one run), tokenized on all threads; at most
  // 2 x threads + 1 runs are read and not yet written: what bounds memory, whatever the sizes of
  // the files. One thread reads (and decompresses) every input, in order.
  int64_t chunk_bytes = 4 << 20;
  bool progress = true;                  // a progress line on stderr
  // Called with "file:line: problem" for every skipped line (policy skip), and with the warning
  // of a split made by tokens; default: stderr.
  std::function<void(const std::string&)> log;
};

// Runs the whole preparation; returns the manifest it wrote. Throws InputError on a bad input
// line under policy fail ("file:line: problem"), a glob that matches nothing, an unknown file
// kind, or a tokenizer without `<|endoftext|>`.
nlohmann::json prepare(const PrepareOptions& options);

// The documents of one input: a .txt file's, cut by `separator`, or the `text_field` string of
// every line of a .jsonl / .jsonl.gz file. A bad line goes to `on_bad_line("file:line: problem")`,
// which returns whether to go on.
void for_each_document(const std::filesystem::path& path, const std::string& text_field,
                       const DocumentSeparator& separator,
                       const std::function<void(std::string_view)>& on_document,
                       const std::function<bool(std::string)>& on_bad_line);

// Sorted, de-duplicated files matching the patterns; InputError names a pattern without match.
std::vector<std::filesystem::path> expand_inputs(const std::vector<std::string>& patterns);

// The shards of one split ("train" | "val") listed in `prepared_dir`/manifest.json, in order.
std::vector<std::filesystem::path> list_shards(const std::filesystem::path& prepared_dir, const std::string& split);

// Whether `file_name` is the name of a shard of `split` ("train" | "val") as prepare writes them.
bool is_shard_name(const std::string& file_name, const std::string& split);

// The manifest of a prepared directory (InputError when absent or malformed).
nlohmann::json read_manifest(const std::filesystem::path& prepared_dir);

}  // namespace paraflow::data
