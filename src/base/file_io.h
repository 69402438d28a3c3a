// Whole-file reads and crash-safe writes (temporary name, fsync, rename, fsync of the directory).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace paraflow {

std::string read_file(const std::filesystem::path& path);

// Writes `content` so that `path` holds either its old content or all of the new one, never a
// torn mix, even if the process dies mid-way.
void write_file_atomic(const std::filesystem::path& path, std::string_view content);

// write_file_atomic piece by piece, for files larger than one wants in memory at once: appends go
// to a temporary file; commit() fsyncs it and renames it to `path`. Destroyed uncommitted (an
// error, a crash), it leaves `path` as it was.
class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(std::filesystem::path path);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;
  void append(std::string_view bytes);
  void commit();

 private:
  std::filesystem::path path_, temporary_;
  int fd_ = -1;
};

// A file's size and CRC-32C, read in blocks (a checkpoint's files are never whole in memory).
struct FileChecksum {
  uint64_t bytes = 0;
  uint32_t crc32c = 0;
};
FileChecksum checksum_file(const std::filesystem::path& path);

// The files a user names with one string: a file, a directory (its regular files, recursively,
// skipping hidden ones such as a run's .lock) or a glob; sorted. Empty when nothing matches.
std::vector<std::filesystem::path> list_files(const std::string& pattern);

// Makes a renamed directory entry durable.
void fsync_directory(const std::filesystem::path& dir);

// CRC-32C (Castagnoli), as used by TFRecord, and here as the per-file checkpoint checksum.
uint32_t crc32c(const void* data, size_t size, uint32_t crc = 0);

}  // namespace paraflow
