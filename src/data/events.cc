#include "data/events.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cfloat>
#include <cmath>
#include <cstring>

#include "base/error.h"

namespace paraflow::data {

namespace {

std::string hostname() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0 || name[0] == 0) return "localhost";
  return name;
}

// TensorFlow's EventsWriter name: "%s.out.tfevents.%010lld.%s%s" (prefix "events"). Two writers
// started in the same second in one directory get ".1", ".2"... so neither truncates the other.
std::filesystem::path new_event_file(const std::filesystem::path& logdir, const std::string& suffix) {
  std::error_code error;
  std::filesystem::create_directories(logdir, error);
  if (error) throw IoError(fmt::format("{}: cannot create the log directory: {}", logdir.string(), error.message()));
  auto seconds = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch());
  std::string base = fmt::format("events.out.tfevents.{:010d}.{}", seconds.count(), hostname());
  // The name is claimed by creating the file (O_EXCL): two writers starting in the same second
  // (two runs, two ranks on one host) get two files, not one truncating the other's.
  for (int k = 0;; ++k) {
    std::filesystem::path path = logdir / (k == 0 ? base + suffix : fmt::format("{}{}.{}", base, suffix, k));
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd >= 0) {
      ::close(fd);
      return path;
    }
    if (errno != EEXIST) throw IoError(fmt::format("{}: cannot create: {}", path.string(), std::strerror(errno)));
  }
}

}  // namespace

double wall_time_now() {
  auto now = std::chrono::system_clock::now().time_since_epoch();
  return std::chrono::duration<double>(now).count();
}

const std::vector<double>& default_histogram_limits() {
  static const std::vector<double> limits = [] {
    std::vector<double> positive;
    for (double v = 1.0e-12; v < 1.0e20; v *= 1.1) positive.push_back(v);
    positive.push_back(DBL_MAX);
    std::vector<double> all;
    for (auto it = positive.rbegin(); it != positive.rend(); ++it) all.push_back(-*it);
    all.push_back(0.0);
    all.insert(all.end(), positive.begin(), positive.end());
    return all;
  }();
  return limits;
}

tf::HistogramProto make_histogram(std::span<const double> values) {
  const auto& limits = default_histogram_limits();
  std::vector<double> counts(limits.size(), 0.0);
  tf::HistogramProto proto;
  double min = DBL_MAX, max = -DBL_MAX, sum = 0, sum_squares = 0;
  for (double v : values) {
    // As TensorFlow's Histogram::Add: bucket i holds [limit(i-1), limit(i)).
    size_t bucket = std::upper_bound(limits.begin(), limits.end(), v) - limits.begin();
    counts[std::min(bucket, limits.size() - 1)] += 1;
    min = std::min(min, v);
    max = std::max(max, v);
    sum += v;
    sum_squares += v * v;
  }
  proto.set_min(min);
  proto.set_max(max);
  proto.set_num(static_cast<double>(values.size()));
  proto.set_sum(sum);
  proto.set_sum_squares(sum_squares);
  // Histogram::EncodeToProto(preserve_zero_buckets=false): a run of empty buckets becomes one.
  for (size_t i = 0; i < counts.size();) {
    double end = limits[i];
    double count = counts[i];
    ++i;
    if (count <= 0.0) {
      while (i < counts.size() && counts[i] <= 0.0) {
        end = limits[i];
        count = counts[i];
        ++i;
      }
    }
    proto.add_bucket_limit(end);
    proto.add_bucket(count);
  }
  return proto;
}

EventWriter::EventWriter(const std::filesystem::path& logdir, EventWriterOptions options)
    : path_(new_event_file(logdir, options.filename_suffix)), options_(std::move(options)), writer_(path_) {
  tf::Event version;
  version.set_wall_time(wall_time_now());
  version.set_file_version("brain.Event:2");
  writer_.write(version.SerializeAsString());
  writer_.flush();  // TensorBoard sees the run as soon as it starts
  flusher_ = std::thread([this] { flush_loop(); });
}

EventWriter::~EventWriter() {
  try {
    close();
  } catch (const std::exception&) {  // destructors must not throw; close() reports it
  }
}

void EventWriter::flush_loop() {
  std::unique_lock lock(mutex_);
  while (!closing_) {
    wake_.wait_for(lock, options_.flush_interval, [this] { return closing_; });
    if (dirty_ && !closed_) {
      try {
        writer_.flush();
      } catch (const std::exception& e) {  // keep the thread alive; close() will throw it again
        fmt::print(stderr, "[events] {}\n", e.what());
      }
      dirty_ = false;
    }
  }
}

void EventWriter::write(tf::Event event) {
  if (event.wall_time() == 0) event.set_wall_time(wall_time_now());
  std::string bytes = event.SerializeAsString();
  std::lock_guard lock(mutex_);
  if (closed_) throw Error(fmt::format("{}: event written after close", path_.string()));
  writer_.write(bytes);
  dirty_ = true;
}

void EventWriter::add_value(tf::Summary::Value value, int64_t step) {
  tf::Event event;
  event.set_step(step);
  *event.mutable_summary()->add_value() = std::move(value);
  write(std::move(event));
}

void EventWriter::add_scalar(std::string_view tag, double value, int64_t step) {
  tf::Summary::Value summary;
  summary.set_tag(std::string(tag));
  summary.set_simple_value(static_cast<float>(value));
  add_value(std::move(summary), step);
}

void EventWriter::add_histogram(std::string_view tag, std::span<const double> values, int64_t step) {
  // As TensorFlow's histogram summary op ("Nan in summary histogram for: ..."): a NaN or an
  // infinity has no bucket, and would make the sum meaningless.
  for (size_t i = 0; i < values.size(); ++i) {
    check(std::isfinite(values[i]), "histogram '{}': value {} of {} is {} (only finite values have a bucket)", tag, i,
          values.size(), values[i]);
  }
  tf::Summary::Value summary;
  summary.set_tag(std::string(tag));
  *summary.mutable_histo() = make_histogram(values);
  add_value(std::move(summary), step);
}

void EventWriter::add_histogram(std::string_view tag, std::span<const float> values, int64_t step) {
  std::vector<double> wide(values.begin(), values.end());
  add_histogram(tag, std::span<const double>(wide), step);
}

void EventWriter::add_text(std::string_view tag, std::string_view text, int64_t step) {
  tf::Summary::Value summary;
  summary.set_tag(std::string(tag));
  auto* metadata = summary.mutable_metadata();
  metadata->mutable_plugin_data()->set_plugin_name("text");
  metadata->set_data_class(tf::DATA_CLASS_TENSOR);
  auto* tensor = summary.mutable_tensor();
  tensor->set_dtype(tf::DT_STRING);
  tensor->mutable_tensor_shape();  // a scalar: a shape with no dims
  tensor->add_string_val(std::string(text));
  add_value(std::move(summary), step);
}

void EventWriter::flush() {
  std::lock_guard lock(mutex_);
  if (closed_) return;
  writer_.flush();
  dirty_ = false;
}

void EventWriter::close() {
  {
    std::lock_guard lock(mutex_);
    if (closed_) return;
    closing_ = true;
  }
  wake_.notify_all();
  if (flusher_.joinable()) flusher_.join();
  std::lock_guard lock(mutex_);
  writer_.close();  // may fail (a full disk): the events stay buffered and close() can be called again
  closed_ = true;
}

}  // namespace paraflow::data
