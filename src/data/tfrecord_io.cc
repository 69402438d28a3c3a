#include "data/tfrecord_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "base/error.h"

namespace paraflow::data {

namespace {

constexpr size_t kChunk = 256 << 10;

// zlib's windowBits: 15 is the largest window; +16 selects the gzip wrapper instead of zlib's.
int window_bits(Compression compression) { return compression == Compression::gzip ? 15 + 16 : 15; }

std::string upper(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

class FileInput final : public InputStream {
 public:
  explicit FileInput(const std::filesystem::path& path) : name_(path.string()) {
    fd_ = ::open(name_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) throw IoError(fmt::format("{}: cannot open: {}", name_, std::strerror(errno)));
    struct stat st {};
    if (::fstat(fd_, &st) == 0 && S_ISREG(st.st_mode)) size_ = static_cast<uint64_t>(st.st_size);
  }
  ~FileInput() override { ::close(fd_); }

  size_t read(char* dst, size_t size) override {
    size_t done = 0;
    while (done < size) {
      ssize_t got = ::read(fd_, dst + done, size - done);
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) {
        throw IoError(fmt::format("{}: read at byte {} failed: {}", name_, position_, std::strerror(errno)));
      }
      if (got == 0) break;
      done += static_cast<size_t>(got);
      position_ += static_cast<uint64_t>(got);
    }
    return done;
  }
  void seek(uint64_t offset) override {
    if (::lseek(fd_, static_cast<off_t>(offset), SEEK_SET) < 0) {
      throw IoError(fmt::format("{}: seek to byte {} failed: {}", name_, offset, std::strerror(errno)));
    }
    position_ = offset;
  }
  uint64_t position() const override { return position_; }
  std::optional<uint64_t> size() const override { return size_; }
  const std::string& name() const override { return name_; }

 private:
  std::string name_;
  int fd_ = -1;
  uint64_t position_ = 0;
  std::optional<uint64_t> size_;
};

class MemoryInput final : public InputStream {
 public:
  MemoryInput(std::string data, std::string name) : data_(std::move(data)), name_(std::move(name)) {}
  size_t read(char* dst, size_t size) override {
    size_t n = std::min<uint64_t>(size, data_.size() - std::min<uint64_t>(position_, data_.size()));
    std::memcpy(dst, data_.data() + position_, n);
    position_ += n;
    return n;
  }
  void seek(uint64_t offset) override { position_ = std::min<uint64_t>(offset, data_.size()); }
  uint64_t position() const override { return position_; }
  std::optional<uint64_t> size() const override { return data_.size(); }
  const std::string& name() const override { return name_; }

 private:
  std::string data_;
  std::string name_;
  uint64_t position_ = 0;
};

// Decompresses a raw stream. Concatenated gzip members (as `cat a.gz b.gz` makes) read as one.
class InflateInput final : public InputStream {
 public:
  InflateInput(std::unique_ptr<InputStream> raw, Compression compression)
      : raw_(std::move(raw)), compression_(compression), in_(kChunk) {
    if (inflateInit2(&z_, window_bits(compression_)) != Z_OK) {
      throw Error(fmt::format("{}: inflateInit2 failed", raw_->name()));
    }
  }
  ~InflateInput() override { inflateEnd(&z_); }

  // What was decoded before damage is returned first; the error comes with the next read (a
  // reader that skips damage keeps the records before it).
  size_t read(char* dst, size_t size) override {
    if (!damage_.empty()) fail("{}", damage_);
    size_t done = 0;
    try {
      done = inflate_into(dst, size);
    } catch (const InputError& error) {
      if (done_before_damage_ == 0) throw;
      damage_ = error.what();
      done = done_before_damage_;
    }
    position_ += done;
    return done;
  }

  void seek(uint64_t offset) override {
    if (offset < position_) {
      raw_->seek(0);
      inflateReset(&z_);
      damage_.clear();
      z_.avail_in = 0;
      raw_eof_ = finished_ = in_member_ = false;
      position_ = 0;
    }
    std::vector<char> scratch(std::min<uint64_t>(kChunk, offset - position_ + 1));
    while (position_ < offset) {
      size_t want = static_cast<size_t>(std::min<uint64_t>(scratch.size(), offset - position_));
      if (read(scratch.data(), want) < want) break;  // past the end: stay at the end
    }
  }
  uint64_t position() const override { return position_; }
  std::optional<uint64_t> size() const override { return std::nullopt; }
  const std::string& name() const override { return raw_->name(); }

 private:
  size_t inflate_into(char* dst, size_t size) {
    size_t done = 0;
    done_before_damage_ = 0;
    while (done < size && !finished_) {
      if (z_.avail_in == 0) refill();
      if (z_.avail_in == 0 && raw_eof_) {
        if (!in_member_) {
          finished_ = true;
          break;
        }
        fail("{}: {} stream truncated at compressed byte {} (uncompressed byte {})", raw_->name(),
             compression_name(compression_), raw_->position(), position_ + done);
      }
      z_.next_out = reinterpret_cast<Bytef*>(dst + done);
      z_.avail_out = static_cast<uInt>(std::min<size_t>(size - done, 1u << 30));
      uInt before = z_.avail_out;
      int rc = inflate(&z_, Z_NO_FLUSH);
      done += before - z_.avail_out;
      done_before_damage_ = done;  // what inflate wrote before an error is good data
      if (rc == Z_STREAM_END) {
        in_member_ = false;
        inflateReset(&z_);  // another member may follow
      } else if (rc == Z_OK || rc == Z_BUF_ERROR) {
        in_member_ = true;
      } else {
        fail("{}: corrupt {} data near compressed byte {} (uncompressed byte {}): {}", raw_->name(),
             compression_name(compression_), raw_->position() - z_.avail_in, position_ + done,
             z_.msg ? z_.msg : "zlib error");
      }
    }
    return done;
  }

  void refill() {
    if (raw_eof_) return;
    size_t got = raw_->read(in_.data(), in_.size());
    if (got < in_.size()) raw_eof_ = true;
    z_.next_in = reinterpret_cast<Bytef*>(in_.data());
    z_.avail_in = static_cast<uInt>(got);
  }

  std::unique_ptr<InputStream> raw_;
  Compression compression_;
  std::vector<char> in_;
  z_stream z_{};
  uint64_t position_ = 0;
  bool raw_eof_ = false;
  bool finished_ = false;
  bool in_member_ = false;  // inside a compressed member that has not ended yet
  size_t done_before_damage_ = 0;  // inflate_into's bytes so far, for an error partway
  std::string damage_;             // the error to report on the next read, after the bytes before it
};

// Keeps every byte it accepts until the file has it: a write that fails (a full disk) leaves the
// rest buffered, and the next write, flush or close carries on from there, so that bytes are
// written once, in order, and a record is never cut by a retry. write() does not throw for such a
// failure (a record is several writes: throwing between them would leave half of it to be
// retried); flush() and close() do. Past kMaxBuffered waiting bytes the stream gives up for good.
class FileOutput final : public OutputStream {
 public:
  explicit FileOutput(const std::filesystem::path& path) : name_(path.string()) {
    fd_ = ::open(name_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) throw IoError(fmt::format("{}: cannot create: {}", name_, std::strerror(errno)));
    buffer_.reserve(kChunk);
  }
  ~FileOutput() override {
    if (fd_ >= 0) ::close(fd_);
  }

  void write(const char* data, size_t size) override {
    if (fd_ < 0) throw Error(fmt::format("{}: write after close", name_));
    if (!failure_.empty()) throw IoError(failure_);
    position_ += size;
    buffer_.insert(buffer_.end(), data, data + size);
    if (buffer_.size() < kChunk) return;
    try {
      drain();
    } catch (const IoError& error) {
      if (buffer_.size() <= kMaxBuffered) return;  // retried by the next write or flush
      failure_ = fmt::format("{} (and {} bytes could not be written after it)", error.what(), buffer_.size());
      throw IoError(failure_);
    }
  }
  void flush(bool durable) override {
    if (!failure_.empty()) throw IoError(failure_);
    drain();
    if (durable && ::fsync(fd_) != 0) {
      throw IoError(fmt::format("{}: fsync failed: {}", name_, std::strerror(errno)));
    }
  }
  void close() override {
    if (fd_ < 0) return;
    flush(true);  // a failure leaves the file open: close() may be tried again
    int rc = ::close(fd_);
    fd_ = -1;
    if (rc != 0) throw IoError(fmt::format("{}: close failed: {}", name_, std::strerror(errno)));
  }
  uint64_t position() const override { return position_; }
  const std::string& name() const { return name_; }

 private:
  // Writes the buffer out; what a failure leaves unwritten stays at its front.
  void drain() {
    size_t done = 0;
    while (done < buffer_.size()) {
      const ssize_t put = ::write(fd_, buffer_.data() + done, buffer_.size() - done);
      if (put < 0 && errno == EINTR) continue;
      if (put < 0) {
        const int error = errno;
        buffer_.erase(buffer_.begin(), buffer_.begin() + static_cast<std::ptrdiff_t>(done));
        throw IoError(fmt::format("{}: write failed: {}", name_, std::strerror(error)));
      }
      done += static_cast<size_t>(put);
    }
    buffer_.clear();
  }

  static constexpr size_t kMaxBuffered = size_t{64} << 20;
  std::string name_;
  int fd_ = -1;
  std::vector<char> buffer_;
  uint64_t position_ = 0;
  std::string failure_;  // set once the stream has given up: every later call fails with it
};

class DeflateOutput final : public OutputStream {
 public:
  DeflateOutput(std::unique_ptr<FileOutput> file, Compression compression, int level)
      : file_(std::move(file)), out_(kChunk) {
    if (deflateInit2(&z_, level, Z_DEFLATED, window_bits(compression), 8, Z_DEFAULT_STRATEGY) != Z_OK) {
      throw InputError(fmt::format("{}: deflateInit2 failed (level {})", file_->name(), level));
    }
  }
  ~DeflateOutput() override { deflateEnd(&z_); }

  void write(const char* data, size_t size) override {
    if (closed_) throw Error(fmt::format("{}: write after close", file_->name()));
    position_ += size;
    while (size > 0) {  // avail_in is 32-bit: feed at most 1 GiB at a time
      uInt part = static_cast<uInt>(std::min<size_t>(size, 1u << 30));
      pump(data, part, Z_NO_FLUSH);
      data += part;
      size -= part;
    }
  }
  void flush(bool durable) override {
    if (closed_) return;
    pump(nullptr, 0, Z_SYNC_FLUSH);
    file_->flush(durable);
  }
  void close() override {
    if (!closed_) {
      pump(nullptr, 0, Z_FINISH);
      closed_ = true;
    }
    file_->close();  // again on a retry, when the file could not take the last bytes
  }
  uint64_t position() const override { return position_; }

 private:
  void pump(const char* data, uInt size, int mode) {
    z_.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data));
    z_.avail_in = size;
    while (true) {
      z_.next_out = reinterpret_cast<Bytef*>(out_.data());
      z_.avail_out = static_cast<uInt>(out_.size());
      int rc = deflate(&z_, mode);
      if (rc == Z_STREAM_ERROR) throw Error(fmt::format("{}: deflate failed", file_->name()));
      file_->write(out_.data(), out_.size() - z_.avail_out);
      if (mode == Z_FINISH ? rc == Z_STREAM_END : (z_.avail_in == 0 && z_.avail_out != 0)) break;
    }
  }

  std::unique_ptr<FileOutput> file_;
  std::vector<char> out_;
  z_stream z_{};
  uint64_t position_ = 0;
  bool closed_ = false;
};

}  // namespace

Compression parse_compression(std::string_view name) {
  std::string key = upper(name);
  if (key.empty() || key == "NONE") return Compression::none;
  if (key == "GZIP") return Compression::gzip;
  if (key == "ZLIB") return Compression::zlib;
  fail("unknown TFRecord compression '{}' (expected NONE, GZIP or ZLIB)", name);
}

std::string_view compression_name(Compression compression) {
  switch (compression) {
    case Compression::none: return "NONE";
    case Compression::gzip: return "GZIP";
    case Compression::zlib: return "ZLIB";
  }
  return "?";
}

std::unique_ptr<InputStream> open_input(const std::filesystem::path& path, Compression compression) {
  auto file = std::make_unique<FileInput>(path);
  if (compression == Compression::none) return file;
  return std::make_unique<InflateInput>(std::move(file), compression);
}

std::unique_ptr<InputStream> memory_input(std::string data, Compression compression, std::string name) {
  auto memory = std::make_unique<MemoryInput>(std::move(data), std::move(name));
  if (compression == Compression::none) return memory;
  return std::make_unique<InflateInput>(std::move(memory), compression);
}

std::unique_ptr<OutputStream> open_output(const std::filesystem::path& path, Compression compression,
                                          int level) {
  auto file = std::make_unique<FileOutput>(path);
  if (compression == Compression::none) return file;
  return std::make_unique<DeflateOutput>(std::move(file), compression, level);
}

}  // namespace paraflow::data
