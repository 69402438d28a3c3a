// `data prepare`: output identical for any thread count, manifest counts equal to what the shards
// hold, every document back (decoded) in its split, bad lines reported as file:line under fail
// and skip, and TensorFlow's tf.data reading our shards (tests/reference/tf_pipeline.py in
// .venv-data; without it the interop test FAILS, it never skips). Then the pipeline over them.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "reference_runner.h"
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <set>

#include "base/directory_lock.h"
#include "base/error.h"
#include "base/file_io.h"
#include "data/example.h"
#include "data/pipeline.h"
#include "data/prepare.h"
#include "data/tfrecord.h"
#include "data/tokenizer.h"
#include "data/tokenizer_train.h"

namespace paraflow::data {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

using testing::source_dir;

fs::path temp_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / fmt::format("paraflow_prepare_test.{}", ::getpid()) / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

void write_text(const fs::path& path, const std::string& text, Compression compression = Compression::none) {
  auto out = open_output(path, compression);
  out->write(text.data(), text.size());
  out->close();
}

std::string document(int i) {
  std::string text = fmt::format("Document {}: the quick brown fox jumps over the lazy dog {} times.", i, i * 7);
  if (i % 5 == 0) {  // long ones, cut into several records
    for (int k = 0; k < 40; ++k) text += fmt::format(" Sentence {} of a long document, it's {}!", k, i);
  }
  if (i % 7 == 0) text += "\nA second line with <|endoftext|> as plain text\t and unicode: héllo 世界 🙂";
  return text;
}

// A corpus of .txt, .jsonl and .jsonl.gz files, and the documents in input (sorted path) order.
struct Corpus {
  fs::path dir;
  std::vector<std::string> docs;
};

Corpus make_corpus() {
  Corpus c;
  c.dir = temp_dir("corpus");
  int next = 0;
  for (int f = 0; f < 3; ++f) {  // a.jsonl, b.jsonl.gz, c.jsonl
    std::string name = f == 0 ? "a.jsonl" : f == 1 ? "b.jsonl.gz" : "c.jsonl";
    std::string content;
    for (int d = 0; d < 25; ++d) {
      std::string text = document(next++);
      content += json{{"id", d}, {"text", text}}.dump() + "\n";
      if (d == 3) content += "\n";  // a blank line is not a document
      c.docs.push_back(text);
    }
    write_text(c.dir / name, content, f == 1 ? Compression::gzip : Compression::none);
  }
  for (int f = 0; f < 4; ++f) {  // d0.txt .. d3.txt, two documents each: blank lines separate them
    std::string text = document(next++);
    write_text(c.dir / fmt::format("d{}.txt", f), text + "\n\nwith paragraphs\n");
    c.docs.push_back(text);
    c.docs.push_back("with paragraphs");
  }
  return c;
}

const fs::path& tokenizer_dir() {
  static const fs::path dir = [] {
    std::string text;
    for (int i = 0; i < 60; ++i) text += document(i) + " ";
    BpeTrainOptions options;
    options.vocab_size = 500;
    BpeTrainer trainer(options);
    trainer.add_text(text);
    fs::path d = temp_dir("tokenizer");
    trainer.train().save(d);
    return d;
  }();
  return dir;
}

PrepareOptions options_for(const Corpus& c, const std::string& out, int threads) {
  PrepareOptions o;
  o.tokenizer = tokenizer_dir();
  o.inputs = {(c.dir / "*.jsonl").string(), (c.dir / "*.jsonl.gz").string(), (c.dir / "d*.txt").string()};
  o.out = temp_dir(out);
  o.val_fraction = 0.2;
  o.shard_bytes = 3000;   // several shards per split
  o.record_tokens = 64;   // long documents span several records
  o.seed = 5;
  o.threads = threads;
  o.progress = false;
  return o;
}

// Every record of a file as token ids.
std::vector<std::vector<int64_t>> read_records(const fs::path& path, Compression compression) {
  TFRecordReaderOptions ro;
  ro.compression = compression;
  TFRecordReader reader(path, ro);
  std::vector<std::vector<int64_t>> out;
  std::string record;
  while (reader.next(record)) {
    out.emplace_back();
    decode_int64_feature(record, "input_ids", out.back());
  }
  return out;
}

TEST(Prepare, DeterministicForAnyThreadCountAndCountsMatch) {
  Corpus c = make_corpus();
  PrepareOptions o1 = options_for(c, "out1", 1), o4 = options_for(c, "out4", 4);
  // Files cut into chunks of a line or two (at least 100 bytes: most lines are shorter), tokenized
  // on three threads in any order, the writer holding the reader back (7 chunks in flight): the
  // same output; and with every line a chunk of its own.
  PrepareOptions chunked = options_for(c, "out_chunked", 3), line_by_line = options_for(c, "out_lines", 2);
  chunked.chunk_bytes = 100;
  line_by_line.chunk_bytes = 1;
  json m1 = prepare(o1);
  for (const PrepareOptions* other : {&o4, &chunked, &line_by_line}) {
    json m = prepare(*other);
    // Same manifest except the output-independent fields, and byte-identical shards.
    EXPECT_EQ(m1["splits"], m["splits"]);
    EXPECT_EQ(m1["inputs"], m["inputs"]);
    for (const std::string split : {"train", "val"}) {
      auto s1 = list_shards(o1.out, split);
      auto s = list_shards(other->out, split);
      ASSERT_EQ(s1.size(), s.size());
      for (size_t i = 0; i < s1.size(); ++i) EXPECT_EQ(read_file(s1[i]), read_file(s[i])) << s1[i];
    }
  }
  // Counts: every document once; tokens and records as the shards hold them.
  EXPECT_EQ(m1["documents"].get<size_t>(), c.docs.size());
  EXPECT_EQ(m1["skipped_lines"], 0);
  EXPECT_EQ(m1["inputs"].size(), 7u);
  Tokenizer tok = Tokenizer::load(tokenizer_dir());
  EXPECT_EQ(m1["tokenizer"]["fingerprint"], tok.fingerprint());
  const fs::path& out1 = o1.out;
  std::vector<std::string> decoded_all;
  int64_t docs = 0, tokens = 0;
  for (const std::string split : {"train", "val"}) {
    const json& s = m1["splits"][split];
    EXPECT_GT(s["documents"].get<int64_t>(), 0) << split;
    EXPECT_GT(s["shards"].size(), 1u) << split;
    int64_t split_tokens = 0, split_records = 0, max_token = -1;
    std::vector<int32_t> stream;
    for (const json& shard : s["shards"]) {
      auto records = read_records(out1 / shard["file"].get<std::string>(), Compression::none);
      int64_t shard_tokens = 0;
      for (const auto& r : records) {
        shard_tokens += static_cast<int64_t>(r.size());
        EXPECT_LE(r.size(), 64u);
        for (int64_t t : r) {
          stream.push_back(static_cast<int32_t>(t));
          max_token = std::max(max_token, t);
        }
      }
      EXPECT_EQ(shard["records"].get<size_t>(), records.size());
      EXPECT_EQ(shard["tokens"].get<int64_t>(), shard_tokens);
      EXPECT_LE(shard["bytes"].get<int64_t>(), 3000);
      split_tokens += shard_tokens;
      split_records += static_cast<int64_t>(records.size());
    }
    EXPECT_EQ(s["tokens"].get<int64_t>(), split_tokens);
    EXPECT_EQ(s["records"].get<int64_t>(), split_records);
    EXPECT_EQ(s["max_token"].get<int64_t>(), max_token);
    // Decoded, the split is its documents, each closed by <|endoftext|>.
    std::vector<int32_t> doc;
    for (int32_t t : stream) {
      if (t == tok.eot_id()) {
        decoded_all.push_back(tok.decode(doc));
        doc.clear();
      } else {
        doc.push_back(t);
      }
    }
    EXPECT_TRUE(doc.empty());
    docs += s["documents"].get<int64_t>();
    tokens += split_tokens;
  }
  EXPECT_EQ(docs, static_cast<int64_t>(c.docs.size()));
  EXPECT_EQ(tokens, m1["tokens"].get<int64_t>());
  std::sort(decoded_all.begin(), decoded_all.end());
  std::vector<std::string> expect = c.docs;
  std::sort(expect.begin(), expect.end());
  EXPECT_EQ(decoded_all, expect);

  // Another seed: another split.
  PrepareOptions other = options_for(c, "out_seed", 1);
  other.seed = 6;
  EXPECT_NE(prepare(other)["splits"]["val"]["tokens"], m1["splits"]["val"]["tokens"]);
}

TEST(Prepare, BadLinesFailOrAreSkippedWithFileAndLine) {
  fs::path dir = temp_dir("bad");
  write_text(dir / "bad.jsonl",
             "{\"text\": \"fine one\"}\n"
             "{\"text\": \"fine two\"}\n"
             "{\"text\": \"broken\n"
             "{\"text\": \"fine three\"}\n"
             "{\"body\": \"no text field\"}\n"
             "{\"text\": 42}\n"
             "[1, 2]\n"
             "{\"text\": \"fine four\"}\n");
  std::string where = (dir / "bad.jsonl").string();
  // Read whole, or a line or two per chunk on two threads (a later chunk's bad line may be
  // found first): the same first bad line, the same numbers.
  for (int64_t chunk_bytes : {int64_t{4} << 20, int64_t{30}}) {
    SCOPED_TRACE(fmt::format("chunk_bytes {}", chunk_bytes));
    PrepareOptions o;
    o.tokenizer = tokenizer_dir();
    o.inputs = {(dir / "*.jsonl").string()};
    o.out = dir / "out";
    o.progress = false;
    o.threads = 2;
    o.chunk_bytes = chunk_bytes;
    try {
      prepare(o);
      FAIL() << "a bad line did not fail";
    } catch (const InputError& e) {
      EXPECT_EQ(std::string(e.what()).rfind(where + ":3: invalid JSON", 0), 0u) << e.what();
    }
    EXPECT_FALSE(fs::exists(o.out / "manifest.json"));
    std::vector<std::string> logged;
    o.on_bad_line = BadLinePolicy::skip;
    o.log = [&](const std::string& m) { logged.push_back(m); };
    json m = prepare(o);
    EXPECT_EQ(m["skipped_lines"], 4);
    EXPECT_EQ(m["inputs"][0]["skipped_lines"], 4);
    EXPECT_EQ(m["documents"], 4);
    ASSERT_EQ(logged.size(), 4u);
    EXPECT_EQ(logged[0].rfind(where + ":3: invalid JSON", 0), 0u) << logged[0];
    EXPECT_EQ(logged[1], where + ":5: no \"text\" field");
    EXPECT_EQ(logged[2], where + ":6: field \"text\" is a number, not a string");
    EXPECT_EQ(logged[3], where + ":7: a JSON array, not an object");
  }
  PrepareOptions o;
  o.tokenizer = tokenizer_dir();
  o.inputs = {(dir / "*.jsonl").string()};
  o.out = dir / "out";
  o.progress = false;
  // Other text field.
  o.text_field = "body";
  o.on_bad_line = BadLinePolicy::skip;
  EXPECT_EQ(prepare(o)["documents"], 1);
}

// A document's split follows its text: fixing a bad line, or adding a file that sorts first,
// moves no other document between train and val. (Keyed by position, it moved every document
// after the change.)
TEST(Prepare, ADocumentKeepsItsSplitWhenOtherLinesChange) {
  fs::path dir = temp_dir("stable_split");
  std::string before, after;
  for (int i = 0; i < 40; ++i) {
    const std::string line = json{{"text", fmt::format("document number {} of forty", i)}}.dump() + "\n";
    before += line;
    after += line;
    if (i == 10) before += "{\"text\": broken\n";  // skipped, then removed
  }
  fs::create_directories(dir / "one");
  fs::create_directories(dir / "two");
  write_text(dir / "one" / "b.jsonl", before);
  write_text(dir / "two" / "b.jsonl", after);
  write_text(dir / "two" / "a.jsonl", json{{"text", "a new file sorted first"}}.dump() + "\n");
  // The val split's documents, decoded.
  auto val_texts = [&](const std::string& name) {
    PrepareOptions o;
    o.tokenizer = tokenizer_dir();
    o.inputs = {(dir / name / "*.jsonl").string()};
    o.out = dir / (name + "_out");
    o.val_fraction = 0.5;
    o.seed = 3;
    o.progress = false;
    o.on_bad_line = BadLinePolicy::skip;
    prepare(o);
    const Tokenizer tokenizer = Tokenizer::load(tokenizer_dir());
    std::set<std::string> texts;
    for (const fs::path& shard : list_shards(o.out, "val")) {
      for (const auto& record : read_records(shard, Compression::none)) {
        texts.insert(tokenizer.decode(std::vector<TokenId>(record.begin(), record.end() - 1)));
      }
    }
    return texts;
  };
  std::set<std::string> one = val_texts("one"), two = val_texts("two");
  two.erase("a new file sorted first");
  EXPECT_GT(one.size(), 5u);
  EXPECT_LT(one.size(), 35u);
  EXPECT_EQ(one, two);
}

TEST(Prepare, InputErrors) {
  PrepareOptions o;
  o.tokenizer = tokenizer_dir();
  fs::path dir = temp_dir("errors");
  o.out = dir / "out";
  o.progress = false;
  o.inputs = {(dir / "nothing*.jsonl").string()};
  EXPECT_THROW(prepare(o), InputError);
  write_text(dir / "x.csv", "a,b\n");
  o.inputs = {(dir / "x.csv").string()};
  EXPECT_THROW(prepare(o), InputError);
  EXPECT_THROW(list_shards(dir, "train"), InputError);
  EXPECT_THROW(parse_bad_line_policy("ignore"), InputError);
  // A second prepare into a directory being written (here, held by this test) is refused, naming
  // the holder; nothing of the first is touched.
  {
    write_text(dir / "one.jsonl", "{\"text\": \"a document\"}\n");
    PrepareOptions busy = o;
    busy.inputs = {(dir / "one.jsonl").string()};
    busy.out = dir / "busy";
    const DirectoryLock held(busy.out);
    write_text(busy.out / "train-00000.tfrecord", "being written");
    try {
      prepare(busy);
      ADD_FAILURE() << "a second prepare into a locked directory went ahead";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("is in use by process " + std::to_string(::getpid())), std::string::npos)
          << e.what();
    }
    EXPECT_EQ(read_file(busy.out / "train-00000.tfrecord"), "being written");
  }
  // A .jsonl.gz cut short, read in small chunks after a good file: refused naming it, nothing
  // written.
  std::string lines;
  for (int i = 0; i < 2000; ++i) lines += json{{"text", document(i)}}.dump() + "\n";
  write_text(dir / "a.jsonl", lines);
  write_text(dir / "b.jsonl.gz", lines, Compression::gzip);
  const std::string gzipped = read_file(dir / "b.jsonl.gz");
  write_text(dir / "b.jsonl.gz", gzipped.substr(0, gzipped.size() / 2));
  o.inputs = {(dir / "*.jsonl*").string()};
  o.chunk_bytes = 1000;
  try {
    prepare(o);
    ADD_FAILURE() << "a truncated input was taken";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find((dir / "b.jsonl.gz").string() + ": GZIP stream truncated"), std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(fs::exists(o.out / "manifest.json"));
  // A manifest of another shape is refused naming it and the field, not with a JSON type error.
  const std::string manifest = (dir / "manifest.json").string();
  for (const auto& [text, field] : std::vector<std::pair<std::string, std::string>>{
           {R"({"splits": {"train": {"shards": [{"name": "x"}]}}})", "splits.train.shards[0] has no string 'file'"},
           {R"({"splits": {"train": {"shards": {}}}})", "splits.train.shards must be a list"},
           {R"({"splits": []})", "splits has no 'train' split"},
           {R"({"splits": {"val": {"shards": []}}})", "splits has no 'train' split"}}) {
    write_text(dir / "manifest.json", text);
    try {
      list_shards(dir, "train");
      ADD_FAILURE() << text;
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(manifest + ": " + field), std::string::npos) << e.what();
    }
  }
}

// Runs tests/reference/tf_pipeline.py; false (and a test failure) without the interpreter.
bool run_oracle(const std::string& args, const fs::path& out) {
  const char* env = std::getenv("PARAFLOW_DATA_PYTHON");
  fs::path python = env ? fs::path(env) : source_dir() / ".venv-data/bin/python";
  if (::access(python.c_str(), X_OK) != 0) {
    ADD_FAILURE() << "no oracle interpreter at " << python << ": run scripts/setup_python_data.sh";
    return false;
  }
  fs::path err = out.string() + ".stderr";
  std::string command = fmt::format("'{}' '{}' {} > '{}' 2> '{}'", python.string(),
                                    (source_dir() / "tests/reference/tf_pipeline.py").string(), args, out.string(),
                                    err.string());
  int rc = std::system(command.c_str());
  if (rc != 0) {
    ADD_FAILURE() << command << "\nexit " << rc << "\n" << read_file(err);
    return false;
  }
  return true;
}

TEST(PrepareInterop, TensorFlowReadsOurShards) {
  Corpus c = make_corpus();
  for (Compression compression : {Compression::none, Compression::gzip, Compression::zlib}) {
    std::string cname(compression_name(compression));
    PrepareOptions o = options_for(c, "tf_" + cname, 2);
    o.compression = compression;
    json m = prepare(o);
    std::string args = "--compression " + cname;
    std::map<std::string, json> ours;
    for (const std::string split : {"train", "val"}) {
      for (const json& shard : m["splits"][split]["shards"]) {
        std::string name = shard["file"].get<std::string>();
        args += fmt::format(" '{}'", (o.out / name).string());
        auto records = read_records(o.out / name, compression);
        uint64_t checksum = 0;
        int64_t tokens = 0, max_token = -1;
        for (size_t j = 0; j < records.size(); ++j) {
          uint64_t sum = 0;
          for (size_t i = 0; i < records[j].size(); ++i) {
            sum += static_cast<uint64_t>(records[j][i]) * (i + 1);
            max_token = std::max(max_token, records[j][i]);
          }
          checksum += sum * (j + 1);
          tokens += static_cast<int64_t>(records[j].size());
        }
        EXPECT_EQ(shard["tokens"].get<int64_t>(), tokens);
        ours[name] = json{{"records", records.size()}, {"tokens", tokens}, {"max_token", max_token},
                          {"checksum", std::to_string(checksum)}};
      }
    }
    fs::path out = o.out / "oracle.json";
    if (!run_oracle(args, out)) return;
    json theirs = json::parse(read_file(out));
    ASSERT_EQ(theirs.size(), ours.size()) << cname;
    for (const auto& [name, expect] : ours) {
      EXPECT_EQ(theirs[name], expect) << cname << " " << name;
    }
  }
}

TEST(PrepareThenPipeline, ShardsFeedThePipeline) {
  Corpus c = make_corpus();
  PrepareOptions o = options_for(c, "feed", 2);
  o.compression = Compression::gzip;
  json m = prepare(o);
  auto shards = list_shards(o.out, "train");
  ASSERT_EQ(shards.size(), m["splits"]["train"]["shards"].size());
  PipelineOptions po;
  po.global_batch = 4;
  po.sequence_length = 32;
  po.seed = 1;
  po.num_epochs = 1;
  po.vocab_size = m["tokenizer"]["vocab_size"].get<int64_t>();
  InputPipeline p(shards, po);
  EXPECT_EQ(p.max_token(), m["splits"]["train"]["max_token"].get<int32_t>());
  int64_t batches = 0;
  while (p.try_global_batch(batches)) ++batches;
  const int64_t tokens = m["splits"]["train"]["tokens"].get<int64_t>();
  EXPECT_EQ(batches, (tokens - 1) / 32 / 4);
}

}  // namespace
}  // namespace paraflow::data
