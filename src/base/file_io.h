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

// The files a user names with one string: a file, a directory (its regular files, recursively,
// skipping hidden ones such as a run's .lock) or a glob; sorted. Empty when nothing matches.
std::vector<std::filesystem::path> list_files(const std::string& pattern);

// Makes a renamed directory entry durable.
void fsync_directory(const std::filesystem::path& dir);

// CRC-32C (Castagnoli), as used by TFRecord, and here as the per-file checkpoint checksum.
uint32_t crc32c(const void* data, size_t size, uint32_t crc = 0);

}  // namespace paraflow
