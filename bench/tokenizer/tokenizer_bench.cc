// Question: how fast does paraflow's BPE encode real text, on one thread and on all, and how long
// does training an 8k vocabulary take? Prints one JSON object (bench/tokenizer_bench.py runs it
// next to tiktoken and tokenizers).
//
//   tokenizer_bench --corpus sotu.jsonl.gz --vocab gpt2.tiktoken|DIR [--repeats 5] [--train-vocab 8192]
//                   [--ids-out FILE]   (all documents' ids, int32 little-endian, for comparison)
//                   [--train-out DIR]  (the trained tokenizer's files, and DIR/corpus.ids: its ids)
#include <nlohmann/json.hpp>
#include <zlib.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "base/file_io.h"
#include "data/tokenizer.h"
#include "data/tokenizer_train.h"
#include "machine.h"

using namespace paraflow;
using namespace paraflow::data;
using Clock = std::chrono::steady_clock;

namespace {

std::string read_gzip(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  check(f != nullptr, "{}: cannot open", path);
  std::string out;
  char buffer[1 << 16];
  int n;
  while ((n = gzread(f, buffer, sizeof buffer)) > 0) out.append(buffer, static_cast<size_t>(n));
  gzclose(f);
  check(n == 0, "{}: gzip read error", path);
  return out;
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  std::string corpus, vocab, ids_out, train_out;
  int repeats = 5, train_vocab = 8192;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i];
    if (flag == "--corpus") corpus = argv[i + 1];
    else if (flag == "--vocab") vocab = argv[i + 1];
    else if (flag == "--repeats") repeats = std::stoi(argv[i + 1]);
    else if (flag == "--ids-out") ids_out = argv[i + 1];
    else if (flag == "--train-out") train_out = argv[i + 1];
    else if (flag == "--train-vocab") train_vocab = std::stoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  if (corpus.empty() || vocab.empty()) {
    std::fprintf(stderr, "usage: tokenizer_bench --corpus FILE.jsonl.gz --vocab FILE.tiktoken|DIR\n");
    return 2;
  }
  try {
    std::vector<std::string> texts;
    std::string raw = read_gzip(corpus);
    size_t bytes = 0;
    for (size_t pos = 0; pos < raw.size();) {
      size_t eol = raw.find('\n', pos);
      if (eol == std::string::npos) eol = raw.size();
      if (eol > pos) {
        texts.push_back(nlohmann::json::parse(raw.substr(pos, eol - pos))["text"].get<std::string>());
        bytes += texts.back().size();
      }
      pos = eol + 1;
    }
    std::vector<std::string_view> views(texts.begin(), texts.end());
    const double mb = static_cast<double>(bytes) / 1e6;

    nlohmann::json out;
    out["cpu"] = bench::cpu_model();
    out["documents"] = texts.size();
    out["bytes"] = bytes;
    out["threads"] = std::thread::hardware_concurrency();

    // Encoding: a fresh tokenizer per measurement, so its word cache starts cold every time.
    auto load = [&] {
      return vocab.ends_with(".tiktoken") ? Tokenizer::load_tiktoken(vocab) : Tokenizer::load(vocab);
    };
    auto t0 = Clock::now();
    Tokenizer probe = load();
    out["load_s"] = seconds_since(t0);
    size_t tokens = 0;
    std::string all_ids;
    for (const auto& t : texts) {
      std::vector<TokenId> ids = probe.encode(t);
      tokens += ids.size();
      all_ids.append(reinterpret_cast<const char*>(ids.data()), ids.size() * sizeof(TokenId));
    }
    if (!ids_out.empty()) write_file_atomic(ids_out, all_ids);
    out["tokens"] = tokens;
    out["fingerprint"] = probe.fingerprint();

    std::vector<double> single, batch, chunked;
    for (int r = 0; r < repeats; ++r) {
      Tokenizer tok = load();
      auto start = Clock::now();
      size_t n = 0;
      for (const auto& t : texts) n += tok.encode(t).size();
      single.push_back(mb / seconds_since(start));
      Tokenizer tok2 = load();
      start = Clock::now();
      auto ids = tok2.encode_batch(views, 0);
      batch.push_back(mb / seconds_since(start));
      (void)n;
      (void)ids;
    }
    std::sort(single.begin(), single.end());
    std::sort(batch.begin(), batch.end());
    out["encode_1thread_MBps_median"] = single[single.size() / 2];
    out["encode_1thread_MBps_best"] = single.back();
    out["encode_batch_all_threads_MBps_median"] = batch[batch.size() / 2];
    out["encode_batch_all_threads_MBps_best"] = batch.back();

    // Training an 8k vocabulary on the same corpus.
    BpeTrainOptions options;
    options.vocab_size = train_vocab;
    auto start = Clock::now();
    BpeTrainer trainer(options);
    trainer.add_texts(views);
    double count_s = seconds_since(start);
    Tokenizer trained = trainer.train();
    out["train_vocab_size"] = trained.vocab_size();
    out["train_distinct_words"] = trainer.distinct_words();
    out["train_count_words_s"] = count_s;
    out["train_total_s"] = seconds_since(start);
    if (!train_out.empty()) {
      trained.save(train_out);
      std::string ids_bytes;
      for (const auto& t : texts) {
        std::vector<TokenId> ids = trained.encode(t);
        ids_bytes.append(reinterpret_cast<const char*>(ids.data()), ids.size() * sizeof(TokenId));
      }
      write_file_atomic(std::filesystem::path(train_out) / "corpus.ids", ids_bytes);
    }
    std::printf("%s\n", out.dump().c_str());
  } catch (const Error& e) {
    std::fprintf(stderr, "tokenizer_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
