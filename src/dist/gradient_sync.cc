#include "dist/gradient_sync.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <cstring>

#include "base/error.h"

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
  // Which gradients each backward node writes, and how many nodes write each one.
  slices_written_by_node_.resize(graph.nodes().size());
  writers_per_slice_.assign(slices_.size(), 0);
  for (size_t n = 0; n < graph.nodes().size(); ++n) {
    const graph::Node& node = graph.nodes()[n];
    if (!node.is_backward) continue;
    for (graph::ValueId input : graph.nodes()[static_cast<size_t>(node.forward_node)].inputs) {
      for (size_t s = 0; s < slices_.size(); ++s) {
        const graph::ValueId grad = graph.value(input).grad;
        if (grad != graph::kNoValue &&
            std::find(slices_[s].grads.begin(), slices_[s].grads.end(), grad) != slices_[s].grads.end()) {
          slices_written_by_node_[n].push_back(s);
          ++writers_per_slice_[s];
        }
      }
    }
  }
  // Buckets from the end of the buffer, each at least bucket_bytes (the last may be smaller).
  bucket_of_slice_.assign(slices_.size(), 0);
  Bucket current{0, 0, {}};
  for (size_t s = slices_.size(); s-- > 0;) {
    current.slices.push_back(s);
    current.begin = slices_[s].offset;
    current.count += slices_[s].count;
    if (current.count * static_cast<int64_t>(sizeof(float)) >= config_.bucket_bytes || s == 0) {
      for (size_t member : current.slices) bucket_of_slice_[member] = buckets_.size();
      buckets_.push_back(current);
      current = Bucket{0, 0, {}};
    }
  }
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

void GradientSync::launch_ready_buckets() {
  while (next_bucket_ < buckets_.size() && remaining_slices_per_bucket_[next_bucket_] == 0) {
    const Bucket& bucket = buckets_[next_bucket_++];
    pending_.push_back(submit([this, &bucket] { reduce_bucket(bucket); }));
  }
}

void GradientSync::on_backward_node(size_t node_index) {
  if (!last_micro_ || !config_.overlap || config_.zero > 0) return;
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
    pending_.push_back(submit([this, first = first_micro_, last = last_micro_] {
      if (first && last) {
        reduce_scatter_shards(micro_, micro_ + shard_begin(), false);
        return;
      }
      shard_sum_.resize(static_cast<size_t>(shard_size()));
      reduce_scatter_shards(micro_, shard_sum_.data(), !first);
      if (last) std::copy(shard_sum_.begin(), shard_sum_.begin() + (shard_end() - shard_begin()), micro_ + shard_begin());
    }));
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
      pending_.push_back(submit([this, target] { reduce_scatter_shards(target, target + shard_begin(), false); }));
    } else {
      for (int& remaining : remaining_slices_per_bucket_) remaining = 0;  // backward is over: all are ready
      launch_ready_buckets();
    }
  }
  auto start = std::chrono::steady_clock::now();
  for (auto& done : pending_) done.get();
  last_wait_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  pending_.clear();
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

void GradientSync::reduce_scatter_shards(const float* data, float* shard, bool add) {
  const int ranks = communicator_.size();
  const int64_t size = shard_size(), chunk = size_staging();
  for (int64_t at = 0; at < size; at += chunk) {
    const int64_t count = std::min(chunk, size - at);
    for (int rank = 0; rank < ranks; ++rank) {  // rank r's part of this chunk, zero past the buffer
      const int64_t start = rank * size + at, present = elements_within(start, count);
      float* to = wide_.data() + rank * count;
      std::copy(data + start, data + start + present, to);
      std::fill(to + present, to + count, 0.0f);
    }
    communicator_.reduce_scatter_sum(wide_.data(), narrow_.data(), static_cast<size_t>(count));
    const int64_t mine = elements_within(shard_begin() + at, count);
    for (int64_t i = 0; i < mine; ++i) shard[at + i] = add ? shard[at + i] + narrow_[i] : narrow_[i];
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
