#include "base/file_io.h"

#include <fcntl.h>
#include <glob.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <fstream>

#include "base/error.h"

namespace paraflow {

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError(fmt::format("{}: cannot open for reading: {}", path.string(), std::strerror(errno)));
  std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw IoError(fmt::format("{}: read failed", path.string()));
  return content;
}

namespace {

void write_all(int fd, const char* data, size_t size, const std::filesystem::path& path) {
  while (size > 0) {
    ssize_t written = ::write(fd, data, size);
    if (written < 0) {
      if (errno == EINTR) continue;
      throw IoError(fmt::format("{}: write failed: {}", path.string(), std::strerror(errno)));
    }
    data += written;
    size -= static_cast<size_t>(written);
  }
}

}  // namespace

std::vector<std::filesystem::path> list_files(const std::string& pattern) {
  std::vector<std::filesystem::path> files;
  if (std::filesystem::is_directory(pattern)) {
    for (auto entry = std::filesystem::recursive_directory_iterator(pattern);
         entry != std::filesystem::recursive_directory_iterator(); ++entry) {
      const bool hidden = entry->path().filename().string().front() == '.';
      if (hidden && entry->is_directory()) entry.disable_recursion_pending();  // .git, .ipynb_checkpoints
      if (!hidden && entry->is_regular_file()) files.push_back(entry->path());
    }
  } else {
    glob_t matches{};
    if (::glob(pattern.c_str(), 0, nullptr, &matches) == 0) {
      for (size_t i = 0; i < matches.gl_pathc; ++i) {
        if (std::filesystem::is_regular_file(matches.gl_pathv[i])) files.emplace_back(matches.gl_pathv[i]);
      }
    }
    globfree(&matches);
  }
  std::sort(files.begin(), files.end());
  return files;
}

void fsync_directory(const std::filesystem::path& dir) {
  int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) throw IoError(fmt::format("{}: cannot open directory: {}", dir.string(), std::strerror(errno)));
  const int synced = ::fsync(fd);
  const int error = errno;
  ::close(fd);
  // EINVAL, EROFS: the filesystem does not sync directories (some network and FUSE ones).
  if (synced != 0 && error != EINVAL && error != EROFS) {
    throw IoError(fmt::format("{}: fsync failed: {}", dir.string(), std::strerror(error)));
  }
}

AtomicFileWriter::AtomicFileWriter(std::filesystem::path path) : path_(std::move(path)) {
  temporary_ = path_;
  temporary_ += fmt::format(".tmp.{}", ::getpid());
  fd_ = ::open(temporary_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd_ < 0) throw IoError(fmt::format("{}: cannot create: {}", temporary_.string(), std::strerror(errno)));
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ < 0) return;
  ::close(fd_);
  ::unlink(temporary_.c_str());
}

void AtomicFileWriter::append(std::string_view bytes) { write_all(fd_, bytes.data(), bytes.size(), temporary_); }

void AtomicFileWriter::commit() {
  if (::fsync(fd_) != 0) throw IoError(fmt::format("{}: fsync failed: {}", temporary_.string(), std::strerror(errno)));
  ::close(fd_);
  fd_ = -1;
  if (::rename(temporary_.c_str(), path_.c_str()) != 0) {
    const int error = errno;
    ::unlink(temporary_.c_str());
    throw IoError(fmt::format("{}: rename failed: {}", path_.string(), std::strerror(error)));
  }
  fsync_directory(path_.parent_path());
}

void write_file_atomic(const std::filesystem::path& path, std::string_view content) {
  AtomicFileWriter writer(path);
  writer.append(content);
  writer.commit();
}

FileChecksum checksum_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError(fmt::format("{}: cannot open for reading: {}", path.string(), std::strerror(errno)));
  FileChecksum checksum;
  std::vector<char> block(1 << 20);
  while (in) {
    in.read(block.data(), static_cast<std::streamsize>(block.size()));
    const auto got = static_cast<size_t>(in.gcount());
    checksum.crc32c = crc32c(block.data(), got, checksum.crc32c);
    checksum.bytes += got;
  }
  if (in.bad()) throw IoError(fmt::format("{}: read failed", path.string()));
  return checksum;
}

#if !defined(__SSE4_2__)
namespace {

// Byte-at-a-time table for CPUs without SSE4.2's crc32 instruction.
std::array<uint32_t, 256> make_crc32c_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t crc = i;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
    table[i] = crc;
  }
  return table;
}

}  // namespace
#endif

uint32_t crc32c(const void* data, size_t size, uint32_t crc) {
  const auto* bytes = static_cast<const uint8_t*>(data);
  crc = ~crc;
#if defined(__SSE4_2__)
  while (size >= 8) {
    uint64_t word;
    std::memcpy(&word, bytes, 8);
    crc = static_cast<uint32_t>(__builtin_ia32_crc32di(crc, word));
    bytes += 8;
    size -= 8;
  }
  while (size > 0) {
    crc = __builtin_ia32_crc32qi(crc, *bytes++);
    --size;
  }
#else
  static const std::array<uint32_t, 256> table = make_crc32c_table();
  while (size > 0) {
    crc = table[(crc ^ *bytes++) & 0xFFu] ^ (crc >> 8);
    --size;
  }
#endif
  return ~crc;
}

}  // namespace paraflow
