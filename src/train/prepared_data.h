// Batches from a `paraflow data prepare` directory through the TFRecord input pipeline: the
// train split streams through one data::InputPipeline whose iterator state goes into
// checkpoints; each evaluation reads the first batches of the validation split afresh.
#pragma once

#include <filesystem>
#include <memory>

#include "data/pipeline.h"
#include "train/batch_source.h"

namespace paraflow::train {

class PreparedData final : public BatchSource {
 public:
  // `global_batch`: sequences per step over all ranks; `vocab_size` bounds the token ids.
  PreparedData(const std::filesystem::path& dir, int64_t global_batch, int64_t sequence_length, uint64_t seed,
               int64_t vocab_size);

  void batch(int64_t index, uint64_t seed, bool validation, int64_t slice, int64_t slices, const Tensor& tokens,
             const Tensor& targets) override;
  int32_t max_token() const override;
  std::string describe() const override;
  nlohmann::json state() const override { return train_->state(); }
  void restore(const nlohmann::json& state) override;
  double wait_seconds() const override { return train_->stats().wait_seconds; }

 private:
  std::filesystem::path dir_;
  data::PipelineOptions options_;
  std::unique_ptr<data::InputPipeline> train_, validation_;
  int64_t last_validation_index_ = -1;
};

}  // namespace paraflow::train
