// CRC-32C against RFC 3720's vectors, of files read in blocks too; files written in pieces,
// atomically; listing a data directory: its files, recursively and sorted,
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

TEST(FileIo, ChecksumOfAFileReadInBlocksIsTheWholeContentsCrc) {
  testing::TempDir dir;
  // 2.5 MiB: three blocks of the reader's 1 MiB, the last one partial. "123456789" repeated.
  std::string content;
  while (content.size() < (5u << 19)) content += "123456789";
  write_file_atomic(dir.path() / "big", content);
  const FileChecksum checksum = checksum_file(dir.path() / "big");
  EXPECT_EQ(checksum.bytes, content.size());
  EXPECT_EQ(checksum.crc32c, crc32c(content.data(), content.size()));
  EXPECT_EQ(checksum_file(dir.path() / "big").crc32c, checksum.crc32c);
  write_file_atomic(dir.path() / "nine", "123456789");
  EXPECT_EQ(checksum_file(dir.path() / "nine").crc32c, 0xE3069283u);  // RFC 3720's
}

TEST(FileIo, AnUncommittedWriterLeavesTheOldFile) {
  testing::TempDir dir;
  const std::filesystem::path path = dir.path() / "file";
  write_file_atomic(path, "old");
  {
    AtomicFileWriter writer(path);
    writer.append("new, ");
    writer.append("in pieces");
  }  // destroyed before commit (an error on the way)
  EXPECT_EQ(read_file(path), "old");
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path()), {}), 1) << "a temporary was left";
  AtomicFileWriter writer(path);
  writer.append("new, ");
  writer.append("in pieces");
  writer.commit();
  EXPECT_EQ(read_file(path), "new, in pieces");
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
