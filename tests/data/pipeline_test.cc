// Input pipeline: the order against a slow, obvious reference (interleave + packing), independence
// from thread counts, exact resume from state() (mid-epoch and across epoch boundaries, also on
// compressed shards), autotune, file-level auto-shard coverage, rank slices, errors.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <set>
#include <thread>

#include "base/error.h"
#include "data/example.h"
#include "data/pipeline.h"
#include "data/tfrecord.h"

namespace paraflow::data {
namespace {

namespace fs = std::filesystem;
using Tokens = std::vector<int32_t>;

fs::path temp_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / fmt::format("paraflow_pipeline_test.{}", ::getpid()) / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// Shards whose records hold globally unique tokens: record d of file f is
// [(f·1000 + d)·100, ... + len) with len in 3..62 (varied, so samples straddle records).
struct Corpus {
  std::vector<fs::path> files;
  std::vector<std::vector<Tokens>> records;  // [file][record]
  int64_t tokens = 0;
};

Corpus make_corpus(const std::string& name, int num_files, int records_per_file, Compression compression = Compression::none,
                   int uneven = 0) {
  Corpus c;
  fs::path dir = temp_dir(name);
  std::string ext = compression == Compression::gzip ? ".tfrecord.gz" : compression == Compression::zlib ? ".tfrecord.zlib" : ".tfrecord";
  for (int f = 0; f < num_files; ++f) {
    fs::path path = dir / fmt::format("train-{:05}{}", f, ext);
    TFRecordWriter writer(path, compression);
    std::vector<Tokens> recs;
    int count = records_per_file + (uneven ? (f * 7) % uneven : 0);
    for (int d = 0; d < count; ++d) {
      int len = 3 + (f * 31 + d * 17) % 60;
      Tokens t(static_cast<size_t>(len));
      std::vector<int64_t> ids(static_cast<size_t>(len));
      for (int i = 0; i < len; ++i) ids[static_cast<size_t>(i)] = t[static_cast<size_t>(i)] = (f * 1000 + d) * 100 + i;
      writer.write(make_input_ids_example(ids));
      c.tokens += len;
      recs.push_back(std::move(t));
    }
    writer.close();
    c.files.push_back(path);
    c.records.push_back(std::move(recs));
  }
  return c;
}

// tf.data's deterministic interleave (block_length 1) over files in the given order.
std::vector<Tokens> reference_interleave(const Corpus& c, const std::vector<size_t>& order, int cycle) {
  std::vector<Tokens> out;
  std::vector<long> slot_file(static_cast<size_t>(cycle), -1);
  std::vector<size_t> slot_pos(static_cast<size_t>(cycle), 0);
  size_t next = 0;
  int ci = 0;
  for (;;) {
    auto& f = slot_file[static_cast<size_t>(ci)];
    if (f >= 0) {
      const auto& recs = c.records[static_cast<size_t>(f)];
      if (slot_pos[static_cast<size_t>(ci)] < recs.size()) {
        out.push_back(recs[slot_pos[static_cast<size_t>(ci)]++]);
      } else {
        f = -1;
      }
      ci = (ci + 1) % cycle;
    } else if (next < order.size()) {
      f = static_cast<long>(order[next++]);
      slot_pos[static_cast<size_t>(ci)] = 0;
    } else if (std::all_of(slot_file.begin(), slot_file.end(), [](long s) { return s < 0; })) {
      return out;
    } else {
      ci = (ci + 1) % cycle;
    }
  }
}

std::vector<Tokens> take(InputPipeline& p, int64_t from, int64_t count) {
  std::vector<Tokens> out;
  for (int64_t k = from; k < from + count; ++k) out.push_back(p.global_batch(k));
  return out;
}

PipelineOptions base_options() {
  PipelineOptions o;
  o.global_batch = 4;
  o.sequence_length = 15;
  o.seed = 42;
  o.shuffle_buffer = 20;
  o.cycle_length = 3;
  return o;
}

TEST(Pipeline, UnshuffledOrderIsInterleaveThenPacking) {
  Corpus c = make_corpus("plain", 5, 9, Compression::none, 5);
  PipelineOptions o = base_options();
  o.shuffle_buffer = 1;
  o.shuffle_files = false;
  o.num_epochs = 2;
  o.num_parallel_calls = 2;
  InputPipeline p(c.files, o);
  // Reference: two epochs of the interleave, concatenated, cut into samples with stride T.
  std::vector<int32_t> stream;
  for (int e = 0; e < 2; ++e) {
    for (const Tokens& r : reference_interleave(c, {0, 1, 2, 3, 4}, o.cycle_length)) stream.insert(stream.end(), r.begin(), r.end());
  }
  const int64_t T = o.sequence_length, L = T + 1, B = o.global_batch;
  const int64_t samples = (static_cast<int64_t>(stream.size()) - 1) / T;
  const int64_t batches = samples / B;
  ASSERT_GT(batches, 3);
  for (int64_t k = 0; k < batches; ++k) {
    const Tokens& got = p.global_batch(k);
    ASSERT_EQ(got.size(), static_cast<size_t>(B * L));
    for (int64_t s = 0; s < B; ++s) {
      for (int64_t i = 0; i < L; ++i) {
        ASSERT_EQ(got[static_cast<size_t>(s * L + i)], stream[static_cast<size_t>((k * B + s) * T + i)])
            << "batch " << k << " sample " << s << " token " << i;
      }
    }
  }
  EXPECT_EQ(p.try_global_batch(batches), nullptr);  // the last incomplete batch is dropped
  EXPECT_THROW(p.global_batch(batches), InputError);
}

TEST(Pipeline, EveryTokenOncePerEpochWhenShuffled) {
  Corpus c = make_corpus("perm", 6, 11, Compression::none, 4);
  PipelineOptions o = base_options();
  o.global_batch = 1;
  o.sequence_length = 1;  // samples [t_i, t_i+1]: sample starts enumerate the stream
  o.num_epochs = 1;
  InputPipeline p(c.files, o);
  std::vector<int32_t> seen;
  int32_t last = -1;
  for (int64_t k = 0;; ++k) {
    const Tokens* b = p.try_global_batch(k);
    if (!b) break;
    seen.push_back((*b)[0]);
    last = (*b)[1];
  }
  seen.push_back(last);
  ASSERT_EQ(static_cast<int64_t>(seen.size()), c.tokens);
  std::vector<int32_t> all;
  for (const auto& f : c.records)
    for (const auto& r : f) all.insert(all.end(), r.begin(), r.end());
  std::vector<int32_t> sorted_seen = seen;
  std::sort(sorted_seen.begin(), sorted_seen.end());
  std::sort(all.begin(), all.end());
  EXPECT_EQ(sorted_seen, all);
  // Shuffled: not the sorted order, but each record's tokens stay contiguous and in order.
  EXPECT_NE(seen, all);
  for (size_t i = 1; i < seen.size(); ++i) {
    if (seen[i] % 100 != 0) {
      EXPECT_EQ(seen[i], seen[i - 1] + 1) << "at " << i;
    }
  }
}

TEST(Pipeline, SameBatchesForAnyThreadCountAndPrefetch) {
  Corpus c = make_corpus("threads", 7, 15, Compression::none, 6);
  std::vector<Tokens> expect;
  for (auto [calls, prefetch] : {std::pair{1, 1}, std::pair{3, 4}, std::pair{-1, 2}}) {
    PipelineOptions o = base_options();
    o.num_parallel_calls = calls;
    o.prefetch = prefetch;
    InputPipeline p(c.files, o);
    auto got = take(p, 0, 80);  // several epochs
    if (expect.empty()) {
      expect = got;
    } else {
      EXPECT_EQ(got, expect) << "num_parallel_calls " << calls << " prefetch " << prefetch;
    }
  }
  // The same index again returns the same batch; skipping or going back is an error.
  PipelineOptions o = base_options();
  InputPipeline p(c.files, o);
  EXPECT_EQ(p.global_batch(0), expect[0]);
  EXPECT_EQ(p.global_batch(0), expect[0]);
  EXPECT_THROW(p.global_batch(2), InputError);
  EXPECT_EQ(p.global_batch(1), expect[1]);
  EXPECT_THROW(p.global_batch(0), InputError);
}

TEST(Pipeline, SeedChangesOrder) {
  Corpus c = make_corpus("seed", 4, 10);
  PipelineOptions a = base_options(), b = base_options();
  b.seed = 43;
  InputPipeline pa(c.files, a), pb(c.files, b);
  EXPECT_NE(take(pa, 0, 5), take(pb, 0, 5));
}

void check_resume(const Corpus& c, PipelineOptions o, int64_t total, const std::string& what) {
  InputPipeline full(c.files, o);
  auto expect = take(full, 0, total);
  InputPipeline walker(c.files, o);
  std::set<int64_t> epochs;
  bool crossed = false;
  for (int64_t k = 0; k + 1 < total; ++k) {
    nlohmann::json state = k == 0 ? walker.state() : nlohmann::json();
    if (k > 0) {
      walker.global_batch(k - 1);
      state = walker.state();
    }
    state = nlohmann::json::parse(state.dump());  // through text, as a checkpoint stores it
    int64_t epoch = state["epoch"].get<int64_t>();
    if (!epochs.empty() && !epochs.count(epoch)) crossed = true;
    epochs.insert(epoch);
    PipelineOptions r = o;
    r.num_parallel_calls = k % 2 ? 1 : -1;  // other thread counts than the original
    r.prefetch = 1 + static_cast<int>(k % 3);
    InputPipeline resumed(c.files, r);
    resumed.restore(state);
    int64_t n = std::min<int64_t>(6, total - k);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(resumed.global_batch(k + i), expect[static_cast<size_t>(k + i)])
          << what << ": resumed from the state before batch " << k << ", batch " << k + i;
    }
  }
  EXPECT_TRUE(crossed) << what << ": the test never crossed an epoch boundary";
  EXPECT_GE(epochs.size(), 3u) << what;
}

TEST(Pipeline, ExactResumeMidEpochAndAcrossEpochs) {
  Corpus c = make_corpus("resume", 4, 6, Compression::none, 3);
  check_resume(c, base_options(), 70, "uncompressed");
}

TEST(Pipeline, ExactResumeOnGzipShards) {
  Corpus c = make_corpus("resume_gz", 4, 10, Compression::gzip, 3);
  PipelineOptions o = base_options();
  o.sequence_length = 31;
  check_resume(c, o, 30, "gzip");
}

TEST(Pipeline, RestoreRejectsOtherOptions) {
  Corpus c = make_corpus("reject", 3, 5);
  PipelineOptions o = base_options();
  InputPipeline p(c.files, o);
  p.global_batch(0);
  nlohmann::json state = p.state();
  o.seed = 7;
  InputPipeline q(c.files, o);
  EXPECT_THROW(q.restore(state), InputError);
  EXPECT_THROW(q.restore(nlohmann::json::object()), InputError);
}

// A state edited or damaged out of range is refused naming the field, never used as an index.
TEST(Pipeline, RestoreRefusesFieldsOutOfRange) {
  Corpus c = make_corpus("range", 3, 5);
  InputPipeline p(c.files, base_options());
  p.global_batch(0);
  const nlohmann::json state = p.state();
  auto refused = [&](const std::function<void(nlohmann::json&)>& damage, const std::string& part) {
    nlohmann::json bad = state;
    damage(bad);
    InputPipeline q(c.files, base_options());
    try {
      q.restore(bad);
      ADD_FAILURE() << "accepted " << bad.dump();
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  refused([](nlohmann::json& s) { s["interleave"]["next_file"] = -5; }, "out of range");
  refused([](nlohmann::json& s) { s["shuffle"]["rng"][0] = "xyz"; }, "not a 64-bit hex number");
  refused([](nlohmann::json& s) { s["packer"]["carry"] = -7; }, "packer.carry");
  refused([](nlohmann::json& s) { s["shuffle"]["buffer"] = {{9, 0}}; }, "shuffle.buffer names file 9 of 3");
  refused([](nlohmann::json& s) { s["epoch"] = "one"; }, "pipeline state: malformed");
  InputPipeline intact(c.files, base_options());
  EXPECT_NO_THROW(intact.restore(state));
}

// A slot's offset past the end of its file (uncompressed bytes for a compressed one) is refused
// naming the file when the pipeline opens it; it read as a finished file, silently skipping the
// rest of it.
TEST(Pipeline, RestoreRefusesAnOffsetPastTheEndOfAFile) {
  for (Compression compression : {Compression::none, Compression::gzip}) {
    SCOPED_TRACE(compression_name(compression));
    Corpus c = make_corpus(fmt::format("past_end_{}", compression_name(compression)), 3, 200, compression);
    InputPipeline p(c.files, base_options());
    p.global_batch(0);
    nlohmann::json state = p.state();
    const auto slots = state["interleave"]["slots"].get<std::vector<int64_t>>();
    const auto open = std::find_if(slots.begin(), slots.end(), [](int64_t slot) { return slot >= 0; });
    ASSERT_NE(open, slots.end());
    const size_t k = static_cast<size_t>(open - slots.begin());
    state["interleave"]["offsets"][k] = 1'000'000'000;
    InputPipeline q(c.files, base_options());
    q.restore(state);
    try {
      for (int64_t batch = 1; batch < 10; ++batch) q.global_batch(batch);
      ADD_FAILURE() << "an offset past the end was read as a finished file";
    } catch (const InputError& e) {
      const std::string what = e.what();
      EXPECT_TRUE(std::any_of(c.files.begin(), c.files.end(), [&](const fs::path& file) {
        return what.rfind(file.string() + ": byte offset 1000000000 is past the end of the file", 0) == 0;
      })) << what;
    }
  }
}

TEST(Pipeline, RankSlicesConcatenateToTheGlobalBatch) {
  Corpus c = make_corpus("ranks", 3, 8);
  PipelineOptions o = base_options();
  o.global_batch = 8;
  InputPipeline p(c.files, o);
  const Tokens& b = p.global_batch(0);
  for (int n : {1, 2, 4, 8}) {
    Tokens joined;
    for (int r = 0; r < n; ++r) {
      auto s = p.rank_slice(b, r, n);
      EXPECT_EQ(s.size(), b.size() / static_cast<size_t>(n));
      joined.insert(joined.end(), s.begin(), s.end());
    }
    EXPECT_EQ(joined, b);
  }
  EXPECT_THROW(p.rank_slice(b, 0, 3), InputError);
}

TEST(Pipeline, AutotuneRaisesParallelismWhenParsingIsSlow) {
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  if (cores < 2) GTEST_SKIP() << "one core: parallelism cannot exceed 1";
  Corpus c = make_corpus("autotune", 8, 30);
  PipelineOptions o = base_options();
  o.cycle_length = 8;
  o.num_parallel_calls = -1;
  o.autotune_window = 2;
  o.map = [](std::vector<int32_t>&) { std::this_thread::sleep_for(std::chrono::milliseconds(2)); };
  InputPipeline p(c.files, o);
  int max_seen = 0;
  std::vector<Tokens> got;
  for (int64_t k = 0; k < 60; ++k) {
    got.push_back(p.global_batch(k));
    max_seen = std::max(max_seen, p.stats().parallelism);
    EXPECT_LE(p.stats().parallelism, cores);
  }
  EXPECT_GT(max_seen, 1) << "waited " << p.stats().wait_seconds << " s";
  EXPECT_LE(max_seen, std::min(cores, o.cycle_length));
  // Autotuning changes speed, never the order.
  PipelineOptions fixed = o;
  fixed.num_parallel_calls = 1;
  fixed.map = nullptr;
  InputPipeline q(c.files, fixed);
  EXPECT_EQ(take(q, 0, 60), got);
}

TEST(Pipeline, AutoShardCoversEveryRecordExactlyOnce) {
  for (auto [n, workers] : {std::pair{7, 3}, std::pair{6, 2}, std::pair{5, 5}, std::pair{9, 4}}) {
    std::vector<int> owner(static_cast<size_t>(n), -1);
    for (int w = 0; w < workers; ++w) {
      for (size_t i : auto_shard_files(static_cast<size_t>(n), workers, w)) {
        EXPECT_EQ(owner[i], -1) << "file " << i << " given twice";
        owner[i] = w;
      }
    }
    EXPECT_TRUE(std::none_of(owner.begin(), owner.end(), [](int o) { return o < 0; })) << n << " files, " << workers;
  }
  Corpus c = make_corpus("autoshard", 7, 6, Compression::none, 3);
  std::set<int32_t> all, seen_any;
  for (const auto& f : c.records)
    for (const auto& r : f) all.insert(r.begin(), r.end());
  const int workers = 3;
  for (int w = 0; w < workers; ++w) {
    PipelineOptions o = base_options();
    o.global_batch = 1;
    o.sequence_length = 1;
    o.num_epochs = 1;
    o.num_workers = workers;
    o.worker_index = w;
    InputPipeline p(c.files, o);
    EXPECT_EQ(p.files().size(), auto_shard_files(c.files.size(), workers, w).size());
    std::set<int32_t> mine;
    for (int64_t k = 0;; ++k) {
      const Tokens* b = p.try_global_batch(k);
      if (!b) break;
      mine.insert(b->begin(), b->end());
    }
    for (int32_t t : mine) {
      EXPECT_TRUE(seen_any.insert(t).second) << "token " << t << " read by two workers";
      EXPECT_EQ((t / 100) / 1000 % workers, w) << "token " << t << " of another worker's file";
    }
  }
  EXPECT_EQ(seen_any, all);
  PipelineOptions o = base_options();
  o.num_workers = 8;
  o.worker_index = 7;
  EXPECT_THROW(InputPipeline(c.files, o), InputError);  // 7 files: worker 7 gets none
}

TEST(Pipeline, CorruptRecordNamesTheFile) {
  fs::path dir = temp_dir("corrupt");
  fs::path path = dir / "bad.tfrecord";
  {
    TFRecordWriter w(path);
    std::vector<int64_t> ids = {1, 2, 3};
    w.write(make_input_ids_example(ids));
    w.write("\x0a\x05garbage-not-an-example");
  }
  PipelineOptions o = base_options();
  o.global_batch = 1;
  o.sequence_length = 2;
  InputPipeline p({path}, o);
  try {
    for (int64_t k = 0; k < 10; ++k) p.global_batch(k);
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("bad.tfrecord"), std::string::npos) << e.what();
  }
  o.vocab_size = 2;
  InputPipeline q({path}, o);
  EXPECT_THROW(q.global_batch(0), InputError);  // token 2 >= vocab_size
}

// A bad record is reported when the interleave reaches it, whatever the read-ahead did: here the
// third file's first record, read ahead (lookahead) while the first two files are interleaved.
// Every batch made of the first two files comes out first. (Before, a reader thread's failure
// stopped the pipeline at once, at a batch the thread timing chose.)
TEST(Pipeline, ABadRecordIsReportedWhereTheInterleaveReachesIt) {
  Corpus c = make_corpus("late_error", 4, 300);
  {
    TFRecordWriter w(c.files[2]);
    w.write("\x0a\x05garbage-not-an-example");
    for (const Tokens& record : c.records[2]) w.write(make_input_ids_example(std::vector<int64_t>(record.begin(), record.end())));
  }
  PipelineOptions o = base_options();
  o.shuffle_buffer = 1;
  o.shuffle_files = false;
  o.cycle_length = 2;
  o.num_parallel_calls = 2;
  int64_t first_two = 0;
  for (int f = 0; f < 2; ++f) {
    for (const Tokens& record : c.records[static_cast<size_t>(f)]) first_two += static_cast<int64_t>(record.size());
  }
  // Batches whose tokens all come from the first two files.
  const int64_t clean_batches = (first_two - 1) / o.sequence_length / o.global_batch;
  ASSERT_GT(clean_batches, 20);
  InputPipeline p(c.files, o);
  p.global_batch(0);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the lookahead reads the bad record
  for (int64_t k = 1; k < clean_batches; ++k) ASSERT_NO_THROW(p.global_batch(k)) << "batch " << k;
  try {
    for (int64_t k = clean_batches; k < clean_batches + 3; ++k) p.global_batch(k);
    ADD_FAILURE() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(c.files[2].filename().string()), std::string::npos) << e.what();
  }
}

TEST(Pipeline, MaxTokenScansShardsWithoutManifest) {
  Corpus c = make_corpus("maxtok", 3, 4);
  InputPipeline p(c.files, base_options());
  EXPECT_EQ(p.max_token(), (2 * 1000 + 3) * 100 + (3 + (2 * 31 + 3 * 17) % 60) - 1);
}

}  // namespace
}  // namespace paraflow::data
