// An exclusive, advisory lock on a directory (flock on <dir>/.lock), held for the lifetime of
// the object. The kernel drops it when the process dies, so a crashed run never leaves a stale
// lock. The holder writes its pid, host and start time into the file, so a refused process can
// name who holds it, and removes the file when it lets go (a crashed holder leaves it, stale and
// harmless: the next holder takes it over).
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

namespace paraflow {

class DirectoryLock {
 public:
  // Creates `dir` if needed. Throws InputError naming the holder when another process has it;
  // messages name `setting` ("train.out_dir", "--out") before the directory when given.
  explicit DirectoryLock(const std::filesystem::path& dir, std::string_view setting = {});
  ~DirectoryLock();
  DirectoryLock(const DirectoryLock&) = delete;
  DirectoryLock& operator=(const DirectoryLock&) = delete;

 private:
  std::filesystem::path path_;
  int fd_ = -1;
};

}  // namespace paraflow
