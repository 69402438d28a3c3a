#include "data/tfrecord.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "base/error.h"
#include "base/file_io.h"

namespace paraflow::data {

namespace {

// TFRecord integers are little-endian; so is every machine we build for (x86-64, aarch64).
static_assert(std::endian::native == std::endian::little);

template <typename T>
T load(const char* p) {
  T value;
  std::memcpy(&value, p, sizeof(T));
  return value;
}

template <typename T>
void store(char* p, T value) {
  std::memcpy(p, &value, sizeof(T));
}

void header(std::string_view data, char (&out)[kRecordHeaderSize]) {
  store<uint64_t>(out, data.size());
  store<uint32_t>(out + 8, mask_crc(crc32c(out, 8)));
}

}  // namespace

void frame_record(std::string_view data, std::string& out) {
  char head[kRecordHeaderSize];
  header(data, head);
  out.append(head, sizeof(head));
  out.append(data);
  char foot[kRecordFooterSize];
  store<uint32_t>(foot, mask_crc(crc32c(data.data(), data.size())));
  out.append(foot, sizeof(foot));
}

// --- writer -------------------------------------------------------------------------------

TFRecordWriter::TFRecordWriter(const std::filesystem::path& path, Compression compression, int level)
    : path_(path), stream_(open_output(path, compression, level)) {}

TFRecordWriter::~TFRecordWriter() {
  try {
    close();
  } catch (const std::exception&) {  // destructors must not throw; close() reports it
  }
}

void TFRecordWriter::write(std::string_view record) {
  if (closed_) throw Error(fmt::format("{}: write after close", path_.string()));
  char head[kRecordHeaderSize];
  header(record, head);
  char foot[kRecordFooterSize];
  store<uint32_t>(foot, mask_crc(crc32c(record.data(), record.size())));
  stream_->write(head, sizeof(head));
  stream_->write(record.data(), record.size());
  stream_->write(foot, sizeof(foot));
  ++records_;
}

void TFRecordWriter::close() {
  if (closed_) return;
  stream_->close();  // a failure (a full disk) leaves the writer open: close() may be tried again
  closed_ = true;
}

// --- reader -------------------------------------------------------------------------------

TFRecordReader::TFRecordReader(const std::filesystem::path& path, TFRecordReaderOptions options)
    : TFRecordReader(open_input(path, options.compression), std::move(options)) {}

TFRecordReader::TFRecordReader(std::unique_ptr<InputStream> stream, TFRecordReaderOptions options)
    : stream_(std::move(stream)), options_(std::move(options)) {
  if (!options_.log) options_.log = [](const std::string& message) { fmt::print(stderr, "[tfrecord] {}\n", message); };
  options_.buffer_size = std::max<size_t>(options_.buffer_size, 64);
  base_ = stream_->position();
}

bool TFRecordReader::ensure(size_t count) {
  while (available() < count) {
    if (eof_) return false;
    if (begin_ + count > buffer_.size() && begin_ > 0) {  // slide the unread bytes to the front
      std::memmove(buffer_.data(), buffer_.data() + begin_, available());
      base_ += begin_;
      end_ -= begin_;
      begin_ = 0;
    }
    if (end_ == buffer_.size()) {
      // Grow by doubling as data arrives, never straight to `count`: a corrupt length in a
      // compressed stream (whose size is unknown) must not allocate more than the file holds.
      buffer_.resize(std::max(options_.buffer_size, std::min(count, 2 * buffer_.size())));
    }
    size_t want = buffer_.size() - end_;
    size_t got = stream_->read(buffer_.data() + end_, want);
    end_ += got;
    // A short read is the end only for a plain file; a decompressor returns what it decoded
    // before damage, and says so (InputError) on the next read.
    if (got == 0 || (got < want && options_.compression == Compression::none)) eof_ = true;
  }
  return true;
}

std::optional<uint64_t> TFRecordReader::remaining() const {
  auto size = stream_->size();
  if (!size) return std::nullopt;
  return *size > offset() ? *size - offset() : 0;
}

TFRecordReader::Check TFRecordReader::check_record(uint64_t& length, std::string& why) {
  const uint64_t off = offset();
  auto where = [&] {
    return fmt::format("{}: byte offset {}{}", name(), off,
                       options_.compression == Compression::none ? "" : " (uncompressed)");
  };
  if (!ensure(kRecordHeaderSize)) {
    if (available() == 0) return Check::end;
    why = fmt::format("{}: truncated record header: the file ends {} bytes into the {}-byte header", where(),
                      available(), kRecordHeaderSize);
    return Check::truncated;
  }
  length = load<uint64_t>(at(0));
  if (unmask_crc(load<uint32_t>(at(8))) != crc32c(at(0), 8)) {
    why = fmt::format("{}: bad length CRC (length field reads {})", where(), length);
    return Check::bad_length_crc;
  }
  const uint64_t max_length = UINT64_MAX - kRecordHeaderSize - kRecordFooterSize;
  auto left = remaining();
  if (length > max_length || (left && length > *left - kRecordHeaderSize)) {
    why = fmt::format("{}: record length {} runs past the end of the file ({} bytes left after the header)",
                      where(), length, left ? *left - kRecordHeaderSize : 0);
    return Check::truncated;
  }
  const uint64_t total = kRecordHeaderSize + length + kRecordFooterSize;
  if (total > SIZE_MAX || !ensure(static_cast<size_t>(total))) {
    why = fmt::format("{}: truncated record: length {} needs {} bytes but the file ends after {}", where(), length,
                      total, available());
    return Check::truncated;
  }
  uint32_t stored = unmask_crc(load<uint32_t>(at(kRecordHeaderSize + length)));
  if (stored != crc32c(at(kRecordHeaderSize), length)) {
    why = fmt::format("{}: bad data CRC (record length {})", where(), length);
    return Check::bad_data_crc;
  }
  return Check::ok;
}

void TFRecordReader::skip(uint64_t bytes, const std::string& why) {
  stats_.skipped += 1;
  stats_.skipped_bytes += bytes;
  options_.log(why);
}

bool TFRecordReader::resync() {
  const uint64_t start = offset();
  uint64_t length = 0;
  std::string why;
  while (true) {
    ++begin_;  // available() >= 1 here: we stand on a header that did not check out
    Check check = check_record(length, why);
    if (check == Check::ok) {
      skip(offset() - start, fmt::format("{}: bad length CRC at byte offset {}; skipped {} bytes to the next good "
                                         "record at byte offset {}", name(), start, offset() - start, offset()));
      return true;
    }
    if (check == Check::end || check == Check::truncated) {
      uint64_t rest = remaining().value_or(available());
      skip(offset() - start + rest, fmt::format("{}: bad length CRC at byte offset {}; no good record after it, "
                                                "skipped the rest of the file", name(), start));
      stopped_ = true;
      return false;
    }
  }
}

std::optional<std::string_view> TFRecordReader::next() {
  if (stopped_) return std::nullopt;
  try {
    return next_record();
  } catch (const InputError& e) {  // under skip, only corrupt GZIP/ZLIB data: nothing after it decodes
    if (options_.policy == ErrorPolicy::fail) throw;
    skip(available(), fmt::format("{}; skipped the rest of the file", e.what()));
    stopped_ = true;
    return std::nullopt;
  }
}

std::optional<std::string_view> TFRecordReader::next_record() {
  while (true) {
    uint64_t length = 0;
    std::string why;
    Check check = check_record(length, why);
    if (check == Check::ok) {
      record_offset_ = offset();
      std::string_view record(at(kRecordHeaderSize), length);
      begin_ += kRecordHeaderSize + length + kRecordFooterSize;
      ++stats_.records;
      return record;
    }
    if (check == Check::end) return std::nullopt;
    if (options_.policy == ErrorPolicy::fail) throw InputError(why);
    switch (check) {
      case Check::bad_data_crc:
        skip(kRecordHeaderSize + length + kRecordFooterSize, why + "; skipped the record");
        begin_ += kRecordHeaderSize + length + kRecordFooterSize;
        break;
      case Check::bad_length_crc:
        if (!resync()) return std::nullopt;
        break;
      default:  // truncated: nothing after it can be framed
        skip(remaining().value_or(available()), why + "; skipped the rest of the file");
        stopped_ = true;
        return std::nullopt;
    }
  }
}

bool TFRecordReader::next(std::string& record) {
  auto view = next();
  if (!view) return false;
  record.assign(view->data(), view->size());
  return true;
}

void TFRecordReader::seek(uint64_t offset) {
  stopped_ = false;
  if (offset >= base_ && offset <= base_ + end_) {  // still buffered
    begin_ = static_cast<size_t>(offset - base_);
    return;
  }
  stream_->seek(offset);
  base_ = stream_->position();
  begin_ = end_ = 0;
  eof_ = false;
  // A plain file seeks past its end without complaint, a compressed one stops at it; an offset
  // there (a damaged or edited pipeline state) would read as a file done.
  const std::optional<uint64_t> size = stream_->size();
  check(stream_->position() == offset && (!size || offset <= *size),
        "{}: byte offset {} is past the end of the file ({} bytes{})", stream_->name(), offset,
        size ? *size : stream_->position(), size ? "" : " once decompressed");
}

std::vector<uint64_t> index_records(const std::filesystem::path& path, Compression compression) {
  TFRecordReaderOptions options;
  options.compression = compression;
  TFRecordReader reader(path, options);
  std::vector<uint64_t> offsets;
  while (true) {
    uint64_t offset = reader.offset();
    if (!reader.next()) break;
    offsets.push_back(offset);
  }
  return offsets;
}

Compression detect_compression(const std::filesystem::path& path) {
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (!file) throw IoError(fmt::format("{}: cannot open: {}", path.string(), std::strerror(errno)));
  unsigned char head[12] = {};
  const size_t got = std::fread(head, 1, sizeof head, file);
  std::fclose(file);
  if (got == 0) return Compression::none;
  if (got == sizeof head) {
    uint32_t stored = 0;
    std::memcpy(&stored, head + 8, 4);
    if (unmask_crc(stored) == crc32c(head, 8)) return Compression::none;
  }
  if (got >= 2 && head[0] == 0x1f && head[1] == 0x8b) return Compression::gzip;
  // RFC 1950: deflate with a window of at most 32 KiB, header check bits making a multiple of 31.
  if (got >= 2 && (head[0] & 0x0f) == 8 && (head[0] >> 4) <= 7 && (head[0] * 256 + head[1]) % 31 == 0) {
    return Compression::zlib;
  }
  fail("{}: not a TFRecord file (no valid record header at offset 0, and not GZIP or ZLIB compressed)", path.string());
}

}  // namespace paraflow::data
