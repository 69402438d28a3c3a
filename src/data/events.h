// TensorBoard event files: a TFRecord file of tf.Event protos named
// `events.out.tfevents.<unix seconds>.<hostname>[suffix]`, whose first record carries
// file_version "brain.Event:2". `tensorboard --logdir` reads what this writes.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "data/event.pb.h"
#include "data/tfrecord.h"

namespace paraflow::data {

struct EventWriterOptions {
  // Events reach the file (and TensorBoard) at most this long after they are added.
  std::chrono::milliseconds flush_interval{5000};
  // Appended to the file name, as TensorFlow's filename_suffix (e.g. ".eval").
  std::string filename_suffix;
};

// TensorFlow's default histogram buckets: ±1e-12·1.1^k up to 1e20, plus 0 and ±DBL_MAX.
const std::vector<double>& default_histogram_limits();
// A HistogramProto of `values` over the default buckets, empty runs of buckets merged as
// TensorFlow's Histogram::EncodeToProto does.
tf::HistogramProto make_histogram(std::span<const double> values);

// Thread-safe: the trainer and an evaluator thread may log into the same writer.
class EventWriter {
 public:
  // Creates `logdir` if needed and a new event file in it.
  explicit EventWriter(const std::filesystem::path& logdir, EventWriterOptions options = {});
  ~EventWriter();  // close(), errors lost
  EventWriter(const EventWriter&) = delete;
  EventWriter& operator=(const EventWriter&) = delete;

  // A scalar as Summary.Value.simple_value (what TensorBoard's scalars dashboard plots).
  void add_scalar(std::string_view tag, double value, int64_t step);
  void add_histogram(std::string_view tag, std::span<const double> values, int64_t step);
  void add_histogram(std::string_view tag, std::span<const float> values, int64_t step);
  // Markdown text: a DT_STRING scalar tensor with plugin_data "text".
  void add_text(std::string_view tag, std::string_view text, int64_t step);
  // Any event; wall_time is set to now when it is 0.
  void write(tf::Event event);

  void flush();
  void close();
  const std::filesystem::path& path() const { return path_; }

 private:
  void add_value(tf::Summary::Value value, int64_t step);
  void flush_loop();

  std::filesystem::path path_;
  EventWriterOptions options_;
  std::mutex mutex_;
  std::condition_variable wake_;
  TFRecordWriter writer_;
  bool dirty_ = false;
  bool closing_ = false;
  bool closed_ = false;
  std::thread flusher_;
};

// Wall time as TensorBoard stores it: seconds since the epoch, as a double.
double wall_time_now();

}  // namespace paraflow::data
