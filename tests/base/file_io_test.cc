// CRC-32C against RFC 3720's vectors; listing a data directory: its files, recursively and sorted,
// without hidden files and without what hidden directories hold (a checkout's .git, a notebook's
// .ipynb_checkpoints).
#include "base/file_io.h"

#include <gtest/gtest.h>

#include "reference_runner.h"

namespace paraflow {
namespace {

TEST(FileIo, Crc32cKnownValues) {
  // RFC 3720 test vectors for CRC-32C.
  std::string zeros(32, '\0');
  EXPECT_EQ(crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);
  std::string ascending;
  for (int i = 0; i < 32; ++i) ascending.push_back(static_cast<char>(i));
  EXPECT_EQ(crc32c(ascending.data(), ascending.size()), 0x46DD794Eu);
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
}

TEST(ListFiles, SkipsHiddenFilesAndHiddenDirectories) {
  testing::TempDir dir;
  const std::filesystem::path root = dir.path();
  for (const char* file : {"b.txt", "a/c.txt", ".hidden.txt", ".git/HEAD", ".git/objects/ab/cdef", "a/.cache/x.txt"}) {
    std::filesystem::create_directories((root / file).parent_path());
    write_file_atomic(root / file, "text");
  }
  EXPECT_EQ(list_files(root.string()), (std::vector<std::filesystem::path>{root / "a/c.txt", root / "b.txt"}));
}

}  // namespace
}  // namespace paraflow
