#include <gtest/gtest.h>

#include "base/config.h"
#include "base/file_io.h"

namespace paraflow {
namespace {

TEST(Config, OverridesAndTypedAccess) {
  Config config = Config::from_string("train:\n  lr: 0.001\n  steps: 10\nmodel:\n  n_layer: 2\n", "test.yaml");
  config.set("train.lr=3e-4");
  config.set("train.new_section.flag=true");
  EXPECT_DOUBLE_EQ(config.get<double>("train.lr", 0), 3e-4);
  EXPECT_EQ(config.require<int64_t>("train.steps"), 10);
  EXPECT_EQ(config.get<int64_t>("train.missing", 7), 7);
  EXPECT_TRUE(config.get<bool>("train.new_section.flag", false));
  EXPECT_EQ(config.require<int>("model.n_layer"), 2);
  EXPECT_NO_THROW(config.check_all_used());
}

TEST(Config, ErrorsNameTheKeyAndFile) {
  Config config = Config::from_string("train:\n  steps: ten\n  stpes: 3\n", "run.yaml");
  try {
    config.get<int64_t>("train.steps", 1);
    ADD_FAILURE();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("run.yaml: key 'train.steps'"), std::string::npos) << e.what();
  }
  try {
    config.check_all_used();
    ADD_FAILURE();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("train.stpes"), std::string::npos) << e.what();
  }
  EXPECT_THROW(config.require<int>("model.n_layer"), InputError);
  EXPECT_THROW(Config::from_string("a: [1, 2", "broken.yaml"), InputError);
  EXPECT_THROW(config.set("novalue"), InputError);
}

TEST(FileIo, Crc32cKnownValues) {
  // RFC 3720 test vectors for CRC-32C.
  std::string zeros(32, '\0');
  EXPECT_EQ(crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);
  std::string ascending;
  for (int i = 0; i < 32; ++i) ascending.push_back(static_cast<char>(i));
  EXPECT_EQ(crc32c(ascending.data(), ascending.size()), 0x46DD794Eu);
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
}

}  // namespace
}  // namespace paraflow
