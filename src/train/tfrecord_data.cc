#include "train/tfrecord_data.h"

#include <fmt/format.h>

#include "base/error.h"
#include "data/prepare.h"

namespace paraflow::train {

TfRecordData::TfRecordData(std::vector<std::filesystem::path> train_files,
                           std::vector<std::filesystem::path> validation_files, const data::PipelineOptions& options,
                           std::string origin)
    : train_files_(std::move(train_files)),
      validation_files_(std::move(validation_files)),
      options_(options),
      origin_(std::move(origin)) {
  train_ = std::make_unique<data::InputPipeline>(train_files_, options_);
}

std::unique_ptr<TfRecordData> TfRecordData::from_prepared_dir(const std::filesystem::path& dir,
                                                              const data::PipelineOptions& options) {
  nlohmann::json splits = data::read_manifest(dir).at("splits");
  std::string origin = fmt::format("{} ({} train / {} validation tokens)", dir.string(),
                                   splits["train"].value("tokens", int64_t{0}), splits["val"].value("tokens", int64_t{0}));
  return std::make_unique<TfRecordData>(data::list_shards(dir, "train"), data::list_shards(dir, "val"), options,
                                        std::move(origin));
}

void TfRecordData::batch(int64_t index, uint64_t, bool validation, int64_t slice, int64_t slices, const Tensor& tokens,
                         const Tensor& targets) {
  const int64_t B = tokens.shape()[0], T = tokens.shape()[1];
  check(B * slices == options_.global_batch, "a slice of {} rows x {} does not make the global batch of {}", B, slices,
        options_.global_batch);
  const std::vector<int32_t>* rows = nullptr;
  if (validation) {
    check(!validation_files_.empty(), "{}: no validation files to evaluate on (set data.validation)", origin_);
    // Evaluation reads batches 0, 1, ... of the validation split: a fresh, unshuffled pipeline each time.
    if (!validation_ || (index == 0 && last_validation_index_ != 0)) {
      data::PipelineOptions options = options_;
      options.shuffle_buffer = 1;
      options.shuffle_files = false;
      validation_ = std::make_unique<data::InputPipeline>(validation_files_, options);
    }
    rows = &validation_->global_batch(index);
    last_validation_index_ = index;
  } else {
    if (index + 1 < train_->next_index()) train_ = std::make_unique<data::InputPipeline>(train_files_, options_);
    while (train_->next_index() < index) train_->global_batch(train_->next_index());
    rows = &train_->global_batch(index);
  }
  int32_t* x = tokens.data<int32_t>();
  int32_t* y = targets.data<int32_t>();
  for (int64_t b = 0; b < B; ++b) {
    const int32_t* row = rows->data() + (slice * B + b) * (T + 1);
    std::copy(row, row + T, x + b * T);
    std::copy(row + 1, row + T + 1, y + b * T);
  }
}

int32_t TfRecordData::max_token() const { return train_->max_token(); }

std::string TfRecordData::describe() const {
  return fmt::format("{}: {} train / {} validation TFRecord files of {} (input pipeline)", origin_,
                     train_->files().size(), validation_files_.size(), options_.feature);
}

void TfRecordData::restore(const nlohmann::json& state) {
  if (!state.empty()) train_->restore(state);
}

}  // namespace paraflow::train
