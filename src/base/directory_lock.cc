#include "base/directory_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "base/error.h"

namespace paraflow {

namespace {

std::string holder_description(int fd) {
  char buffer[512] = {};
  ssize_t got = pread(fd, buffer, sizeof buffer - 1, 0);
  std::string text = got > 0 ? std::string(buffer, static_cast<size_t>(got)) : "an unknown process";
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

}  // namespace

DirectoryLock::DirectoryLock(const std::filesystem::path& dir, std::string_view setting) {
  const std::string where = setting.empty() ? dir.string() : fmt::format("{} {}", setting, dir.string());
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  check(!error && std::filesystem::is_directory(dir), "{}: cannot create the directory: {}", where,
        error ? error.message() : "a file of that name exists");
  path_ = dir / ".lock";
  // The holder removes the file when it is done (no stray file in the directory: data prepare's
  // output is globbed by other tools), while it still holds the lock. So a lock taken here on a
  // file that was removed meanwhile guards nothing: take the file at the path again.
  for (;;) {
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    check(fd_ >= 0, "{}: cannot open the lock file: {}", path_.string(), std::strerror(errno));
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      const int saved = errno;
      std::string holder = holder_description(fd_);
      ::close(fd_);
      fd_ = -1;
      check(saved != EWOULDBLOCK, "{} is in use by {}: two runs must not share one directory", where, holder);
      fail("{}: cannot lock: {}", path_.string(), std::strerror(saved));
    }
    struct stat held {}, current {};
    if (::fstat(fd_, &held) == 0 && ::stat(path_.c_str(), &current) == 0 && held.st_dev == current.st_dev &&
        held.st_ino == current.st_ino) {
      break;
    }
    ::close(fd_);
  }
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  const auto since_epoch = std::chrono::system_clock::now().time_since_epoch();
  std::string who = fmt::format("process {} on host {} (locked at unix time {})\n", ::getpid(), host,
                                std::chrono::duration_cast<std::chrono::seconds>(since_epoch).count());
  // Best effort: without the description a refused process names "an unknown process".
  [[maybe_unused]] int truncated = ::ftruncate(fd_, 0);
  [[maybe_unused]] ssize_t written = ::pwrite(fd_, who.data(), who.size(), 0);
}

DirectoryLock::~DirectoryLock() {
  if (fd_ < 0) return;
  ::unlink(path_.c_str());  // before the flock is released: see the constructor
  ::close(fd_);             // closing the descriptor releases the flock
}

}  // namespace paraflow
