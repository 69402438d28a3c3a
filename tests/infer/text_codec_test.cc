// Without tokenizer files a model's text is bytes: every byte 0-255 is its own id and decodes
// back to itself (bytes above 127 included: char is signed on x86-64); ids past 255 have none.
#include <gtest/gtest.h>

#include "infer/text_codec.h"
#include "reference_runner.h"

namespace paraflow {
namespace {

TEST(TextCodec, WithoutATokenizerBytesAreIdsBothWays) {
  testing::TempDir dir;
  const infer::TextCodec codec(dir.path());
  const std::string text = "caf\xc3\xa9 \xff";
  EXPECT_EQ(codec.encode(text), (std::vector<int32_t>{'c', 'a', 'f', 0xc3, 0xa9, ' ', 0xff}));
  std::string decoded;
  for (int32_t id : codec.encode(text)) decoded += codec.decode(id);
  EXPECT_EQ(decoded, text);
  EXPECT_FALSE(codec.end_of_text().has_value());
  EXPECT_EQ(codec.decode(300), "");  // a model vocabulary padded past the 256 bytes
}

}  // namespace
}  // namespace paraflow
