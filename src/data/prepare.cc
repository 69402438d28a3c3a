#include "data/prepare.h"

#include <fmt/format.h>
#include <glob.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <mutex>
#include <numeric>
#include <deque>
#include <optional>
#include <regex>
#include <set>
#include <span>
#include <thread>

#include "base/directory_lock.h"
#include "base/error.h"
#include "base/json.h"
#include "base/file_io.h"
#include "base/progress.h"
#include "data/example.h"
#include "data/tfrecord.h"
#include "data/tokenizer.h"

namespace paraflow::data {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

enum class InputKind { txt, jsonl, jsonl_gz };

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

InputKind input_kind(const fs::path& path) {
  std::string name = path.filename().string();
  if (ends_with(name, ".txt")) return InputKind::txt;
  if (ends_with(name, ".jsonl")) return InputKind::jsonl;
  if (ends_with(name, ".jsonl.gz")) return InputKind::jsonl_gz;
  fail("{}: unknown input kind (want .txt, .jsonl or .jsonl.gz)", path.string());
}

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// FNV-1a over a document's bytes: its split depends on its text alone, so adding, removing or
// fixing other lines or files moves no document between splits, and copies share one split.
uint64_t text_hash(std::string_view text) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : text) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// The split of a document of text hash `hash`: uniform in [0,1) from the seed, compared to F.
bool goes_to_val(uint64_t seed, uint64_t hash, double val_fraction) {
  if (val_fraction <= 0.0) return false;
  uint64_t h = splitmix64(splitmix64(seed) ^ splitmix64(hash));
  return static_cast<double>(h >> 11) * 0x1.0p-53 < val_fraction;
}

struct Document {
  std::vector<TokenId> tokens;  // ends with <|endoftext|>
  uint64_t hash = 0;            // text_hash of its text
};

// A run of one input's bytes, the unit of work: whole documents of a .txt file (ChunkCutter), or
// whole lines of a .jsonl file. The reader cuts the inputs into chunks in order, any worker tokenizes one into its
// documents, and the writer takes them in order again: one file keeps every thread busy, and
// memory holds a bounded number of chunks whatever the file sizes.
struct Chunk {
  size_t input = 0;
  std::string text;
  int64_t first_line = 1;      // the number of its first line (.jsonl)
  bool last = false;           // the input's last chunk (an empty input has one, empty)
  uint64_t input_bytes = 0;    // how far through the input file it takes the progress line
  // Made by the worker that took it (or by the reader, for an input it could not read):
  bool ready = false;
  std::vector<Document> docs;
  std::vector<std::string> skipped;  // "file:line: problem" (policy skip), in order
  int64_t empty_documents = 0;
  std::exception_ptr error;          // the first bad line under policy fail, or any other failure
};

struct Aborted {};  // the writer stopped: the reader waiting to hand a chunk over gives up

std::string describe_type(const json& value) {
  return value.type_name();
}

// The document a .jsonl line holds: true with `text` (a view into `object`), or false with what
// keeps the line from being one in `problem`.
bool document_of_line(std::string_view line, const std::string& text_field, json& object, std::string_view& text,
                      std::string& problem) {
  try {
    object = json::parse(line, json_depth_limit("the line"));
  } catch (const InputError& e) {  // nested too deep
    problem = e.what();
    return false;
  } catch (const json::exception& e) {
    std::string what = e.what();  // "[json.exception.parse_error.101] parse error at line 1, ..."
    size_t cut = what.find("] ");
    problem = fmt::format("invalid JSON ({})", cut == std::string::npos ? what : what.substr(cut + 2));
    return false;
  }
  if (!object.is_object()) {
    problem = fmt::format("a JSON {}, not an object", describe_type(object));
    return false;
  }
  auto it = object.find(text_field);
  if (it == object.end()) {
    problem = fmt::format("no \"{}\" field", text_field);
    return false;
  }
  if (!it->is_string()) {
    problem = fmt::format("field \"{}\" is a {}, not a string", text_field, describe_type(*it));
    return false;
  }
  text = it->get_ref<const std::string&>();
  return true;
}

bool is_blank(std::string_view line) {
  return line.find_first_not_of(" \t\r") == std::string_view::npos;
}

// Where the reader may cut an input into chunks without moving a document boundary: after a
// line of a .jsonl file; after a blank line, or after a separator, of a .txt file. A .txt file
// of one document (separator none) is read whole. Only bytes not searched before are searched.
class ChunkCutter {
 public:
  ChunkCutter(InputKind kind, const DocumentSeparator& separator) : kind_(kind), separator_(separator) {}

  bool reads_whole() const { return kind_ == InputKind::txt && separator_.kind == DocumentSeparator::Kind::none; }

  // The end of the last cut point in `text`, a chunk so far that grew since the last call; npos
  // when there is none yet.
  size_t last_cut(std::string_view text) {
    if (kind_ != InputKind::txt) {
      if (const void* newline = memrchr(text.data() + searched_, '\n', text.size() - searched_)) {
        last_ = static_cast<size_t>(static_cast<const char*>(newline) - text.data()) + 1;
      }
    } else if (separator_.kind == DocumentSeparator::Kind::blank_line) {
      // The last line break in the new bytes that ends a blank line (its line may start before them).
      for (size_t end = text.size(); end > searched_;) {
        const size_t newline = text.rfind('\n', end - 1);
        if (newline == std::string_view::npos || newline < searched_) break;
        const size_t line_start = text.rfind('\n', newline == 0 ? 0 : newline - 1);
        const size_t begin = newline == 0 || line_start == std::string_view::npos ? 0 : line_start + 1;
        if (is_blank(text.substr(begin, newline - begin))) {
          last_ = newline + 1;
          break;
        }
        end = newline;
      }
    } else {
      // Separators left to right from the chunk's start, as for_each_text_document finds them.
      const std::string& separator = separator_.text;
      for (size_t found; (found = text.find(separator, scan_)) != std::string_view::npos;) {
        scan_ = last_ = found + separator.size();
      }
      // No separator starts before the last separator.size() - 1 bytes: they may begin one.
      scan_ = std::max(scan_, text.size() - std::min(text.size(), separator.size() - 1));
    }
    searched_ = text.size();
    return last_;
  }

  // The chunk was cut at `cut` (last_cut's): what follows it is the next chunk, searched already.
  void cut_at(size_t cut) {
    searched_ -= cut;
    scan_ = scan_ >= cut ? scan_ - cut : 0;
    last_ = std::string::npos;
  }

 private:
  InputKind kind_;
  const DocumentSeparator& separator_;
  size_t searched_ = 0, scan_ = 0, last_ = std::string::npos;
};

// Cuts the inputs, in order, into chunks for `emit`: runs of at least `chunk_bytes` ending at a
// ChunkCutter point (a longer document or line makes a larger chunk), or a .txt file of one
// document whole. An input that cannot be read ends the reading with a chunk that carries the
// error. `emit` throws Aborted when the writer has stopped.
template <typename Emit>
void read_chunks(const std::vector<fs::path>& inputs, int64_t chunk_bytes, const DocumentSeparator& separator,
                 Emit&& emit) {
  for (size_t index = 0; index < inputs.size(); ++index) {
    const fs::path& path = inputs[index];
    auto make_chunk = [&] {
      Chunk chunk;
      chunk.input = index;
      return chunk;
    };
    try {
      const InputKind kind = input_kind(path);
      ChunkCutter cutter(kind, separator);
      if (cutter.reads_whole()) {
        Chunk chunk = make_chunk();
        chunk.text = read_file(path);
        chunk.input_bytes = chunk.text.size();
        chunk.last = true;
        emit(std::move(chunk));
        continue;
      }
      auto stream = open_input(path, kind == InputKind::jsonl_gz ? Compression::gzip : Compression::none);
      const bool compressed = kind == InputKind::jsonl_gz;  // its read bytes are not the file's
      // Blocks no larger than a chunk: small chunks (tests) are cut at every point they may be.
      std::string block(static_cast<size_t>(std::min<int64_t>(1 << 20, chunk_bytes)), '\0');
      Chunk chunk = make_chunk();
      for (;;) {
        const size_t got = stream->read(block.data(), block.size());
        if (got == 0) break;
        chunk.text.append(block.data(), got);
        const size_t cut = cutter.last_cut(chunk.text);
        if (chunk.text.size() < static_cast<size_t>(chunk_bytes) || cut == std::string::npos) continue;
        Chunk next = make_chunk();
        next.text = chunk.text.substr(cut);
        chunk.text.resize(cut);
        cutter.cut_at(cut);
        next.first_line = chunk.first_line + std::count(chunk.text.begin(), chunk.text.end(), '\n');
        if (!compressed) chunk.input_bytes = chunk.text.size();
        emit(std::exchange(chunk, std::move(next)));
      }
      chunk.input_bytes = compressed ? fs::file_size(path) : chunk.text.size();
      chunk.last = true;
      emit(std::move(chunk));
    } catch (const Aborted&) {
      throw;
    } catch (...) {
      Chunk failed = make_chunk();
      failed.error = std::current_exception();
      failed.last = failed.ready = true;
      emit(std::move(failed));
      return;
    }
  }
}

// The flag value that gives `separator` (escapes written back for the manifest).
std::string separator_name(const DocumentSeparator& separator) {
  switch (separator.kind) {
    case DocumentSeparator::Kind::blank_line: return "blank-line";
    case DocumentSeparator::Kind::none: return "none";
    case DocumentSeparator::Kind::text: break;
  }
  std::string flag;
  for (char c : separator.text) {
    flag += c == '\n' ? "\\n" : c == '\r' ? "\\r" : c == '\t' ? "\\t" : c == '\\' ? "\\\\" : std::string(1, c);
  }
  return flag;
}

// The documents of a .txt file's `text`, cut as `separator` says (prepare.h).
template <typename OnDocument>
void for_each_text_document(std::string_view text, const DocumentSeparator& separator, OnDocument&& on_document) {
  switch (separator.kind) {
    case DocumentSeparator::Kind::none:
      on_document(text);
      return;
    case DocumentSeparator::Kind::text:
      for (size_t start = 0;;) {
        const size_t end = text.find(separator.text, start);
        const std::string_view piece = text.substr(start, end == std::string_view::npos ? end : end - start);
        if (!is_blank(piece)) on_document(piece);
        if (end == std::string_view::npos) return;
        start = end + separator.text.size();
      }
    case DocumentSeparator::Kind::blank_line: {
      size_t first = std::string_view::npos, last = 0;  // the document's bytes so far: [first, last)
      for (size_t start = 0; start < text.size();) {
        const size_t end = std::min(text.find('\n', start), text.size());
        const std::string_view line = text.substr(start, end - start);
        if (!is_blank(line)) {
          if (first == std::string_view::npos) first = start;
          last = line.back() == '\r' ? end - 1 : end;
        } else if (first != std::string_view::npos) {
          on_document(text.substr(first, last - first));
          first = std::string_view::npos;
        }
        start = end + 1;
      }
      if (first != std::string_view::npos) on_document(text.substr(first, last - first));
      return;
    }
  }
}

// The documents of a chunk of `path`, in order: a .txt file's (for_each_text_document), or the
// `text_field` string of each line of a .jsonl one (blank lines are none). A bad line goes to
// `on_bad_line("file:line: problem")`, which returns whether to go on; returns false when it
// said not to.
template <typename OnDocument, typename OnBadLine>
bool for_each_chunk_document(const Chunk& chunk, const fs::path& path, const std::string& text_field,
                             const DocumentSeparator& separator, OnDocument&& on_document, OnBadLine&& on_bad_line) {
  if (input_kind(path) == InputKind::txt) {
    for_each_text_document(chunk.text, separator, on_document);
    return true;
  }
  json object;
  std::string_view text;
  std::string problem;
  const std::string_view all(chunk.text);
  int64_t number = chunk.first_line;
  for (size_t start = 0; start < all.size(); ++number) {
    const size_t end = std::min(all.find('\n', start), all.size());
    const std::string_view line = all.substr(start, end - start);
    start = end + 1;
    if (is_blank(line)) continue;
    if (document_of_line(line, text_field, object, text, problem)) {
      on_document(text);
    } else if (!on_bad_line(fmt::format("{}:{}: {}", path.string(), number, problem))) {
      return false;
    }
  }
  return true;
}

// Tokenizes a chunk of `path` into its documents (throws InputError on a bad line under policy
// fail).
void tokenize_chunk(Chunk& chunk, const fs::path& path, const Tokenizer& tokenizer, const PrepareOptions& options) {
  const TokenId eot = tokenizer.eot_id();
  for_each_chunk_document(
      chunk, path, options.text_field, options.separator,
      [&](std::string_view text) {
        if (text.empty()) {
          ++chunk.empty_documents;
          return;
        }
        Document doc;
        doc.hash = text_hash(text);
        tokenizer.encode_append(text, doc.tokens, /*allow_special=*/false);
        doc.tokens.push_back(eot);
        chunk.docs.push_back(std::move(doc));
      },
      [&](std::string message) {
        if (options.on_bad_line == BadLinePolicy::fail) throw InputError(message);
        chunk.skipped.push_back(std::move(message));
        return true;
      });
}

std::string shard_suffix(Compression compression) {
  switch (compression) {
    case Compression::gzip: return ".tfrecord.gz";
    case Compression::zlib: return ".tfrecord.zlib";
    default: return ".tfrecord";
  }
}

// Size-bounded shards of one split.
class ShardSet {
 public:
  ShardSet(std::string split, const PrepareOptions& options) : split_(std::move(split)), options_(options) {}

  void write_document(std::span<const int32_t> tokens) {
    ++documents_;
    tokens_ += static_cast<int64_t>(tokens.size());
    for (int32_t t : tokens) max_token_ = std::max<int64_t>(max_token_, t);
    bool first = true;
    for (size_t pos = 0; pos < tokens.size(); pos += static_cast<size_t>(options_.record_tokens)) {
      size_t n = std::min(tokens.size() - pos, static_cast<size_t>(options_.record_tokens));
      ids_.assign(tokens.begin() + static_cast<ptrdiff_t>(pos), tokens.begin() + static_cast<ptrdiff_t>(pos + n));
      std::string record = make_input_ids_example(ids_);
      uint64_t framed = record.size() + kRecordHeaderSize + kRecordFooterSize;
      if (!writer_ || (writer_->records() > 0 && writer_->offset() + framed > static_cast<uint64_t>(options_.shard_bytes))) {
        open_next();
      }
      writer_->write(record);
      ++records_;
      json& shard = shards_.back();
      shard["records"] = shard["records"].get<int64_t>() + 1;
      shard["tokens"] = shard["tokens"].get<int64_t>() + static_cast<int64_t>(n);
      if (first) shard["documents"] = shard["documents"].get<int64_t>() + 1;
      first = false;
    }
  }

  json finish() {
    close_current();
    return json{{"documents", documents_}, {"tokens", tokens_}, {"records", records_},
                {"max_token", max_token_}, {"shards", shards_}};
  }

 private:
  void close_current() {
    if (!writer_) return;
    shards_.back()["bytes"] = writer_->offset();
    writer_->close();
    shards_.back()["file_bytes"] = fs::file_size(writer_->path());
    writer_.reset();
  }
  void open_next() {
    close_current();
    std::string name = fmt::format("{}-{:05}{}", split_, shards_.size(), shard_suffix(options_.compression));
    writer_ = std::make_unique<TFRecordWriter>(options_.out / name, options_.compression);
    shards_.push_back(json{{"file", name}, {"documents", 0}, {"tokens", 0}, {"records", 0}});
  }

  std::string split_;
  const PrepareOptions& options_;
  std::unique_ptr<TFRecordWriter> writer_;
  json shards_ = json::array();
  std::vector<int64_t> ids_;
  int64_t documents_ = 0, tokens_ = 0, records_ = 0, max_token_ = -1;
};

// Sends the documents, in input order, to the splits: by document (goes_to_val) when the
// validation share holds at least kMinValidationDocuments of them, else the last val_fraction of
// the tokens. Which is known once that many documents came, or at the end: until then they are
// held here (at most kMaxHeldTokens tokens: a corpus of fewer but longer documents is split by
// document, with a warning when that leaves the validation split empty).
class Splitter {
 public:
  static constexpr int64_t kMaxHeldTokens = int64_t{1} << 27;  // 512 MiB

  Splitter(const PrepareOptions& options, ShardSet& train, ShardSet& val)
      : options_(options), train_(train), val_(val), holding_(options.val_fraction > 0) {}

  void add(Document&& doc) {
    ++documents_;
    if (!holding_) return write_by_document(doc);
    held_tokens_ += static_cast<int64_t>(doc.tokens.size());
    held_.push_back(std::move(doc));
    if (enough_documents() || held_tokens_ > kMaxHeldTokens) release();
  }

  // The manifest's "split"; `log` gets the warning of a split by tokens.
  json finish(const std::function<void(const std::string&)>& log) {
    if (!holding_) {
      if (options_.val_fraction > 0 && val_documents_ == 0) {
        log(fmt::format("warning: --val-fraction {}: no document went to the validation split ({} documents: too few "
                        "to split by document, and over {} tokens: too many to split by tokens in memory); cut the "
                        "inputs into more documents (--document-separator)",
                        options_.val_fraction, documents_, kMaxHeldTokens));
      }
      return json{{"by", "documents"}};
    }
    const int64_t val_tokens = static_cast<int64_t>(std::ceil(options_.val_fraction * static_cast<double>(held_tokens_)));
    const int64_t train_tokens = held_tokens_ - val_tokens;
    log(fmt::format("warning: {} document{} too few to split by document at --val-fraction {} (about {:.1f} "
                    "would be validation, fewer than {}): the validation split is the last {} of the {} tokens "
                    "instead",
                    documents_, documents_ == 1 ? " is" : "s are", options_.val_fraction,
                    options_.val_fraction * static_cast<double>(documents_),
                    kMinValidationDocuments, val_tokens, held_tokens_));
    int64_t position = 0;  // of the document's first token in the corpus
    for (const Document& doc : held_) {
      const std::span<const int32_t> tokens(doc.tokens);
      const size_t in_train = static_cast<size_t>(std::clamp<int64_t>(train_tokens - position, 0, std::ssize(tokens)));
      if (in_train > 0) train_.write_document(tokens.first(in_train));
      if (in_train < tokens.size()) val_.write_document(tokens.subspan(in_train));
      position += std::ssize(tokens);
    }
    return json{{"by", "tokens"}, {"train_tokens", train_tokens}, {"val_tokens", val_tokens}};
  }

 private:
  bool enough_documents() const {
    return options_.val_fraction * static_cast<double>(documents_) >= kMinValidationDocuments;
  }
  void write_by_document(const Document& doc) {
    const bool to_val = goes_to_val(options_.seed, doc.hash, options_.val_fraction);
    val_documents_ += to_val;
    (to_val ? val_ : train_).write_document(doc.tokens);
  }
  void release() {
    holding_ = false;
    for (const Document& doc : held_) write_by_document(doc);
    std::vector<Document>().swap(held_);
  }

  const PrepareOptions& options_;
  ShardSet &train_, &val_;
  bool holding_;
  std::vector<Document> held_;
  int64_t held_tokens_ = 0, documents_ = 0, val_documents_ = 0;
};

void remove_stale_outputs(const fs::path& out) {
  fs::remove(out / "manifest.json");
  for (const auto& entry : fs::directory_iterator(out)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_regular_file() && (is_shard_name(name, "train") || is_shard_name(name, "val"))) fs::remove(entry.path());
  }
}

}  // namespace

void for_each_document(const fs::path& path, const std::string& text_field, const DocumentSeparator& separator,
                       const std::function<void(std::string_view)>& on_document,
                       const std::function<bool(std::string)>& on_bad_line) {
  // What `data prepare` reads, one chunk at a time: a failure while reading, or one thrown by a
  // callback, ends the reading with an error chunk and is raised here.
  std::exception_ptr error;
  bool go_on = true;
  read_chunks({path}, PrepareOptions{}.chunk_bytes, separator, [&](const Chunk& chunk) {
    if (chunk.error) {
      error = chunk.error;
    } else if (go_on) {
      go_on = for_each_chunk_document(chunk, path, text_field, separator, on_document, on_bad_line);
    }
  });
  if (error) std::rethrow_exception(error);
}

bool is_shard_name(const std::string& file_name, const std::string& split) {
  static const std::regex shard(R"((train|val)-\d{5}\.tfrecord(\.gz|\.zlib)?)");
  std::smatch match;
  return std::regex_match(file_name, match, shard) && match[1] == split;
}

DocumentSeparator DocumentSeparator::parse(std::string_view flag) {
  if (flag == "blank-line") return {};
  if (flag == "none") return {.kind = Kind::none};
  DocumentSeparator separator{.kind = Kind::text};
  for (size_t i = 0; i < flag.size(); ++i) {
    if (flag[i] != '\\' || i + 1 == flag.size()) {
      separator.text += flag[i];
      continue;
    }
    switch (flag[++i]) {
      case 'n': separator.text += '\n'; break;
      case 'r': separator.text += '\r'; break;
      case 't': separator.text += '\t'; break;
      case '\\': separator.text += '\\'; break;
      default: fail("--document-separator '{}': unknown escape '\\{}' (known: \\n \\r \\t \\\\)", flag, flag[i]);
    }
  }
  check(!separator.text.empty(), "--document-separator must not be empty (blank-line, none, or a text)");
  return separator;
}

BadLinePolicy parse_bad_line_policy(std::string_view name) {
  if (name == "fail") return BadLinePolicy::fail;
  if (name == "skip") return BadLinePolicy::skip;
  fail("--on-bad-line: '{}' is not one of fail, skip", name);
}

std::vector<fs::path> expand_inputs(const std::vector<std::string>& patterns) {
  std::set<std::string> seen;
  std::vector<fs::path> files;
  for (const std::string& pattern : patterns) {
    glob_t g{};
    int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
    std::vector<std::string> matches;
    if (rc == 0) {
      for (size_t i = 0; i < g.gl_pathc; ++i) matches.emplace_back(g.gl_pathv[i]);
    }
    globfree(&g);
    if (rc == GLOB_NOMATCH || (rc == 0 && matches.empty())) fail("--input '{}' matches no file", pattern);
    if (rc != 0) throw IoError(fmt::format("--input '{}': glob failed ({})", pattern, rc));
    for (std::string& m : matches) {
      if (!fs::is_regular_file(m)) continue;
      (void)input_kind(m);
      if (seen.insert(m).second) files.emplace_back(m);
    }
  }
  std::sort(files.begin(), files.end());
  check(!files.empty(), "--input: no regular files among the matches");
  return files;
}

json prepare(const PrepareOptions& options) {
  check(options.val_fraction >= 0.0 && options.val_fraction < 1.0, "--val-fraction {} is not in [0, 1)",
        options.val_fraction);
  check(options.shard_bytes > 0, "--shard-mb must be positive");
  check(options.record_tokens > 0, "record_tokens must be positive");
  check(options.chunk_bytes > 0, "chunk_bytes must be positive");
  check(!options.text_field.empty(), "--text-field must not be empty");
  const std::vector<fs::path> inputs = expand_inputs(options.inputs);
  Tokenizer tokenizer = Tokenizer::load(options.tokenizer);
  check(tokenizer.eot_id() >= 0, "{}: the tokenizer has no {} token", options.tokenizer.string(), kEndOfText);
  // Held to the end: a second prepare into the same directory (whose stale-output sweep would
  // delete this one's shards as they are written) is refused, naming this process.
  const DirectoryLock out_lock(options.out, "--out");
  remove_stale_outputs(options.out);

  auto log = options.log ? options.log : [](const std::string& m) { fmt::print(stderr, "{}\n", m); };
  const int threads =
      options.threads > 0 ? options.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const size_t window = static_cast<size_t>(2 * threads + 1);  // chunks read and not yet written

  // The reader thread cuts the inputs into chunks, at most `window` ahead of the writer; the
  // workers tokenize them in any order; the writer (this thread) takes them strictly in order,
  // so the output does not depend on timing or on where the chunks were cut.
  std::deque<Chunk> in_flight;  // in order; references stay valid while others are added or taken
  uint64_t front_sequence = 0, next_work = 0;  // sequence numbers: of in_flight.front(), of the next to tokenize
  bool reading_done = false, abort = false;
  std::mutex mu;
  std::condition_variable changed;
  auto reader = [&] {
    try {
      read_chunks(inputs, options.chunk_bytes, options.separator, [&](Chunk chunk) {
        {
          std::unique_lock lock(mu);
          changed.wait(lock, [&] { return abort || in_flight.size() < window; });
          if (abort) throw Aborted{};
          in_flight.push_back(std::move(chunk));
        }
        changed.notify_all();
      });
    } catch (const Aborted&) {
    }
    {
      std::lock_guard lock(mu);
      reading_done = true;
    }
    changed.notify_all();
  };
  auto worker = [&] {
    for (;;) {
      Chunk* chunk = nullptr;
      {
        std::unique_lock lock(mu);
        changed.wait(lock, [&] { return abort || reading_done || next_work < front_sequence + in_flight.size(); });
        if (abort || next_work == front_sequence + in_flight.size()) return;  // stopped, or read and all taken
        chunk = &in_flight[next_work++ - front_sequence];
        if (chunk->ready) continue;  // the error of an input that could not be read
      }
      try {
        tokenize_chunk(*chunk, inputs[chunk->input], tokenizer, options);
      } catch (...) {
        chunk->error = std::current_exception();
      }
      std::string().swap(chunk->text);  // its tokens wait for the writer, not its text too
      {
        std::lock_guard lock(mu);
        chunk->ready = true;
      }
      changed.notify_all();
    }
  };
  // Everything that may throw before the loop below is set up first: a pool of joinable
  // threads must not be left behind by an exception (std::terminate).
  std::vector<uint64_t> input_bytes;
  for (const auto& p : inputs) input_bytes.push_back(fs::file_size(p));
  const uint64_t total_bytes = std::accumulate(input_bytes.begin(), input_bytes.end(), uint64_t{0});
  constexpr uint64_t kMiB = 1 << 20;
  const long total_mib = static_cast<long>(std::max<uint64_t>(1, (total_bytes + kMiB - 1) / kMiB));
  Progress progress("prepare MiB", total_mib, std::max<long>(1, total_mib / 20));
  auto start = std::chrono::steady_clock::now();

  ShardSet train("train", options), val("val", options);
  Splitter splitter(options, train, val);

  std::vector<std::thread> pool;
  pool.emplace_back(reader);
  for (int i = 0; i < threads; ++i) pool.emplace_back(worker);
  auto stop_pool = [&] {
    {
      std::lock_guard lock(mu);
      abort = true;
    }
    changed.notify_all();
    for (auto& t : pool) t.join();
    pool.clear();
  };

  json input_list = json::array();
  int64_t skipped_lines = 0, empty_documents = 0, documents = 0, tokens = 0;
  int64_t file_documents = 0, file_tokens = 0, file_skipped = 0, file_empty = 0;
  uint64_t done_bytes = 0, file_done_bytes = 0;
  long shown_mib = -1;
  try {
    for (size_t finished_inputs = 0; finished_inputs < inputs.size();) {
      Chunk chunk;
      {
        std::unique_lock lock(mu);
        changed.wait(lock, [&] { return !in_flight.empty() && in_flight.front().ready; });
        chunk = std::move(in_flight.front());
        in_flight.pop_front();
        ++front_sequence;
        // An input's error chunk is ready when read: the writer may take it before any worker
        // has passed it.
        next_work = std::max(next_work, front_sequence);
      }
      changed.notify_all();
      if (chunk.error) std::rethrow_exception(chunk.error);
      for (Document& doc : chunk.docs) {
        file_tokens += static_cast<int64_t>(doc.tokens.size());
        splitter.add(std::move(doc));
      }
      for (const auto& message : chunk.skipped) log(message);
      file_documents += static_cast<int64_t>(chunk.docs.size());
      file_skipped += static_cast<int64_t>(chunk.skipped.size());
      file_empty += chunk.empty_documents;
      file_done_bytes += chunk.input_bytes;
      if (chunk.last) {
        const uint64_t file_bytes = input_bytes[chunk.input];
        skipped_lines += file_skipped;
        empty_documents += file_empty;
        documents += file_documents;
        tokens += file_tokens;
        input_list.push_back(json{{"path", inputs[chunk.input].string()},
                                  {"bytes", file_bytes},
                                  {"documents", file_documents},
                                  {"tokens", file_tokens},
                                  {"skipped_lines", file_skipped},
                                  {"empty_documents", file_empty}});
        file_documents = file_tokens = file_skipped = file_empty = 0;
        file_done_bytes = 0;
        done_bytes += file_bytes;
        ++finished_inputs;
      }
      const long done_mib = static_cast<long>(
          finished_inputs == inputs.size() ? total_mib : (done_bytes + std::min(file_done_bytes, total_bytes)) / kMiB);
      if (options.progress && done_mib != shown_mib) {
        shown_mib = done_mib;
        double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        const double done_mb = static_cast<double>(done_bytes + file_done_bytes) / 1e6;
        progress.update(done_mib, fmt::format("files {}/{} | docs {} | tokens {} | {:.1f} MB/s", finished_inputs,
                                              inputs.size(), documents + file_documents, tokens + file_tokens,
                                              done_mb / std::max(seconds, 1e-9)));
      }
    }
  } catch (...) {
    stop_pool();
    throw;
  }
  stop_pool();
  if (options.progress) progress.finish();
  json split = splitter.finish(log);

  json manifest = {
      {"format", "paraflow.prepare/1"},
      {"tokenizer",
       {{"path", options.tokenizer.string()},
        {"fingerprint", tokenizer.fingerprint()},
        {"vocab_size", tokenizer.vocab_size()},
        {"eot_id", tokenizer.eot_id()}}},
      {"options",
       {{"val_fraction", options.val_fraction},
        {"seed", options.seed},
        {"text_field", options.text_field},
        {"document_separator", separator_name(options.separator)},
        {"shard_bytes", options.shard_bytes},
        {"record_tokens", options.record_tokens},
        {"compression", std::string(compression_name(options.compression))},
        {"on_bad_line", options.on_bad_line == BadLinePolicy::fail ? "fail" : "skip"}}},
      {"inputs", input_list},
      {"documents", documents},
      {"tokens", tokens},
      {"skipped_lines", skipped_lines},
      {"empty_documents", empty_documents},
      {"split", split},
      {"splits", {{"train", train.finish()}, {"val", val.finish()}}},
  };
  write_file_atomic(options.out / "manifest.json", manifest.dump(2) + "\n");
  return manifest;
}

json read_manifest(const fs::path& prepared_dir) {
  fs::path path = prepared_dir / "manifest.json";
  check(fs::exists(path), "{}: no manifest.json (run `paraflow data prepare` first)", prepared_dir.string());
  json manifest = json::parse(read_file(path), json_depth_limit(path.string()), false);
  check(!manifest.is_discarded() && manifest.is_object() && manifest.contains("splits"),
        "{}: not a paraflow data manifest", path.string());
  return manifest;
}

std::vector<fs::path> list_shards(const fs::path& prepared_dir, const std::string& split) {
  check(split == "train" || split == "val", "split '{}' is not one of train, val", split);
  json manifest = read_manifest(prepared_dir);
  const std::string where = (prepared_dir / "manifest.json").string();
  const json& splits = manifest["splits"];
  check(splits.is_object() && splits.contains(split) && splits[split].is_object(), "{}: splits has no '{}' split",
        where, split);
  const json& listed = splits[split].value("shards", json());
  check(listed.is_array(), "{}: splits.{}.shards must be a list", where, split);
  std::vector<fs::path> shards;
  for (size_t i = 0; i < listed.size(); ++i) {
    const json& shard = listed[i];
    check(shard.is_object() && shard.contains("file") && shard["file"].is_string(),
          "{}: splits.{}.shards[{}] has no string 'file'", where, split, i);
    fs::path path = prepared_dir / shard["file"].get<std::string>();
    check(fs::exists(path), "{}: listed in the manifest but missing", path.string());
    shards.push_back(path);
  }
  return shards;
}

}  // namespace paraflow::data
