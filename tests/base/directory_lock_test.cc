// A directory lock leaves no file behind (data prepare's output is globbed by other tools, issue
// 44), refuses a second holder naming the first, and can be taken again once let go.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <optional>

#include "base/directory_lock.h"
#include "base/error.h"
#include "base/file_io.h"
#include "expect_error.h"
#include "reference_runner.h"

namespace paraflow {
namespace {

namespace fs = std::filesystem;

// Every entry of `dir`, hidden ones too.
std::vector<std::string> entries(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

TEST(DirectoryLock, LeavesNoFileAndRefusesASecondHolderMeanwhile) {
  testing::TempDir dir;
  const fs::path out = dir.path() / "out";
  {
    const DirectoryLock held(out);
    write_file_atomic(out / "data.txt", "x");
    EXPECT_EQ(entries(out), (std::vector<std::string>{".lock", "data.txt"}));
    testing::expect_error<InputError>([&] { DirectoryLock second(out); },
                                      {out.string() + " is in use by process " + std::to_string(::getpid())});
  }
  EXPECT_EQ(entries(out), std::vector<std::string>{"data.txt"});
  // Taken again, and let go again, as often as wanted.
  for (int i = 0; i < 3; ++i) {
    std::optional<DirectoryLock> again;
    EXPECT_NO_THROW(again.emplace(out));
    again.reset();
    EXPECT_EQ(entries(out), std::vector<std::string>{"data.txt"});
  }
}

// A crashed holder's file (stale text, no flock) is taken over, and removed at the end.
TEST(DirectoryLock, TakesOverTheFileOfACrashedHolder) {
  testing::TempDir dir;
  write_file_atomic(dir.path() / ".lock", "process 1 on host gone (locked at unix time 0)\n");
  { const DirectoryLock held(dir.path()); }
  EXPECT_TRUE(entries(dir.path()).empty());
}

// The setting that named the directory comes first in the messages.
TEST(DirectoryLock, MessagesNameTheSetting) {
  testing::TempDir dir;
  write_file_atomic(dir.path() / "a-file", "x");
  testing::expect_error<InputError>([&] { DirectoryLock lock(dir.path() / "a-file", "train.out_dir"); },
                                    {"train.out_dir " + (dir.path() / "a-file").string() + ": cannot create the directory"});
  const DirectoryLock held(dir.path() / "out");
  testing::expect_error<InputError>([&] { DirectoryLock second(dir.path() / "out", "--out"); },
                                    {"--out " + (dir.path() / "out").string() + " is in use by process"});
}

}  // namespace
}  // namespace paraflow
