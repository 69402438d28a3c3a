// Your own text: a .txt file is cut into documents at blank lines (or another separator, or not
// at all), and a corpus of too few documents for a validation split by document is split by
// tokens instead, with a warning naming the numbers (issue 44: a single .txt file gave 0
// validation documents without a word).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>

#include "base/error.h"
#include "base/file_io.h"
#include "data/example.h"
#include "data/prepare.h"
#include "data/tfrecord.h"
#include "data/tokenizer.h"
#include "data/tokenizer_train.h"
#include "expect_error.h"
#include "reference_runner.h"

namespace paraflow::data {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// The documents for_each_document finds in `text` written to a .txt file.
std::vector<std::string> documents_of(const std::string& text, const std::string& separator_flag) {
  testing::TempDir dir;
  write_file_atomic(dir.path() / "in.txt", text);
  std::vector<std::string> documents;
  for_each_document(
      dir.path() / "in.txt", "text", DocumentSeparator::parse(separator_flag),
      [&](std::string_view document) { documents.emplace_back(document); }, [](std::string) { return false; });
  return documents;
}

TEST(TextDocuments, BlankLinesSeparateDocumentsByDefault) {
  // Lines of spaces, tabs or a CR are blank too; a run of blank lines is one separator; a
  // document keeps its inner line breaks but not its last one (nor its CR).
  const std::string text = "\n\nOne, first line\nOne, second line\n\n \t\n\nTwo\r\n\r\nThree\n  indented\n\n\n";
  EXPECT_EQ(documents_of(text, "blank-line"),
            (std::vector<std::string>{"One, first line\nOne, second line", "Two", "Three\n  indented"}));
  EXPECT_EQ(documents_of("no blank line\nat all", "blank-line"), std::vector<std::string>{"no blank line\nat all"});
  EXPECT_TRUE(documents_of(" \n\n\t\n", "blank-line").empty());
}

TEST(TextDocuments, NoneKeepsTheFileWholeAndATextSeparatorCutsAtEachOccurrence) {
  const std::string text = "a\n\nb\n%\nc\n%\n";
  EXPECT_EQ(documents_of(text, "none"), std::vector<std::string>{text});
  // The fortunes files' "%" lines, written with escapes; the piece after the last one is blank.
  EXPECT_EQ(documents_of(text, "\\n%\\n"), (std::vector<std::string>{"a\n\nb", "c"}));
  EXPECT_EQ(documents_of("x<|endoftext|>y<|endoftext|>", "<|endoftext|>"), (std::vector<std::string>{"x", "y"}));
  EXPECT_EQ(DocumentSeparator::parse("\\t\\\\\\r").text, "\t\\\r");
  testing::expect_error<InputError>([] { DocumentSeparator::parse("a\\qb"); },
                                    {"--document-separator 'a\\qb'", "unknown escape '\\q'"});
  testing::expect_error<InputError>([] { DocumentSeparator::parse(""); }, {"--document-separator"});
}

const fs::path& tokenizer_dir() {
  static const testing::TempDir dir;
  static const bool trained = [] {
    BpeTrainOptions options;
    options.vocab_size = 300;
    BpeTrainer trainer(options);
    trainer.add_text("Paragraph number one two three of the story, and the end.");
    trainer.train().save(dir.path());
    return true;
  }();
  (void)trained;
  return dir.path();
}

std::string paragraph(int i) { return fmt::format("Paragraph {} of the story:\nline two of {}.", i, i * 3); }

struct Prepared {
  json manifest;
  std::vector<std::string> log;
  std::vector<int32_t> train, val;  // every token of each split, in order
};

Prepared prepare_paragraphs(int paragraphs, double val_fraction, const fs::path& dir) {
  std::string text;
  for (int i = 0; i < paragraphs; ++i) text += paragraph(i) + "\n\n";
  write_file_atomic(dir / "story.txt", text);
  Prepared result;
  PrepareOptions options;
  options.tokenizer = tokenizer_dir();
  options.inputs = {(dir / "story.txt").string()};
  options.out = dir / "out";
  options.val_fraction = val_fraction;
  options.progress = false;
  options.log = [&](const std::string& message) { result.log.push_back(message); };
  result.manifest = prepare(options);
  for (auto [split, tokens] : {std::pair{"train", &result.train}, std::pair{"val", &result.val}}) {
    for (const fs::path& shard : list_shards(options.out, split)) {
      TFRecordReader reader(shard, {});
      std::string record;
      std::vector<int64_t> ids;
      while (reader.next(record)) {
        decode_int64_feature(record, "input_ids", ids);
        tokens->insert(tokens->end(), ids.begin(), ids.end());
      }
    }
  }
  return result;
}

// 40 paragraphs at --val-fraction 0.05: 2 expected validation documents, fewer than 10. The
// validation split is then the last ceil(5%) of the tokens: train + val, in order, is the
// corpus, every paragraph tokenized and closed by <|endoftext|>.
TEST(PrepareSplit, TooFewDocumentsAreSplitByTokensWithAWarning) {
  testing::TempDir dir;
  const Prepared prepared = prepare_paragraphs(40, 0.05, dir.path());
  const Tokenizer tokenizer = Tokenizer::load(tokenizer_dir());
  std::vector<int32_t> corpus;
  for (int i = 0; i < 40; ++i) {
    for (TokenId id : tokenizer.encode(paragraph(i))) corpus.push_back(id);
    corpus.push_back(tokenizer.eot_id());
  }
  const auto val_tokens = static_cast<int64_t>(std::ceil(0.05 * static_cast<double>(corpus.size())));
  EXPECT_EQ(prepared.manifest["documents"], 40);
  EXPECT_EQ(prepared.manifest["split"]["by"], "tokens");
  EXPECT_EQ(std::ssize(prepared.val), val_tokens);
  EXPECT_EQ(prepared.manifest["splits"]["val"]["tokens"], val_tokens);
  std::vector<int32_t> both = prepared.train;
  both.insert(both.end(), prepared.val.begin(), prepared.val.end());
  EXPECT_EQ(both, corpus);
  ASSERT_EQ(prepared.log.size(), 1u);
  EXPECT_NE(prepared.log[0].find(fmt::format("40 documents are too few to split by document at --val-fraction 0.05 "
                                             "(about 2.0 would be validation, fewer than 10): the validation split "
                                             "is the last {} of the {} tokens",
                                             val_tokens, corpus.size())),
            std::string::npos)
      << prepared.log[0];
}

// 400 paragraphs: 20 expected validation documents, enough: whole documents, by text hash.
TEST(PrepareSplit, EnoughDocumentsAreSplitByDocument) {
  testing::TempDir dir;
  const Prepared prepared = prepare_paragraphs(400, 0.05, dir.path());
  EXPECT_EQ(prepared.manifest["documents"], 400);
  EXPECT_EQ(prepared.manifest["split"]["by"], "documents");
  EXPECT_TRUE(prepared.log.empty());
  const Tokenizer tokenizer = Tokenizer::load(tokenizer_dir());
  const int64_t val_documents = prepared.manifest["splits"]["val"]["documents"];
  EXPECT_GT(val_documents, 5);
  EXPECT_LT(val_documents, 40);
  // Every validation document is whole: the split's tokens end with <|endoftext|>, and so
  // does the train split's.
  EXPECT_EQ(std::count(prepared.val.begin(), prepared.val.end(), tokenizer.eot_id()), val_documents);
  EXPECT_EQ(prepared.val.back(), tokenizer.eot_id());
  EXPECT_EQ(prepared.train.back(), tokenizer.eot_id());
}

// A .txt file is read in chunks that end at document boundaries, tokenized on several threads:
// the documents and the shards are the ones of the file read whole, for each kind of separator
// (a chunk of 1 byte is cut at every boundary, one of 7 at some, one of 4 MiB at none).
TEST(PrepareChunks, TxtFilesCutAtDocumentBoundariesGiveTheSameShards) {
  for (const auto& [flag, separator] : std::vector<std::pair<std::string, std::string>>{
           {"blank-line", "\n \t\r\n\n"}, {"\\n%\\n", "\n%\n"}, {"<|endoftext|>", "<|endoftext|>"}}) {
    SCOPED_TRACE(flag);
    testing::TempDir dir;
    std::string text = "\n";
    for (int i = 0; i < 60; ++i) {
      text += paragraph(i);  // two lines
      if (flag != "blank-line" && i % 4 == 0) text += "\n\n(a blank line inside the document)";
      text += separator;
    }
    write_file_atomic(dir.path() / "corpus.txt", text);
    std::vector<std::string> shards;  // of the first run, to compare
    for (auto [chunk_bytes, threads] : {std::pair{int64_t{4} << 20, 1}, {int64_t{1}, 3}, {int64_t{7}, 2}}) {
      PrepareOptions options;
      options.tokenizer = tokenizer_dir();
      options.inputs = {(dir.path() / "corpus.txt").string()};
      options.out = dir.path() / fmt::format("out{}", chunk_bytes);
      options.separator = DocumentSeparator::parse(flag);
      options.val_fraction = 0.2;
      options.chunk_bytes = chunk_bytes;
      options.threads = threads;
      options.progress = false;
      const json manifest = prepare(options);
      EXPECT_EQ(manifest["documents"], 60);
      EXPECT_EQ(manifest["split"]["by"], "documents");
      std::vector<std::string> these;
      for (const std::string split : {"train", "val"}) {
        for (const fs::path& shard : list_shards(options.out, split)) these.push_back(read_file(shard));
      }
      if (shards.empty()) shards = these;
      EXPECT_EQ(these, shards) << "chunk_bytes " << chunk_bytes;
    }
  }
}

}  // namespace
}  // namespace paraflow::data
