// Question: how fast do we read + parse TFRecord shards of tf.train.Example{input_ids} compared
// with tf.data on the same shards? Prints records/s side by side, per compression.
//
//   build/bench/tfrecord/tfrecord_bench [--records 20000] [--tokens 1025] [--shards 8] [--repeats 3]
//
// Ours runs on one thread: the fast path (decode_int64_feature) and the protobuf path
// (parse_example + int64_feature). tf.data (bench/tfrecord/tf_data_bench.py in .venv-data) runs
// per-record parse_single_example and batched parse_example with AUTOTUNE (all cores).
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <random>

#include "base/file_io.h"
#include "data/example.h"
#include "data/tfrecord.h"
#include "machine.h"

namespace fs = std::filesystem;
using namespace paraflow::data;

namespace {

struct Count {
  uint64_t records = 0, tokens = 0;
  double seconds = 0;
};

template <typename Parse>
Count time_ours(const std::vector<fs::path>& files, Compression compression, int repeats, Parse parse) {
  Count best;
  for (int r = 0; r < repeats; ++r) {
    Count count;
    auto start = std::chrono::steady_clock::now();
    for (const auto& file : files) {
      TFRecordReaderOptions options;
      options.compression = compression;
      TFRecordReader reader(file, options);
      while (auto record = reader.next()) {
        count.tokens += parse(*record);
        ++count.records;
      }
    }
    count.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (r == 0 || count.seconds < best.seconds) best = count;
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  int records = 20000, tokens = 1025, shards = 8, repeats = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i];
    int value = std::atoi(argv[i + 1]);
    if (flag == "--records") records = value;
    else if (flag == "--tokens") tokens = value;
    else if (flag == "--shards") shards = value;
    else if (flag == "--repeats") repeats = value;
    else {
      fmt::print(stderr, "unknown flag {}\n", flag);
      return 2;
    }
  }
  const fs::path dir = fs::temp_directory_path() / fmt::format("paraflow_tfrecord_bench.{}", ::getpid());
  fs::create_directories(dir);
  const char* python_env = std::getenv("PARAFLOW_DATA_PYTHON");
  const std::string python = python_env ? python_env : std::string(PARAFLOW_SOURCE_DIR) + "/.venv-data/bin/python";
  fmt::print("cpu {}\n{} records of {} GPT-2 token ids (uniform in [0, 50257)) in {} shards; best of {}; ours on 1 thread\n\n",
             paraflow::bench::cpu_model(), records, tokens, shards, repeats);
  fmt::print("{:<6} {:>9} | {:>14} {:>14} | {:>14} {:>14} | {:>7} {:>7}\n", "comp", "MB", "ours fast r/s",
             "ours proto r/s", "tf single r/s", "tf batched r/s", "fast/tf", "fast/tfb");
  int status = 0;
  for (Compression compression : {Compression::none, Compression::gzip}) {
    std::mt19937_64 rng(1);
    std::vector<fs::path> files;
    std::vector<int64_t> ids(tokens);
    uint64_t bytes = 0;
    for (int s = 0; s < shards; ++s) {
      files.push_back(dir / fmt::format("shard-{:05d}-of-{:05d}.{}", s, shards, compression_name(compression)));
      TFRecordWriter writer(files.back(), compression);
      for (int r = s; r < records; r += shards) {
        for (auto& id : ids) id = static_cast<int64_t>(rng() % 50257);
        writer.write(make_input_ids_example(ids));
      }
      bytes += writer.offset();
      writer.close();
    }
    std::vector<int64_t> out;
    Count fast = time_ours(files, compression, repeats, [&](std::string_view record) {
      decode_int64_feature(record, "input_ids", out);
      return out.size();
    });
    Count proto = time_ours(files, compression, repeats, [&](std::string_view record) {
      return int64_feature(parse_example(record), "input_ids").size();
    });

    std::string command = fmt::format("'{}' '{}/bench/tfrecord/tf_data_bench.py' --compression {} --repeats {}",
                                      python, PARAFLOW_SOURCE_DIR, compression_name(compression), repeats);
    for (const auto& file : files) command += " '" + file.string() + "'";
    fs::path json_out = dir / "tf.json";
    command += " > '" + json_out.string() + "'";
    double tf_single = 0, tf_batched = 0;
    if (std::system(command.c_str()) != 0) {
      fmt::print(stderr, "tf.data side failed ({}): run scripts/setup_python_data.sh\n", command);
      status = 1;
    } else {
      auto tf = nlohmann::json::parse(paraflow::read_file(json_out));
      for (const char* variant : {"parse_single", "parse_batched"}) {
        if (tf[variant]["tokens"].get<uint64_t>() != fast.tokens) {
          fmt::print(stderr, "token counts differ: tf.data {} {} vs ours {}\n", variant, tf[variant]["tokens"].dump(),
                     fast.tokens);
          status = 1;
        }
      }
      tf_single = tf["parse_single"]["records"].get<double>() / tf["parse_single"]["seconds"].get<double>();
      tf_batched = tf["parse_batched"]["records"].get<double>() / tf["parse_batched"]["seconds"].get<double>();
    }
    double ours_fast = fast.records / fast.seconds, ours_proto = proto.records / proto.seconds;
    fmt::print("{:<6} {:>9.1f} | {:>14.0f} {:>14.0f} | {:>14.0f} {:>14.0f} | {:>6.2f}x {:>6.2f}x\n",
               compression_name(compression), bytes / 1e6, ours_fast, ours_proto, tf_single, tf_batched,
               tf_single > 0 ? ours_fast / tf_single : 0, tf_batched > 0 ? ours_fast / tf_batched : 0);
    std::fflush(stdout);
  }
  fs::remove_all(dir);
  return status;
}
