// Question: how fast does our InputPipeline deliver training data compared with tf.data on the
// same shards? Prints records/s and tokens/s side by side and the ratio (target >= 2x tf.data).
//
//   build/bench/pipeline/pipeline_bench [--corpus ../shared/data/sotu.jsonl.gz]
//       [--tokenizer ../shared/data/gpt2] [--data DIR] [--record-tokens 1024] [--epochs 3]
//       [--batch 64] [--seq 1024] [--compression NONE|GZIP|ZLIB] [--repeats 2]
//
// 1. `data prepare` of the corpus with the GPT-2 tokenizer into DIR (once; 1 MB shards, documents
//    cut into records of --record-tokens tokens, as web-text documents are about that long).
// 2. Ours: files -> interleave (cycle 4, autotuned threads) -> parse -> shuffle(10000) -> packing
//    into samples of seq+1 tokens -> global batches of --batch -> prefetch 2, for --epochs.
// 3. tf.data (bench/pipeline/tf_data_pipeline.py in .venv-data): files -> interleave(cycle 4,
//    AUTOTUNE) -> map(parse_single_example, AUTOTUNE) -> shuffle(10000) -> ragged batch -> prefetch,
//    for --epochs, iterated in-graph. It does not pack (packing in tf.data would only slow it).
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <thread>

#include "base/file_io.h"
#include "data/pipeline.h"
#include "data/prepare.h"
#include "machine.h"

namespace fs = std::filesystem;
using namespace paraflow::data;

int main(int argc, char** argv) {
  std::map<std::string, std::string> args = {
      {"corpus", std::string(PARAFLOW_SOURCE_DIR) + "/../shared/data/sotu.jsonl.gz"},
      {"tokenizer", std::string(PARAFLOW_SOURCE_DIR) + "/../shared/data/gpt2"},
      {"data", (fs::temp_directory_path() / "paraflow_pipeline_bench").string()},
      {"record-tokens", "1024"}, {"epochs", "3"}, {"batch", "64"}, {"seq", "1024"},
      {"compression", "NONE"}, {"repeats", "2"},
      {"python", std::string(PARAFLOW_SOURCE_DIR) + "/.venv-data/bin/python"}};
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string key = argv[i];
    if (key.rfind("--", 0) != 0 || !args.count(key.substr(2))) {
      fmt::print(stderr, "unknown option {}\n", key);
      return 2;
    }
    args[key.substr(2)] = argv[i + 1];
  }
  fmt::print("cpu {}\n", paraflow::bench::cpu_model());
  try {
    const Compression compression = parse_compression(args["compression"]);
    fs::path data = fs::path(args["data"]) / args["compression"];
    if (!fs::exists(data / "manifest.json")) {
      PrepareOptions po;
      po.tokenizer = args["tokenizer"];
      po.inputs = {args["corpus"]};
      po.out = data;
      po.shard_bytes = 1 << 20;
      po.record_tokens = std::stoll(args["record-tokens"]);
      po.compression = compression;
      auto t0 = std::chrono::steady_clock::now();
      nlohmann::json m = prepare(po);
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      fmt::print("prepared {}: {} documents, {} tokens, {} train shards in {:.2f} s\n", data.string(),
                 m["documents"].get<int64_t>(), m["tokens"].get<int64_t>(), m["splits"]["train"]["shards"].size(), s);
    }
    auto shards = list_shards(data, "train");
    const int64_t epochs = std::stoll(args["epochs"]);
    const int repeats = std::stoi(args["repeats"]);

    // Ours.
    double best = 1e30;
    PipelineStats stats;
    int64_t batches = 0;
    for (int r = 0; r < repeats; ++r) {
      PipelineOptions o;
      o.global_batch = std::stoll(args["batch"]);
      o.sequence_length = std::stoll(args["seq"]);
      o.seed = 1;
      o.num_epochs = epochs;
      InputPipeline p(shards, o);
      auto t0 = std::chrono::steady_clock::now();
      int64_t k = 0;
      while (p.try_global_batch(k)) ++k;
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (s < best) {
        best = s;
        stats = p.stats();
        batches = k;
      }
    }
    fmt::print("ours:    {:>8} records {:>10} tokens {:>6.3f} s  {:>10.0f} records/s {:>12.0f} tokens/s  "
               "({} batches of {}x{}, final parallelism {}, {} hardware threads)\n",
               stats.records, stats.tokens, best, stats.records / best, stats.tokens / best, batches, args["batch"],
               std::stoll(args["seq"]) + 1, stats.parallelism, std::thread::hardware_concurrency());

    // tf.data.
    std::string files;
    for (const auto& s : shards) files += " '" + s.string() + "'";
    fs::path out = data / "tf_data.json";
    std::string command = fmt::format(
        "'{}' '{}/bench/pipeline/tf_data_pipeline.py' --compression {} --epochs {} --batch {} --repeats {}{} > '{}'",
        args["python"], PARAFLOW_SOURCE_DIR, args["compression"], epochs, args["batch"], repeats, files, out.string());
    if (std::system(command.c_str()) != 0) {
      fmt::print(stderr, "tf.data side failed: {}\n", command);
      return 1;
    }
    auto tf = nlohmann::json::parse(paraflow::read_file(out));
    double tf_s = tf["seconds"].get<double>();
    double tf_records = tf["records"].get<double>(), tf_tokens = tf["tokens"].get<double>();
    fmt::print("tf.data: {:>8} records {:>10} tokens {:>6.3f} s  {:>10.0f} records/s {:>12.0f} tokens/s\n",
               tf["records"].get<int64_t>(), tf["tokens"].get<int64_t>(), tf_s, tf_records / tf_s, tf_tokens / tf_s);
    fmt::print("ratio ours/tf.data: {:.2f}x records/s, {:.2f}x tokens/s\n", (stats.records / best) / (tf_records / tf_s),
               (stats.tokens / best) / (tf_tokens / tf_s));
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
  return 0;
}
