// Event files: name, version record, scalars/histograms/text, flushing on a timer and on close.
#include "data/events.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>

#include <cmath>
#include <regex>
#include <thread>

#include "base/error.h"
#include "data/tfrecord.h"

namespace paraflow::data {
namespace {

namespace fs = std::filesystem;

fs::path fresh_dir(const std::string& name) {
  fs::path dir = fs::temp_directory_path() / fmt::format("paraflow_events_test.{}", ::getpid()) / name;
  fs::remove_all(dir);
  return dir;
}

std::vector<tf::Event> read_events(const fs::path& path) {
  TFRecordReader reader(path);
  std::vector<tf::Event> events;
  while (auto record = reader.next()) {
    tf::Event event;
    EXPECT_TRUE(event.ParseFromArray(record->data(), static_cast<int>(record->size())));
    events.push_back(event);
  }
  return events;
}

TEST(Events, FileNameVersionAndSummaries) {
  fs::path dir = fresh_dir("basic");
  EventWriter writer(dir);
  std::string name = writer.path().filename().string();
  EXPECT_TRUE(std::regex_match(name, std::regex(R"(events\.out\.tfevents\.\d{10}\.[^/]+)"))) << name;
  EXPECT_EQ(writer.path().parent_path(), dir);

  writer.add_scalar("train/loss", 2.5, 10);
  const std::vector<double> values = {-1.0, 0.0, 0.0, 0.5, 3.0};
  writer.add_histogram("weights", values, 11);
  writer.add_text("notes", "hello **world**", 12);
  writer.close();

  auto events = read_events(writer.path());
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events[0].file_version(), "brain.Event:2");
  EXPECT_GT(events[0].wall_time(), 1.6e9);
  EXPECT_EQ(events[1].step(), 10);
  EXPECT_EQ(events[1].summary().value(0).tag(), "train/loss");
  EXPECT_EQ(events[1].summary().value(0).simple_value(), 2.5f);

  const auto& histo = events[2].summary().value(0).histo();
  EXPECT_EQ(histo.num(), 5);
  EXPECT_EQ(histo.min(), -1.0);
  EXPECT_EQ(histo.max(), 3.0);
  EXPECT_EQ(histo.sum(), 2.5);
  EXPECT_EQ(histo.sum_squares(), 10.25);
  double total = 0;
  for (double count : histo.bucket()) total += count;
  EXPECT_EQ(total, 5);
  EXPECT_EQ(histo.bucket_size(), histo.bucket_limit_size());
  EXPECT_LT(histo.bucket_size(), 20);  // empty runs merged

  const auto& text = events[3].summary().value(0);
  EXPECT_EQ(text.metadata().plugin_data().plugin_name(), "text");
  EXPECT_EQ(text.tensor().dtype(), tf::DT_STRING);
  EXPECT_EQ(text.tensor().string_val(0), "hello **world**");
}

// A close that fails (a full disk: here a file-size limit) can be retried once the disk takes
// bytes again, and then every event is in the file. (The first close used to mark the writer
// closed before failing, so a second close returned at once and the events were lost.)
TEST(Events, AFailedCloseCanBeRetried) {
  fs::path dir = fresh_dir("retry");
  EventWriter writer(dir);
  rlimit unlimited{};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &unlimited), 0);
  auto previous = signal(SIGXFSZ, SIG_IGN);  // over the limit: EFBIG instead of the signal
  const std::string long_text(4000, 'x');
  for (int step = 0; step < 100; ++step) writer.add_text("notes", long_text, step);  // ~400 kB
  rlimit small = unlimited;
  small.rlim_cur = 50'000;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  EXPECT_THROW(writer.close(), IoError);
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &unlimited), 0);
  signal(SIGXFSZ, previous);
  writer.close();
  EXPECT_EQ(read_events(writer.path()).size(), 101u);  // the version record and 100 texts
}

// As TensorFlow's histogram summary: a NaN or an infinity is refused, naming the tag.
TEST(Events, NonFiniteHistogramValuesAreRefused) {
  EventWriter writer(fresh_dir("nan"));
  const std::vector<double> values = {1.0, std::nan(""), 2.0};
  try {
    writer.add_histogram("weights/h0", values, 1);
    ADD_FAILURE() << "a NaN was put in a histogram";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("histogram 'weights/h0': value 1 of 3 is nan"), std::string::npos) << e.what();
  }
}

TEST(Events, DefaultBucketsAreTensorFlows) {
  const auto& limits = default_histogram_limits();
  // TensorFlow's: 1e-12 * 1.1^k below 1e20 on each side (774 each), DBL_MAX, and 0.
  EXPECT_EQ(limits.size(), 2 * 774 + 2 + 1);
  EXPECT_EQ(limits[limits.size() / 2], 0.0);
  EXPECT_TRUE(std::is_sorted(limits.begin(), limits.end()));
  EXPECT_EQ(limits.back(), DBL_MAX);
}

TEST(Events, FlushesOnATimerWithoutClose) {
  fs::path dir = fresh_dir("timer");
  EventWriterOptions options;
  options.flush_interval = std::chrono::milliseconds(50);
  EventWriter writer(dir, options);
  const auto before = fs::file_size(writer.path());
  writer.add_scalar("x", 1.0, 1);
  for (int i = 0; i < 100 && fs::file_size(writer.path()) == before; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_GT(fs::file_size(writer.path()), before);
  EXPECT_EQ(read_events(writer.path()).size(), 2u);
}

TEST(Events, TwoWritersInOneSecondGetTwoFiles) {
  fs::path dir = fresh_dir("two");
  EventWriter a(dir), b(dir);
  EXPECT_NE(a.path(), b.path());
  a.close();
  b.close();
  EXPECT_EQ(read_events(a.path()).size(), 1u);
  EXPECT_EQ(read_events(b.path()).size(), 1u);
}

TEST(Events, ConcurrentWritersKeepEveryEvent) {
  fs::path dir = fresh_dir("threads");
  EventWriterOptions options;
  options.flush_interval = std::chrono::milliseconds(1);
  EventWriter writer(dir, options);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 500; ++i) writer.add_scalar(fmt::format("t{}", t), i, i);
    });
  }
  for (auto& thread : threads) thread.join();
  writer.close();
  EXPECT_EQ(read_events(writer.path()).size(), 1u + 4 * 500);
}

}  // namespace
}  // namespace paraflow::data
