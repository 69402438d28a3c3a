// Data-parallel gradient synchronisation. Gradients live in one flat buffer; it is cut into
// buckets (from the end, the order in which backward finishes them), and each bucket is
// all-reduced on a communication thread as soon as backward has written its last gradient, while
// backward goes on — the same buckets in the same order on every rank. With gradient
// accumulation, each micro-batch's gradients are added into a separate accumulator
// (acc = acc + micro), so N ranks reproduce one rank's accumulation bit for bit at N = 2.
//
// With `exact`, every micro-batch's gradients are converted to a two-word fixed-point number
// (value = hi·2^-20 + lo·2^-60, exact for every float32 of magnitude in [2^-37, 2^20), rounded
// to 2^-60 below) and summed as integers, over micro-batches and then over ranks. Integer sums do
// not depend on their order, so any split of a global batch into ranks × micro-batches of one
// size gives the same gradients bit for bit. A value that is not finite or of magnitude 2^20 or
// more makes its whole bucket NaN, so the loss scaler (or the user) sees the overflow.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <thread>
#include <algorithm>
#include <utility>
#include <vector>

#include "dist/communicator.h"
#include "graph/graph.h"

namespace paraflow::dist {

struct GradientSlice {
  // The gradient values in the graph that write these elements: a parameter's, and its 16-bit
  // copy's under a mixed-precision policy (bound to the same memory).
  std::vector<graph::ValueId> grads;
  int64_t offset;       // its elements in the flat buffer
  int64_t count;
};

struct GradientSyncConfig {
  int64_t bucket_bytes = 25 << 20;
  bool overlap = true;  // false: all-reduce every bucket after backward, for comparison
  // The ZeRO stage. 1: gradients are reduce-scattered after backward (each rank receives the sum
  // of its shard) instead of all-reduced; parameters are all-gathered after the optimizer step.
  // 2: as 1, and the gradients are sharded too: every micro-batch's buckets are reduce-scattered
  // as backward finishes them and summed into this rank's shard, and a bucket's pages outside the
  // shard are handed back to the kernel then, so a rank holds its shard and the buckets in flight,
  // never a whole gradient buffer or accumulator (the caller zeroes `micro` with
  // zero_releasing_pages). 3: as 2, and the parameters are sharded as well
  // (train/sharded_parameters.h): the caller skips the step's all-gather.
  int zero = 0;
  bool exact = false;  // order-independent fixed-point sums (see above); not with zero
};

class GradientSync {
 public:
  // `slices` must tile [0, total) of `micro` in order. `accumulated` is null without accumulation
  // and under ZeRO-2, which sums the micro-batches in a shard of its own; after the last
  // micro-batch's end_backward this rank's shard of the summed gradients is in `micro` (ZeRO-2)
  // or `accumulated` (ZeRO-1 with accumulation).
  GradientSync(Communicator& communicator, const graph::Graph& graph, std::vector<GradientSlice> slices, float* micro,
               float* accumulated, const GradientSyncConfig& config);
  ~GradientSync();

  // Around each micro-batch's backward; buckets are reduced only in the last one.
  void begin_backward(bool last_micro_batch);
  void on_backward_node(size_t node_index);  // the executor's backward hook
  void end_backward();

  // ZeRO shards: rank r owns [r·S, min((r+1)·S, total)) with S = ceil(total / ranks).
  int64_t shard_size() const;
  int64_t shard_begin() const { return std::min<int64_t>(communicator_.rank() * shard_size(), total_); }
  int64_t shard_end() const { return std::min<int64_t>(shard_begin() + shard_size(), total_); }
  // ZeRO: every rank's shard of `data` (total elements) to every rank, in place.
  void all_gather_shards(float* data);
  // ZeRO-3: every rank receives the (offset, count) runs of `data` from the ranks whose shards
  // hold them (a broadcast from each), on the communication thread, in order with everything else.
  std::future<void> gather_ranges(float* data, std::vector<std::pair<int64_t, int64_t>> runs);
  // Elements per rank of one chunk of the sharded collectives: they run chunk by chunk through
  // staging of (ranks + 1) chunks, about one bucket, never a whole padded copy of the buffer.
  static int64_t chunk_elements(int64_t bucket_bytes, int ranks);

  // ZeRO-2: the most gradient elements outside [shard_begin, shard_end) resident at once during a
  // backward, what `paraflow plan` counts: the buckets backward has written into and not yet
  // launched, and the last kBucketsInFlight launched (being reduced while backward goes on).
  static int64_t peak_in_flight_elements(const graph::Graph& graph, const std::vector<GradientSlice>& slices,
                                         const GradientSyncConfig& config, int64_t shard_begin, int64_t shard_end);

  // Small collectives, run on the communication thread in order with the buckets.
  float all_reduce_sum(float value);
  float all_reduce_max(float value);
  void broadcast(float* data, size_t count, int root);
  std::string broadcast(const std::string& text, int root);

  Communicator& communicator() { return communicator_; }
  // Seconds the main thread waited for communication in the last backward: at its end, and (ZeRO-2)
  // while kBucketsInFlight buckets were being reduced.
  double last_wait_seconds() const { return last_wait_seconds_; }

 private:
  struct Bucket {
    int64_t begin, count;
    std::vector<size_t> slices;
    int64_t exact_offset = 0;  // its words in exact_: hi, lo per element, then an overflow count
  };
  // The buckets over the slices and which slices each backward node writes: the bookkeeping of a
  // backward, shared with peak_in_flight_elements.
  struct Schedule {
    std::vector<Bucket> buckets;
    std::vector<std::vector<size_t>> slices_written_by_node;
    std::vector<int> writers_per_slice;
    std::vector<size_t> bucket_of_slice;
  };
  static Schedule schedule(const graph::Graph& graph, const std::vector<GradientSlice>& slices, int64_t bucket_bytes);
  std::future<void> submit(std::function<void()> work);
  void launch_ready_buckets();
  void launch_all_buckets();  // backward is over: every bucket is ready
  // Waits for the oldest submitted work until at most `unfinished` of it is left.
  void wait_for_pending(size_t unfinished);
  // ZeRO-2: the most buckets being reduced (and held) at once while backward goes on.
  static constexpr size_t kBucketsInFlight = 2;
  // accumulated[begin, begin+count) = accumulated + micro: one more micro-batch's gradients.
  void fold_micro_batch(int64_t begin, int64_t count);
  void reduce_bucket(const Bucket& bucket);
  // ZeRO-2: the bucket reduce-scattered into this rank's part of it (summed into shard_sum_ unless
  // the step has one micro-batch; the last one's sum into micro_), the rest of it released.
  void scatter_bucket(const Bucket& bucket, bool first_micro, bool last_micro);
  // Reduce-scatters [begin, end) of `data` (every rank's) chunk by chunk: `mine` receives the sum
  // over ranks of this rank's part of it (the range within its shard), or has it added when `add`.
  // `mine` may be that part of `data` itself: each chunk is staged before its part is written.
  void reduce_scatter_range(const float* data, int64_t begin, int64_t end, float* mine, bool add);
  // How many of `count` elements from `start` on lie inside the buffer (the rest is padding).
  int64_t elements_within(int64_t start, int64_t count) const;
  // Sizes the staging (wide_, narrow_) for ZeRO's chunked collectives; returns a chunk's elements.
  int64_t size_staging();
  // exact_ (the bucket's words) += fixed-point micro_, or = on a step's first micro-batch.
  void add_exact(const Bucket& bucket);
  // The bucket's summed words back to floats in `target`.
  void read_exact(const Bucket& bucket, float* target) const;
  void communication_loop();

  Communicator& communicator_;
  GradientSyncConfig config_;
  std::vector<GradientSlice> slices_;
  float* micro_;
  float* accumulated_;
  int64_t total_ = 0;
  // ZeRO staging, kept between steps (what `paraflow plan` counts): one chunk of every rank's
  // shard (wide_) and of this rank's (narrow_); ZeRO-2 with accumulation: this rank's shard of
  // the micro-batches' sum.
  std::vector<float> wide_, narrow_, shard_sum_;
  std::vector<int64_t> exact_;  // `exact`: every bucket's fixed-point sums
  std::vector<Bucket> buckets_;
  std::vector<std::vector<size_t>> slices_written_by_node_;
  std::vector<int> writers_per_slice_;
  std::vector<int> remaining_writers_;
  std::vector<int> remaining_slices_per_bucket_;
  std::vector<size_t> bucket_of_slice_;
  size_t next_bucket_ = 0;
  bool last_micro_ = true;
  bool first_micro_ = true;
  std::vector<std::future<void>> pending_;
  size_t waited_ = 0;  // pending_[0, waited_) are done
  double last_wait_seconds_ = 0;

  std::mutex mutex_;
  std::condition_variable work_ready_;
  std::deque<std::packaged_task<void()>> queue_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace paraflow::dist
