// TFRecord batches asked in any order (as a parameter-server worker asks them) are the batches a
// sequential reader gets at the same indices.
#include <gtest/gtest.h>

#include "data/example.h"
#include "data/tfrecord.h"
#include "reference_runner.h"
#include "train/tfrecord_data.h"

namespace paraflow::train {
namespace {

TEST(TfRecordData, BatchesInAnyOrderEqualTheSequentialOnes) {
  testing::TempDir dir;
  std::vector<std::filesystem::path> files;
  for (int file = 0; file < 3; ++file) {
    files.push_back(dir.path() / fmt::format("train-{}.tfrecord", file));
    data::TFRecordWriter writer(files.back());
    for (int record = 0; record < 40; ++record) {
      std::vector<int64_t> ids(static_cast<size_t>(5 + (file * 7 + record * 3) % 20));
      for (size_t i = 0; i < ids.size(); ++i) ids[i] = (file * 40 + record + static_cast<int64_t>(i)) % 256;
      writer.write(data::make_input_ids_example(ids));
    }
    writer.close();
  }
  data::PipelineOptions options;
  options.global_batch = 4;
  options.sequence_length = 8;
  options.seed = 5;
  options.shuffle_buffer = 16;
  auto read = [&](TfRecordData& data, int64_t index, int64_t slice) {
    Tensor tokens = cpu_backend().empty(Shape{2, 8}, DType::i32), targets = cpu_backend().empty(Shape{2, 8}, DType::i32);
    data.batch(index, 5, false, slice, 2, tokens, targets);
    const int32_t* x = tokens.data<int32_t>();
    return std::vector<int32_t>(x, x + 16);
  };
  TfRecordData sequential(files, {}, options, "sequential");
  std::vector<std::vector<int32_t>> expected;
  for (int64_t index = 0; index < 10; ++index) {
    for (int64_t slice = 0; slice < 2; ++slice) expected.push_back(read(sequential, index, slice));
  }
  TfRecordData shuffled(files, {}, options, "shuffled");
  for (auto [index, slice] : {std::pair{3, 1}, {3, 0}, {7, 0}, {1, 1}, {9, 1}, {0, 0}, {9, 0}}) {
    EXPECT_EQ(read(shuffled, index, slice), expected[static_cast<size_t>(2 * index + slice)])
        << "batch " << index << " slice " << slice;
  }
}

// With the vocabulary as a bound the pipeline refuses an id past it when it reads its record,
// naming the file: the trainer's check does not read every file through first.
TEST(TfRecordData, AnIdPastTheVocabularyIsRefusedWhereItIsRead) {
  testing::TempDir dir;
  const std::filesystem::path file = dir.path() / "train.tfrecord";
  data::TFRecordWriter writer(file);
  for (int record = 0; record < 200; ++record) {
    std::vector<int64_t> ids(20, record % 50);
    if (record == 199) ids[3] = 150;
    writer.write(data::make_input_ids_example(ids));
  }
  writer.close();
  data::PipelineOptions options;
  options.global_batch = 2;
  options.sequence_length = 8;
  options.shuffle_buffer = 1;
  options.shuffle_files = false;
  options.vocab_size = 100;
  TfRecordData data({file}, {}, options, "train.tfrecord");
  EXPECT_TRUE(data.refuses_tokens_past(100));
  EXPECT_FALSE(data.refuses_tokens_past(64));  // a smaller model than the bound: checked by max_token
  EXPECT_NO_THROW(check_tokens_fit(data, 100));
  Tensor tokens = cpu_backend().empty(Shape{2, 8}, DType::i32), targets = cpu_backend().empty(Shape{2, 8}, DType::i32);
  try {
    for (int64_t index = 0; index < 1000; ++index) data.batch(index, 0, false, 0, 1, tokens, targets);
    ADD_FAILURE() << "read past the id 150";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("train.tfrecord"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("150"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace paraflow::train
