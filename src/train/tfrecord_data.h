// Batches from TFRecord files of tf.train.Example token ids through the input pipeline: a
// `paraflow data prepare` directory (train/val splits listed in its manifest), or TFRecord files
// that TensorFlow or anything else wrote (a directory or glob per split, any int64 feature,
// compression detected from each file). The train split streams through one
// data::InputPipeline whose iterator state goes into checkpoints; each evaluation reads the
// first batches of the validation split afresh. Train batches may be asked in any order (the
// workers of a parameter-server job are handed steps as they come free): a later batch is reached
// by reading past the ones between, an earlier one by reading again from the first.
#pragma once

#include <filesystem>
#include <memory>
#include <vector>

#include "data/pipeline.h"
#include "train/batch_source.h"

namespace paraflow::train {

class TfRecordData final : public BatchSource {
 public:
  // `options` carries the global batch (sequences per step over all ranks), sequence length,
  // seed, feature, compression and the vocabulary size that bounds the ids. No validation
  // files: evaluating is an error.
  TfRecordData(std::vector<std::filesystem::path> train_files, std::vector<std::filesystem::path> validation_files,
               const data::PipelineOptions& options, std::string origin);
  static std::unique_ptr<TfRecordData> from_prepared_dir(const std::filesystem::path& dir,
                                                         const data::PipelineOptions& options);

  void batch(int64_t index, uint64_t seed, bool validation, int64_t slice, int64_t slices, const Tensor& tokens,
             const Tensor& targets) override;
  int32_t max_token() const override;  // reads every train file unless a manifest lists them
  // The pipeline's parser refuses ids of options.vocab_size or more (so TFRecord files that no
  // manifest describes are not read through on every start only to check them).
  bool refuses_tokens_past(int64_t vocab_size) const override {
    return options_.vocab_size > 0 && options_.vocab_size <= vocab_size;
  }
  std::string describe() const override;
  nlohmann::json state() const override { return train_->state(); }
  void restore(const nlohmann::json& state) override;
  double wait_seconds() const override { return train_->stats().wait_seconds; }

 private:
  std::vector<std::filesystem::path> train_files_, validation_files_;
  data::PipelineOptions options_;
  std::string origin_;  // what the user named, for messages
  std::unique_ptr<data::InputPipeline> train_, validation_;
  int64_t last_validation_index_ = -1;
};

}  // namespace paraflow::train
