// TFRecord framing, compression, offsets/seek, and every corruption case under both policies.
#include "data/tfrecord.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <filesystem>
#include <random>

#include "base/error.h"
#include "base/file_io.h"

namespace paraflow::data {
namespace {

namespace fs = std::filesystem;

fs::path temp_dir() {
  static fs::path dir = [] {
    fs::path d = fs::temp_directory_path() / fmt::format("paraflow_tfrecord_test.{}", ::getpid());
    fs::create_directories(d);
    return d;
  }();
  return dir;
}

std::string random_bytes(std::mt19937_64& rng, size_t size) {
  std::string out(size, '\0');
  for (char& c : out) c = static_cast<char>(rng());
  return out;
}

// Records of awkward sizes: empty, tiny, around the reader's 256 KiB buffer, over 1 MB.
std::vector<std::string> sample_records() {
  std::mt19937_64 rng(7);
  std::vector<std::string> records;
  for (size_t size : {0, 1, 11, 12, 100, 4096, (256 << 10) - 16, (256 << 10) + 5, 1 << 20, 3 << 20, 7}) {
    records.push_back(random_bytes(rng, size));
  }
  return records;
}

std::vector<std::string> read_all(TFRecordReader& reader) {
  std::vector<std::string> out;
  std::string record;
  while (reader.next(record)) out.push_back(record);
  return out;
}

TEST(TFRecord, CrcMaskMatchesTensorFlow) {
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);  // the CRC-32C check value
  for (uint32_t crc : {0u, 1u, 0xE3069283u, 0xFFFFFFFFu}) EXPECT_EQ(unmask_crc(mask_crc(crc)), crc);
  // TensorFlow's framing of an empty record: 8 zero bytes, masked CRC of them, masked CRC of "".
  std::string framed;
  frame_record("", framed);
  ASSERT_EQ(framed.size(), 16u);
  EXPECT_EQ(framed.substr(0, 8), std::string(8, '\0'));
  uint32_t length_crc, data_crc;
  std::memcpy(&length_crc, framed.data() + 8, 4);
  std::memcpy(&data_crc, framed.data() + 12, 4);
  EXPECT_EQ(length_crc, mask_crc(crc32c(std::string(8, '\0').data(), 8)));
  EXPECT_EQ(data_crc, mask_crc(0));
  EXPECT_EQ(data_crc, 0xa282ead8u);  // masked CRC of nothing is the mask delta itself
}

class RoundTrip : public ::testing::TestWithParam<Compression> {};

TEST_P(RoundTrip, WritesReadsSeeksAndIndexes) {
  const Compression compression = GetParam();
  const fs::path path = temp_dir() / fmt::format("round_trip.{}", compression_name(compression));
  const auto records = sample_records();
  std::vector<uint64_t> offsets;
  {
    TFRecordWriter writer(path, compression);
    for (const auto& record : records) {
      offsets.push_back(writer.offset());
      writer.write(record);
    }
    EXPECT_EQ(writer.records(), records.size());
    writer.close();
  }
  if (compression != Compression::none) {
    EXPECT_LT(fs::file_size(path), 6u << 20);  // random data barely compresses, but it is a zlib stream
    std::string head = read_file(path).substr(0, 2);
    if (compression == Compression::gzip) {
      EXPECT_EQ(head, "\x1f\x8b");
    } else {
      EXPECT_EQ(static_cast<uint8_t>(head[0]) & 0x0f, 8);  // zlib header: deflate
    }
  }

  TFRecordReaderOptions options;
  options.compression = compression;
  TFRecordReader reader(path, options);
  EXPECT_EQ(read_all(reader), records);
  EXPECT_EQ(reader.stats().records, records.size());
  EXPECT_EQ(reader.stats().skipped, 0u);
  EXPECT_EQ(index_records(path, compression), offsets);

  // Seek backwards and forwards to record boundaries, as a resumed pipeline does.
  for (size_t k : {3u, 0u, 9u, 5u, 10u}) {
    reader.seek(offsets[k]);
    EXPECT_EQ(reader.offset(), offsets[k]);
    auto record = reader.next();
    ASSERT_TRUE(record) << k;
    EXPECT_EQ(*record, records[k]) << k;
    EXPECT_EQ(reader.record_offset(), offsets[k]);
  }
}

INSTANTIATE_TEST_SUITE_P(Compressions, RoundTrip,
                         ::testing::Values(Compression::none, Compression::gzip, Compression::zlib),
                         [](const auto& info) { return std::string(compression_name(info.param)); });

// A disk that refuses bytes for a while (here a file-size limit, failing writes as a full disk
// would): the flush fails naming the file, and once the disk takes bytes again the next flush
// writes the rest. Every record is in the file once, in order, readable; nothing is repeated
// (a retry that rewrote what the failed write had put down would break the framing).
TEST_P(RoundTrip, AWriteTheDiskRefusesIsRetriedWithoutLossOrRepeats) {
  const Compression compression = GetParam();
  const fs::path path = temp_dir() / fmt::format("refused.{}", compression_name(compression));
  std::mt19937_64 rng(11);
  std::vector<std::string> records;
  for (int i = 0; i < 300; ++i) records.push_back(random_bytes(rng, 3000 + static_cast<size_t>(i)));
  rlimit unlimited{};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &unlimited), 0);
  auto previous = signal(SIGXFSZ, SIG_IGN);  // over the limit: EFBIG instead of the signal
  {
    TFRecordWriter writer(path, compression);
    rlimit small = unlimited;
    small.rlim_cur = 100'000;
    ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
    for (const auto& record : records) writer.write(record);  // ~1 MB: writes past 100 kB fail
    try {
      writer.flush();
      ADD_FAILURE() << "the flush should fail over the limit";
    } catch (const IoError& error) {
      EXPECT_NE(std::string(error.what()).find(path.string()), std::string::npos) << error.what();
    }
    ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &unlimited), 0);
    writer.close();
  }
  signal(SIGXFSZ, previous);
  TFRecordReaderOptions options;
  options.compression = compression;
  TFRecordReader reader(path, options);
  EXPECT_EQ(read_all(reader), records);
}

TEST(TFRecord, ParsesCompressionNames) {
  EXPECT_EQ(parse_compression(""), Compression::none);
  EXPECT_EQ(parse_compression("gzip"), Compression::gzip);
  EXPECT_EQ(parse_compression("ZLIB"), Compression::zlib);
  EXPECT_THROW(parse_compression("zstd"), InputError);
}

TEST(TFRecord, EmptyFileHasNoRecords) {
  const fs::path path = temp_dir() / "empty.tfrecord";
  write_file_atomic(path, "");
  TFRecordReader reader(path);
  EXPECT_FALSE(reader.next());
}

// --- corruption ---------------------------------------------------------------------------

struct Framed {
  std::string bytes;
  std::vector<uint64_t> offsets;
};

Framed frame(const std::vector<std::string>& records) {
  Framed out;
  for (const auto& record : records) {
    out.offsets.push_back(out.bytes.size());
    frame_record(record, out.bytes);
  }
  return out;
}

// Writes `bytes` (the uncompressed record stream) to a file, compressed as asked.
fs::path write_raw(const std::string& name, const std::string& bytes, Compression compression) {
  fs::path path = temp_dir() / name;
  auto out = open_output(path, compression);
  out->write(bytes.data(), bytes.size());
  out->close();
  return path;
}

std::string expect_input_error(const fs::path& path, Compression compression) {
  TFRecordReaderOptions options;
  options.compression = compression;
  TFRecordReader reader(path, options);
  try {
    read_all(reader);
  } catch (const InputError& e) {
    return e.what();
  }
  ADD_FAILURE() << path << ": no InputError";
  return "";
}

class Corruption : public ::testing::TestWithParam<Compression> {};

TEST_P(Corruption, FailPolicyNamesFileAndOffset) {
  const Compression compression = GetParam();
  const std::vector<std::string> records = {"first record", std::string(1000, 'x'), "third"};
  const Framed good = frame(records);
  const uint64_t second = good.offsets[1], third = good.offsets[2];
  const std::string tag(compression_name(compression));
  auto expect = [&](const std::string& name, std::string bytes, uint64_t offset, const std::string& what) {
    fs::path path = write_raw(name + "." + tag, bytes, compression);
    std::string message = expect_input_error(path, compression);
    EXPECT_NE(message.find(path.string()), std::string::npos) << message;
    EXPECT_NE(message.find(fmt::format("byte offset {}", offset)), std::string::npos) << message;
    EXPECT_NE(message.find(what), std::string::npos) << message;
  };

  std::string bytes = good.bytes;
  bytes[second + 9] ^= 0x01;  // inside the length's CRC
  expect("bad_length_crc", bytes, second, "bad length CRC");

  bytes = good.bytes;
  bytes[second + 2] ^= 0x40;  // the length itself: its CRC no longer matches
  expect("bad_length", bytes, second, "bad length CRC");

  bytes = good.bytes;
  bytes[second + kRecordHeaderSize + 500] ^= 0x01;  // a data byte
  expect("bad_data_crc", bytes, second, "bad data CRC");

  bytes = good.bytes;
  bytes[third - 1] ^= 0x01;  // the data CRC itself
  expect("bad_data_crc2", bytes, second, "bad data CRC");

  expect("truncated_header", good.bytes.substr(0, third + 5), third, "truncated record header");
  expect("truncated_footer", good.bytes.substr(0, good.bytes.size() - 2), third,
         compression == Compression::none ? "truncated record" : "truncated record");
  // A length that passes its CRC but claims more than the file holds.
  std::string huge = good.bytes.substr(0, third);
  huge.append(frame({std::string(64, 'y')}).bytes.substr(0, kRecordHeaderSize + 10));
  uint64_t length = uint64_t{1} << 40;
  std::memcpy(huge.data() + third, &length, 8);
  uint32_t crc = mask_crc(crc32c(huge.data() + third, 8));
  std::memcpy(huge.data() + third + 8, &crc, 4);
  expect("length_beyond_file", huge, third,
         compression == Compression::none ? "runs past the end of the file" : "truncated record");
}

INSTANTIATE_TEST_SUITE_P(Compressions, Corruption,
                         ::testing::Values(Compression::none, Compression::gzip, Compression::zlib),
                         [](const auto& info) { return std::string(compression_name(info.param)); });

TEST(TFRecord, TruncatedGzipStreamNamesTheFile) {
  const Framed good = frame({"a", "b", std::string(5000, 'c')});
  fs::path path = write_raw("cut.gz", good.bytes, Compression::gzip);
  std::string compressed = read_file(path);
  write_file_atomic(path, compressed.substr(0, compressed.size() - 10));
  std::string message = expect_input_error(path, Compression::gzip);
  EXPECT_NE(message.find(path.string()), std::string::npos) << message;
  EXPECT_NE(message.find("GZIP"), std::string::npos) << message;
}

// Under the skip policy a damaged compressed file keeps the records decoded before the damage
// (they were all lost when the damage fell in the reader's first 256 KiB).
TEST(TFRecord, SkipPolicyKeepsTheRecordsBeforeCompressedDamage) {
  std::vector<std::string> records;
  for (int i = 0; i < 50; ++i) records.push_back(fmt::format("record {} {}", i, std::string(1000, 'a' + i % 26)));
  const fs::path path = write_raw("cut_skip.gz", frame(records).bytes, Compression::gzip);
  const std::string compressed = read_file(path);
  write_file_atomic(path, compressed.substr(0, compressed.size() - 10));
  std::vector<std::string> logs;
  TFRecordReaderOptions options;
  options.compression = Compression::gzip;
  options.policy = ErrorPolicy::skip;
  options.log = [&](const std::string& message) { logs.push_back(message); };
  TFRecordReader reader(path, options);
  const std::vector<std::string> got = read_all(reader);
  ASSERT_GE(got.size(), 45u);
  EXPECT_EQ(got, std::vector<std::string>(records.begin(), records.begin() + static_cast<std::ptrdiff_t>(got.size())));
  EXPECT_EQ(reader.stats().skipped, 1u);
  ASSERT_EQ(logs.size(), 1u);
  EXPECT_NE(logs[0].find("GZIP"), std::string::npos) << logs[0];
}

TEST(TFRecord, SkipPolicyCountsLogsAndResyncs) {
  std::vector<std::string> records;
  for (int i = 0; i < 8; ++i) records.push_back(fmt::format("record {} {}", i, std::string(i * 37, 'z')));
  const Framed good = frame(records);
  std::string bytes = good.bytes;
  bytes[good.offsets[1] + kRecordHeaderSize] ^= 0x01;  // 1: bad data CRC -> that record is skipped
  bytes[good.offsets[3] + 8] ^= 0x01;                  // 3: bad length CRC -> resync at 4
  bytes[good.offsets[5] + 3] ^= 0x10;                  // 5: corrupt length -> resync at 6
  bytes.resize(good.offsets[7] + 20);                  // 7: truncated -> end of file

  for (Compression compression : {Compression::none, Compression::gzip}) {
    fs::path path = write_raw(fmt::format("skip.{}", compression_name(compression)), bytes, compression);
    std::vector<std::string> logs;
    TFRecordReaderOptions options;
    options.compression = compression;
    options.policy = ErrorPolicy::skip;
    options.log = [&](const std::string& message) { logs.push_back(message); };
    TFRecordReader reader(path, options);
    std::vector<std::string> got = read_all(reader);
    EXPECT_EQ(got, (std::vector<std::string>{records[0], records[2], records[4], records[6]}));
    EXPECT_EQ(reader.stats().records, 4u);
    EXPECT_EQ(reader.stats().skipped, 4u);
    ASSERT_EQ(logs.size(), 4u);
    for (const auto& log : logs) EXPECT_NE(log.find(path.string()), std::string::npos) << log;
    EXPECT_NE(logs[0].find(fmt::format("byte offset {}", good.offsets[1])), std::string::npos) << logs[0];
    EXPECT_NE(logs[1].find(fmt::format("next good record at byte offset {}", good.offsets[4])), std::string::npos)
        << logs[1];
    EXPECT_EQ(reader.stats().skipped_bytes, (good.offsets[2] - good.offsets[1]) + (good.offsets[4] - good.offsets[3]) +
                                                (good.offsets[6] - good.offsets[5]) + (bytes.size() - good.offsets[7]));
    EXPECT_FALSE(reader.next());  // stays at the end
  }
}

TEST(TFRecord, SkipPolicyWithNothingGoodAfterCorruption) {
  const Framed good = frame({"only", "two"});
  std::string bytes = good.bytes;
  bytes[good.offsets[1] + 8] ^= 0xff;
  TFRecordReaderOptions options;
  options.policy = ErrorPolicy::skip;
  options.log = [](const std::string&) {};
  TFRecordReader reader(memory_input(bytes, Compression::none), options);
  EXPECT_EQ(read_all(reader), std::vector<std::string>{"only"});
  EXPECT_EQ(reader.stats().skipped, 1u);
  EXPECT_EQ(reader.stats().skipped_bytes, bytes.size() - good.offsets[1]);
}

// Random damage: policy fail throws only InputError; policy skip never throws and returns a
// subsequence of the records that were written (libFuzzer explores further: tfrecord_fuzz.cc).
TEST(TFRecord, RandomDamageNeverMisreads) {
  std::mt19937_64 rng(12345);
  std::vector<std::string> records;
  for (int i = 0; i < 40; ++i) records.push_back(random_bytes(rng, rng() % 300));
  const Framed good = frame(records);
  for (int trial = 0; trial < 300; ++trial) {
    std::string bytes = good.bytes;
    int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f) bytes[rng() % bytes.size()] ^= static_cast<char>(1 + rng() % 255);
    if (rng() % 3 == 0) bytes.resize(rng() % bytes.size());

    TFRecordReaderOptions options;
    options.policy = ErrorPolicy::skip;
    options.log = [](const std::string&) {};
    TFRecordReader skipping(memory_input(bytes, Compression::none), options);
    std::vector<std::string> got = read_all(skipping);
    size_t next = 0;
    for (const auto& record : got) {
      while (next < records.size() && records[next] != record) ++next;
      ASSERT_LT(next, records.size()) << "trial " << trial << ": a record that was never written";
      ++next;
    }
    options.policy = ErrorPolicy::fail;
    TFRecordReader failing(memory_input(bytes, Compression::none), options);
    try {
      read_all(failing);
    } catch (const InputError&) {
    }
  }
}

}  // namespace
}  // namespace paraflow::data
