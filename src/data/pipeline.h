// The trainer's input pipeline over `data prepare` shards, built like a tf.data pipeline:
//
//   files (permuted per epoch) -> parallel interleave (cycle_length, num_parallel_calls)
//     -> parse tf.train.Example input_ids (+ optional map) -> seeded shuffle buffer
//     -> packing into samples of sequence_length + 1 tokens -> global batches -> prefetch
//
// The order is defined globally: batch k is a pure function of the shard list, the seed and the
// order options (global_batch, sequence_length, shuffle_buffer, cycle_length, shuffle_files,
// num_epochs, auto-shard), never of thread counts, prefetch depth, timing or the number of
// data-parallel ranks. Rank r of N takes rows [r·B/N, (r+1)·B/N) of each global batch, as
// Megatron's sampler does, so a run may resume on a different N.
//
// Order, precisely (each epoch e = 0, 1, ...):
//   - file order: the shard list, permuted by a Rng seeded from (seed, e) when shuffle_files;
//   - interleave: tf.data's deterministic interleave with block_length 1: cycle_length slots;
//     visiting an empty slot opens the next file there; a slot yields one record and the cycle
//     moves on; an exhausted file empties its slot and the cycle moves on;
//   - shuffle: tf.data's buffer: fill to shuffle_buffer records, then each output is a uniformly
//     drawn slot (Rng seeded from (seed, e)) refilled by the next input; at the end of the epoch
//     the buffer drains, then the next epoch starts (reshuffled);
//   - packing: the records' tokens form one stream across epochs; sample i is tokens
//     [i·T, i·T + T + 1) of it (consecutive samples share one token, as Megatron packs them, so
//     every token is a target once); batches take B consecutive samples. With num_epochs > 0 the
//     last incomplete batch is dropped.
//
// Parallelism: worker threads read and parse the files of the cycle (and the next cycle_length
// files) into per-file queues; a sequencer thread applies the order; batches are prefetched.
// Autotune (num_parallel_calls = -1) starts at 1 worker and adds one while the consumer spends
// more than 2% of its time waiting, up to min(cycle_length, cores).
//
// state() is a small JSON (the shuffle buffer as (file, offset) references, interleave slots with
// their file offsets, Rng state, packing position) from which restore() rebuilds a pipeline that
// yields exactly the batches the original would have yielded next.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/tfrecord_io.h"

namespace paraflow::data {

struct PipelineOptions {
  int64_t global_batch = 0;     // samples per global batch (all ranks together)
  int64_t sequence_length = 0;  // n_ctx: a sample holds sequence_length + 1 tokens
  uint64_t seed = 0;
  int64_t shuffle_buffer = 10000;  // records; <= 1: no shuffling
  int cycle_length = 4;            // files read concurrently
  int num_parallel_calls = -1;     // reader/parser threads; -1: autotune
  int prefetch = 2;                // batches prepared ahead
  bool shuffle_files = true;       // permute the file order every epoch
  int64_t num_epochs = -1;         // -1: repeat forever
  // File-level sharding (tf.data's auto-shard by FILE): this pipeline reads only files i with
  // i % num_workers == worker_index; its batches are then this worker's own, not global.
  int num_workers = 1;
  int worker_index = 0;
  std::string feature = "input_ids";
  std::optional<Compression> compression;  // nullopt: detected from each file's first bytes
  int64_t vocab_size = 0;                  // > 0: a token >= vocab_size is an InputError
  int max_parallelism = 0;                 // autotune cap; 0: hardware threads
  int64_t autotune_window = 4;             // batches between autotune decisions
  // Applied to every parsed record on the worker threads (tf.data's map); must be a pure function.
  std::function<void(std::vector<int32_t>& tokens)> map;
};

struct PipelineStats {
  int64_t batches = 0;        // handed to the consumer
  int64_t records = 0;        // records parsed by the workers (restores included)
  int64_t tokens = 0;         // tokens in them
  double wait_seconds = 0;    // consumer time blocked in global_batch()
  int parallelism = 0;        // worker threads allowed to run now
};

class InputPipeline {
 public:
  InputPipeline(std::vector<std::filesystem::path> shards, PipelineOptions options);
  ~InputPipeline();
  InputPipeline(const InputPipeline&) = delete;
  InputPipeline& operator=(const InputPipeline&) = delete;

  // Global batch `index` as int32 tokens [global_batch, sequence_length + 1] row-major; index
  // must be the next batch or the last one returned (then the same batch again), else
  // InputError. Valid until the next call. InputError at the end of data (num_epochs > 0).
  const std::vector<int32_t>& global_batch(int64_t index);
  // Same, but nullptr at the end of data.
  const std::vector<int32_t>* try_global_batch(int64_t index);

  // Rows of data-parallel rank `rank` of `num_ranks` in a global batch (global_batch % num_ranks
  // must be 0): [rank·B/N, (rank+1)·B/N) rows of sequence_length + 1 tokens.
  std::span<const int32_t> rank_slice(const std::vector<int32_t>& batch, int rank, int num_ranks) const;

  // The index of the batch global_batch() reads next (after restore(), the state's).
  int64_t next_index() const;

  // The iterator state after the last batch returned (before any: the initial state).
  nlohmann::json state() const;
  // Continues from a state() of a pipeline with the same shards and order options.
  void restore(const nlohmann::json& state);

  // The largest token id in the data: from manifest.json next to the shards when it lists them
  // all, else by reading the shards once (then cached).
  int32_t max_token() const;

  int64_t epoch() const;  // epoch of the last batch returned
  PipelineStats stats() const;
  const std::vector<std::filesystem::path>& files() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Files of a prepared directory's split (manifest order); defined in prepare.cc.
std::vector<std::filesystem::path> list_shards(const std::filesystem::path& prepared_dir, const std::string& split);

// The files that worker `index` of `num_workers` reads under file-level sharding (positions in
// `files`): i % num_workers == index.
std::vector<size_t> auto_shard_files(size_t num_files, int num_workers, int index);

}  // namespace paraflow::data
