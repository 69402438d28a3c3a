// TFRecord files, framed exactly as TensorFlow's record_writer.cc frames them:
//
//   uint64 length (little-endian) | uint32 masked_crc32c(length) | data | uint32 masked_crc32c(data)
//
// optionally inside one GZIP or ZLIB stream. Offsets below are byte offsets in the uncompressed
// record stream: offset 0 is the first record, and a reader positioned at `offset()` and later
// `seek()`ed back there reads the same records again, which is what an input pipeline stores in a
// checkpoint as "file k, offset o".
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "data/tfrecord_io.h"

namespace paraflow::data {

// TensorFlow's CRC mask: a CRC of data that itself contains CRCs is weak, so stored CRCs are
// rotated and offset.
constexpr uint32_t kCrcMaskDelta = 0xa282ead8u;
inline uint32_t mask_crc(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + kCrcMaskDelta; }
inline uint32_t unmask_crc(uint32_t masked) {
  uint32_t rot = masked - kCrcMaskDelta;
  return (rot >> 17) | (rot << 15);
}

constexpr size_t kRecordHeaderSize = 12;  // length + its CRC
constexpr size_t kRecordFooterSize = 4;   // CRC of the data

// Appends the complete framing of one record to `out` (used by the writer and by tests).
void frame_record(std::string_view data, std::string& out);

class TFRecordWriter {
 public:
  // Creates (truncates) `path`. `level`: zlib's compression level, -1 for its default.
  explicit TFRecordWriter(const std::filesystem::path& path, Compression compression = Compression::none,
                          int level = -1);
  ~TFRecordWriter();  // closes; an error there is lost, so call close() to see it
  TFRecordWriter(const TFRecordWriter&) = delete;
  TFRecordWriter& operator=(const TFRecordWriter&) = delete;

  void write(std::string_view record);
  // Offset at which the next record will start (the bytes written so far, uncompressed).
  uint64_t offset() const { return stream_->position(); }
  uint64_t records() const { return records_; }
  // Makes the records written so far readable by others; `durable` also fsyncs.
  void flush(bool durable = false) { stream_->flush(durable); }
  void close();
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  std::unique_ptr<OutputStream> stream_;
  uint64_t records_ = 0;
  bool closed_ = false;
};

// What a reader does with a corrupt record.
//  fail: throw InputError naming the file and byte offset.
//  skip: log it, count it in stats(), and go on:
//   - bad data CRC (the length's CRC is good, so the length is trusted): skip that one record;
//   - bad length CRC: the length cannot be trusted, so scan forward one byte at a time for the
//     next offset where a whole record checks out (both CRCs good) and resume there; the bytes
//     in between count as one skipped region (how many records it held is unknown);
//   - truncated record / length beyond the end of the file, or corrupt GZIP/ZLIB data (which
//     cannot be resynchronised): skip the rest of the file.
//  Under skip, next() throws only IoError (the operating system failed), never InputError.
enum class ErrorPolicy { fail, skip };

struct TFRecordStats {
  uint64_t records = 0;        // good records returned
  uint64_t skipped = 0;        // corrupt records or regions skipped (policy skip)
  uint64_t skipped_bytes = 0;  // bytes in them
};

struct TFRecordReaderOptions {
  Compression compression = Compression::none;
  ErrorPolicy policy = ErrorPolicy::fail;
  // Called with a message for every skip; the default prints it on stderr.
  std::function<void(const std::string&)> log;
  size_t buffer_size = 256 << 10;  // grows for larger records
};

class TFRecordReader {
 public:
  explicit TFRecordReader(const std::filesystem::path& path, TFRecordReaderOptions options = {});
  // Reads an already opened stream (the stream decompresses, if it is compressed).
  TFRecordReader(std::unique_ptr<InputStream> stream, TFRecordReaderOptions options);

  // The next record, valid until the next call to next() or seek(); nullopt at the end.
  std::optional<std::string_view> next();
  // Copying form: false at the end.
  bool next(std::string& record);

  // Offset of the record that next() returns next.
  uint64_t offset() const { return base_ + begin_; }
  // Offset of the record that the last next() returned (error messages of the layers above).
  uint64_t record_offset() const { return record_offset_; }
  // Moves to a record boundary obtained from offset() or an index. Cheap on uncompressed files;
  // compressed ones decompress from the start when moving backwards (see InputStream::seek).
  void seek(uint64_t offset);

  const TFRecordStats& stats() const { return stats_; }
  const std::string& name() const { return stream_->name(); }

 private:
  // Makes `count` bytes from the current position contiguous in the buffer; false if the stream
  // ends first (then available() tells how many there are).
  bool ensure(size_t count);
  size_t available() const { return end_ - begin_; }
  const char* at(size_t pos) const { return buffer_.data() + begin_ + pos; }
  // The stream bytes left from the current position, when the stream's size is known.
  std::optional<uint64_t> remaining() const;

  enum class Check { ok, end, bad_length_crc, bad_data_crc, truncated };
  // Checks the record at the current position without consuming it.
  Check check_record(uint64_t& length, std::string& why);
  void skip(uint64_t bytes, const std::string& why);
  bool resync();
  std::optional<std::string_view> next_record();

  std::unique_ptr<InputStream> stream_;
  TFRecordReaderOptions options_;
  std::string buffer_;
  size_t begin_ = 0, end_ = 0;  // unread bytes are buffer_[begin_, end_)
  uint64_t base_ = 0;           // stream offset of buffer_[0]
  bool eof_ = false;      // the stream has no bytes past end_
  bool stopped_ = false;  // policy skip gave up on the rest of the file
  uint64_t record_offset_ = 0;
  TFRecordStats stats_;
};

// A TFRecord file's compression from its first bytes: a valid record header (length and its
// masked CRC) means none, else the gzip magic or a zlib header; anything else is an InputError
// naming the file. An empty file is uncompressed.
Compression detect_compression(const std::filesystem::path& path);

// Offsets of every record in a file (reads it once, policy fail): a pipeline's random access.
std::vector<uint64_t> index_records(const std::filesystem::path& path, Compression compression = Compression::none);

}  // namespace paraflow::data
