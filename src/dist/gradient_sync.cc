#include "dist/gradient_sync.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <numeric>
#include <cstring>

#include "base/error.h"
#include "base/system_memory.h"

namespace paraflow::dist {

GradientSync::GradientSync(Communicator& communicator, const graph::Graph& graph, std::vector<GradientSlice> slices,
                           float* micro, float* accumulated, const GradientSyncConfig& config)
    : communicator_(communicator), config_(config), slices_(std::move(slices)), micro_(micro), accumulated_(accumulated) {
  for (size_t i = 1; i < slices_.size(); ++i) {
    if (slices_[i].offset != slices_[i - 1].offset + slices_[i - 1].count) {
      throw Error("GradientSync: gradient slices must tile the flat buffer in order");
    }
  }
  total_ = slices_.empty() ? 0 : slices_.back().offset + slices_.back().count;
  Schedule plan = schedule(graph, slices_, config_.bucket_bytes);
  buckets_ = std::move(plan.buckets);
  slices_written_by_node_ = std::move(plan.slices_written_by_node);
  writers_per_slice_ = std::move(plan.writers_per_slice);
  bucket_of_slice_ = std::move(plan.bucket_of_slice);
  if (config_.exact) {
    check(config_.zero == 0, "dist.exact_reduction does not combine with dist.zero ({}) yet", config_.zero);
    int64_t words = 0;
    for (Bucket& bucket : buckets_) {
      bucket.exact_offset = words;
      words += 2 * bucket.count + 1;
    }
    exact_.assign(static_cast<size_t>(words), 0);
  }
  thread_ = std::thread([this] { communication_loop(); });
}

GradientSync::Schedule GradientSync::schedule(const graph::Graph& graph, const std::vector<GradientSlice>& slices,
                                              int64_t bucket_bytes) {
  Schedule plan;
  // Which gradients each backward node writes, and how many nodes write each one.
  plan.slices_written_by_node.resize(graph.nodes().size());
  plan.writers_per_slice.assign(slices.size(), 0);
  for (size_t n = 0; n < graph.nodes().size(); ++n) {
    const graph::Node& node = graph.nodes()[n];
    if (!node.is_backward) continue;
    for (graph::ValueId input : graph.nodes()[static_cast<size_t>(node.forward_node)].inputs) {
      for (size_t s = 0; s < slices.size(); ++s) {
        const graph::ValueId grad = graph.value(input).grad;
        if (grad != graph::kNoValue &&
            std::find(slices[s].grads.begin(), slices[s].grads.end(), grad) != slices[s].grads.end()) {
          plan.slices_written_by_node[n].push_back(s);
          ++plan.writers_per_slice[s];
        }
      }
    }
  }
  // Buckets from the end of the buffer, each at least bucket_bytes (the last may be smaller).
  plan.bucket_of_slice.assign(slices.size(), 0);
  Bucket current{0, 0, {}};
  for (size_t s = slices.size(); s-- > 0;) {
    current.slices.push_back(s);
    current.begin = slices[s].offset;
    current.count += slices[s].count;
    if (current.count * static_cast<int64_t>(sizeof(float)) >= bucket_bytes || s == 0) {
      for (size_t member : current.slices) plan.bucket_of_slice[member] = plan.buckets.size();
      plan.buckets.push_back(current);
      current = Bucket{0, 0, {}};
    }
  }
  return plan;
}

int64_t GradientSync::peak_in_flight_elements(const graph::Graph& graph, const std::vector<GradientSlice>& slices,
                                              const GradientSyncConfig& config, int64_t shard_begin,
                                              int64_t shard_end) {
  auto outside_shard = [&](int64_t begin, int64_t count) {
    return count - std::max<int64_t>(0, std::min(begin + count, shard_end) - std::max(begin, shard_begin));
  };
  int64_t everything = 0;
  for (const GradientSlice& slice : slices) everything += outside_shard(slice.offset, slice.count);
  if (!config.overlap) return everything;  // all of backward's gradients, reduced after it
  const Schedule plan = schedule(graph, slices, config.bucket_bytes);
  // The executor's backward, node by node: a slice is resident from its first write until its
  // bucket is launched and kBucketsInFlight more after it (at most that many are being reduced).
  std::vector<int> writers = plan.writers_per_slice;
  std::vector<int> unfinished(plan.buckets.size());
  for (size_t b = 0; b < plan.buckets.size(); ++b) unfinished[b] = static_cast<int>(plan.buckets[b].slices.size());
  std::vector<bool> written(slices.size(), false);
  std::deque<int64_t> in_reduction;  // the launched buckets' elements, the latest kBucketsInFlight
  int64_t resident = 0, peak = 0;
  size_t next = 0;
  for (int32_t index : graph.schedule()) {
    const auto n = static_cast<size_t>(index);
    if (!graph.nodes()[n].is_backward) continue;
    for (size_t s : plan.slices_written_by_node[n]) {
      if (!written[s]) resident += outside_shard(slices[s].offset, slices[s].count);
      written[s] = true;
      if (--writers[s] == 0) --unfinished[plan.bucket_of_slice[s]];
    }
    peak = std::max(peak, resident + std::accumulate(in_reduction.begin(), in_reduction.end(), int64_t{0}));
    for (; next < plan.buckets.size() && unfinished[next] == 0; ++next) {
      const int64_t launched = outside_shard(plan.buckets[next].begin, plan.buckets[next].count);
      resident -= launched;
      in_reduction.push_back(launched);
      if (in_reduction.size() > kBucketsInFlight) in_reduction.pop_front();
    }
  }
  return peak;
}

GradientSync::~GradientSync() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  work_ready_.notify_all();
  thread_.join();
}

void GradientSync::communication_loop() {
  while (true) {
    std::packaged_task<void()> task;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      work_ready_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();  // an exception is stored in the task's future
  }
}

std::future<void> GradientSync::submit(std::function<void()> work) {
  std::packaged_task<void()> task(std::move(work));
  std::future<void> done = task.get_future();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(std::move(task));
  }
  work_ready_.notify_one();
  return done;
}

void GradientSync::begin_backward(bool last_micro_batch) {
  last_micro_ = last_micro_batch;
  last_wait_seconds_ = 0;
  if (config_.zero >= 2 && !(first_micro_ && last_micro_)) shard_sum_.resize(static_cast<size_t>(shard_size()));
  remaining_writers_ = writers_per_slice_;
  remaining_slices_per_bucket_.clear();
  for (const Bucket& bucket : buckets_) remaining_slices_per_bucket_.push_back(static_cast<int>(bucket.slices.size()));
  next_bucket_ = 0;
}

void GradientSync::fold_micro_batch(int64_t begin, int64_t count) {
  for (int64_t i = begin; i < begin + count; ++i) accumulated_[i] = accumulated_[i] + micro_[i];
}

namespace {

constexpr double kHighScale = 0x1p20, kLowScale = 0x1p40;  // hi counts 2^-20, lo counts 2^-60

}  // namespace

void GradientSync::add_exact(const Bucket& bucket) {
  int64_t* words = exact_.data() + bucket.exact_offset;
  const float* values = micro_ + bucket.begin;
  if (first_micro_) std::fill(words, words + 2 * bucket.count + 1, 0);
  int64_t overflows = 0;
  for (int64_t i = 0; i < bucket.count; ++i) {
    const double scaled = static_cast<double>(values[i]) * kHighScale;  // exact: a power-of-two scale
    if (!(std::abs(scaled) < 0x1p40)) {  // also catches NaN
      ++overflows;
      continue;
    }
    const double high = std::trunc(scaled);
    words[2 * i] += static_cast<int64_t>(high);
    words[2 * i + 1] += std::llrint((scaled - high) * kLowScale);  // the subtraction is exact
  }
  words[2 * bucket.count] += overflows;
}

void GradientSync::read_exact(const Bucket& bucket, float* target) const {
  const int64_t* words = exact_.data() + bucket.exact_offset;
  const bool overflow = words[2 * bucket.count] != 0;
  for (int64_t i = 0; i < bucket.count; ++i) {
    const double value = (static_cast<double>(words[2 * i]) +
                          static_cast<double>(words[2 * i + 1]) / kLowScale) / kHighScale;
    target[bucket.begin + i] = overflow ? std::numeric_limits<float>::quiet_NaN() : static_cast<float>(value);
  }
}

void GradientSync::reduce_bucket(const Bucket& bucket) {
  if (config_.exact) {
    add_exact(bucket);
    int64_t* words = exact_.data() + bucket.exact_offset;
    communicator_.all_reduce_sum(words, static_cast<size_t>(2 * bucket.count + 1));
    read_exact(bucket, accumulated_ != nullptr ? accumulated_ : micro_);
    return;
  }
  float* target = micro_;
  if (accumulated_ != nullptr) {
    fold_micro_batch(bucket.begin, bucket.count);
    target = accumulated_;
  }
  communicator_.all_reduce_sum(target + bucket.begin, static_cast<size_t>(bucket.count));
}

void GradientSync::scatter_bucket(const Bucket& bucket, bool first_micro, bool last_micro) {
  const int64_t end = bucket.begin + bucket.count;
  // This rank's part of the bucket.
  const int64_t from = std::clamp(shard_begin(), bucket.begin, end), to = std::clamp(shard_end(), bucket.begin, end);
  if (first_micro && last_micro) {
    reduce_scatter_range(micro_, bucket.begin, end, micro_ + from, false);
  } else {
    float* sum = shard_sum_.data() + std::clamp(from - shard_begin(), int64_t{0}, shard_size());
    reduce_scatter_range(micro_, bucket.begin, end, sum, !first_micro);
    if (last_micro) std::copy(sum, sum + (to - from), micro_ + from);
  }
  // Backward is done with the bucket: the rest of it goes back to the kernel (and reads as zeros
  // for the next backward).
  release_pages(micro_ + bucket.begin, micro_ + from);
  release_pages(micro_ + to, micro_ + end);
}

void GradientSync::launch_ready_buckets() {
  while (next_bucket_ < buckets_.size() && remaining_slices_per_bucket_[next_bucket_] == 0) {
    const Bucket& bucket = buckets_[next_bucket_++];
    if (config_.zero >= 2) {
      pending_.push_back(submit([this, &bucket, first = first_micro_, last = last_micro_] {
        scatter_bucket(bucket, first, last);
      }));
      // Backward waits rather than run ahead of the communication thread with more buckets in
      // memory: a rank holds at most kBucketsInFlight of them being reduced.
      wait_for_pending(kBucketsInFlight);
    } else {
      pending_.push_back(submit([this, &bucket] { reduce_bucket(bucket); }));
    }
  }
}

void GradientSync::wait_for_pending(size_t unfinished) {
  const auto start = std::chrono::steady_clock::now();
  while (pending_.size() - waited_ > unfinished) pending_[waited_++].get();
  last_wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void GradientSync::launch_all_buckets() {
  for (int& remaining : remaining_slices_per_bucket_) remaining = 0;
  launch_ready_buckets();
}

void GradientSync::on_backward_node(size_t node_index) {
  // Plain data parallelism reduces the last micro-batch's buckets during its backward (the others
  // are accumulated first), ZeRO-2 every micro-batch's; ZeRO-1 the whole buffer after backward.
  const bool reduces_during_backward = config_.zero >= 2 || (config_.zero == 0 && last_micro_);
  if (!reduces_during_backward || !config_.overlap) return;
  for (size_t s : slices_written_by_node_[node_index]) {
    if (--remaining_writers_[s] == 0) --remaining_slices_per_bucket_[bucket_of_slice_[s]];
  }
  launch_ready_buckets();
}

void GradientSync::end_backward() {
  if (config_.zero >= 2) {
    // Every micro-batch is reduce-scattered and summed into this rank's shard before the next
    // backward overwrites micro_; after the last one the sum goes to micro_'s shard range, where
    // the optimizer reads it.
    launch_all_buckets();
  } else if (!last_micro_ && config_.exact) {
    for (const Bucket& bucket : buckets_) add_exact(bucket);
    first_micro_ = false;
    return;
  } else if (!last_micro_) {
    // Not the last micro-batch: fold it into the accumulator (the first one is a plain copy, so
    // the accumulator holds g0, then g0 + g1, ... exactly as separate ranks would sum them).
    if (first_micro_) {
      std::memcpy(accumulated_, micro_, static_cast<size_t>(total_) * sizeof(float));
    } else {
      fold_micro_batch(0, total_);
    }
    first_micro_ = false;
    return;
  } else {
    if (accumulated_ != nullptr && first_micro_) {
      // One micro-batch only: nothing accumulated yet, so the sum starts from zero.
      std::memset(accumulated_, 0, static_cast<size_t>(total_) * sizeof(float));
    }
    if (config_.zero == 1) {
      float* target = accumulated_ != nullptr ? accumulated_ : micro_;
      if (accumulated_ != nullptr) fold_micro_batch(0, total_);
      pending_.push_back(
          submit([this, target] { reduce_scatter_range(target, 0, total_, target + shard_begin(), false); }));
    } else {
      launch_all_buckets();
    }
  }
  wait_for_pending(0);
  pending_.clear();
  waited_ = 0;
  first_micro_ = last_micro_;
}

int64_t GradientSync::shard_size() const {
  const int64_t ranks = communicator_.size();
  return (total_ + ranks - 1) / ranks;
}

int64_t GradientSync::chunk_elements(int64_t bucket_bytes, int ranks) {
  return std::max<int64_t>(1, bucket_bytes / static_cast<int64_t>(sizeof(float)) / (ranks + 1));
}

int64_t GradientSync::elements_within(int64_t start, int64_t count) const {
  return std::clamp<int64_t>(total_ - start, 0, count);
}

int64_t GradientSync::size_staging() {
  const int ranks = communicator_.size();
  const int64_t chunk = std::min(chunk_elements(config_.bucket_bytes, ranks), shard_size());
  wide_.resize(static_cast<size_t>(ranks * chunk));
  narrow_.resize(static_cast<size_t>(chunk));
  return chunk;
}

void GradientSync::reduce_scatter_range(const float* data, int64_t begin, int64_t end, float* mine, bool add) {
  const int ranks = communicator_.size();
  const int64_t size = shard_size(), chunk = size_staging();
  // Rank r's part of the range, [first(r), last(r)); every rank's is sent padded to the longest.
  auto first = [&](int rank) { return std::clamp(rank * size, begin, end); };
  auto last = [&](int rank) { return std::clamp((rank + 1) * size, begin, end); };
  int64_t longest = 0;
  for (int rank = 0; rank < ranks; ++rank) longest = std::max(longest, last(rank) - first(rank));
  for (int64_t at = 0; at < longest; at += chunk) {
    const int64_t count = std::min(chunk, longest - at);
    for (int rank = 0; rank < ranks; ++rank) {  // rank r's part of this chunk, zero past it
      const int64_t start = first(rank) + at, present = std::clamp<int64_t>(last(rank) - start, 0, count);
      float* to = wide_.data() + rank * count;
      std::copy(data + start, data + start + present, to);
      std::fill(to + present, to + count, 0.0f);
    }
    communicator_.reduce_scatter_sum(wide_.data(), narrow_.data(), static_cast<size_t>(count));
    const int me = communicator_.rank();
    const int64_t received = std::clamp<int64_t>(last(me) - first(me) - at, 0, count);
    for (int64_t i = 0; i < received; ++i) mine[at + i] = add ? mine[at + i] + narrow_[i] : narrow_[i];
  }
}

void GradientSync::all_gather_shards(float* data) {
  submit([&] {
    const int ranks = communicator_.size();
    const int64_t size = shard_size(), chunk = size_staging();
    for (int64_t at = 0; at < size; at += chunk) {
      const int64_t count = std::min(chunk, size - at);
      const int64_t mine = elements_within(shard_begin() + at, count);
      std::copy(data + shard_begin() + at, data + shard_begin() + at + mine, narrow_.begin());
      std::fill(narrow_.begin() + mine, narrow_.begin() + count, 0.0f);
      communicator_.all_gather(narrow_.data(), wide_.data(), static_cast<size_t>(count));
      for (int rank = 0; rank < ranks; ++rank) {
        const int64_t start = rank * size + at;
        std::copy(wide_.begin() + rank * count, wide_.begin() + rank * count + elements_within(start, count),
                  data + start);
      }
    }
  }).get();
}

std::future<void> GradientSync::gather_ranges(float* data, std::vector<std::pair<int64_t, int64_t>> runs) {
  return submit([this, data, runs = std::move(runs)] {
    const int64_t size = shard_size();
    for (const auto& [begin, count] : runs) {
      for (int rank = 0; rank < communicator_.size(); ++rank) {
        const int64_t from = std::max(begin, rank * size), to = std::min({begin + count, (rank + 1) * size, total_});
        if (from < to) communicator_.broadcast(data + from, static_cast<size_t>(to - from) * sizeof(float), rank);
      }
    }
  });
}

float GradientSync::all_reduce_sum(float value) {
  submit([&] { communicator_.all_reduce_sum(&value, 1); }).get();
  return value;
}

float GradientSync::all_reduce_max(float value) {
  submit([&] { communicator_.all_reduce_max(&value, 1); }).get();
  return value;
}

std::string GradientSync::broadcast(const std::string& text, int root) {
  std::string result;
  submit([&] { result = broadcast_text(communicator_, text, root); }).get();
  return result;
}

void GradientSync::broadcast(float* data, size_t count, int root) {
  submit([&] { communicator_.broadcast(data, count * sizeof(float), root); }).get();
}

}  // namespace paraflow::dist
