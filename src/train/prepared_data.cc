#include "train/prepared_data.h"

#include <fmt/format.h>

#include "base/error.h"
#include "data/prepare.h"

namespace paraflow::train {

PreparedData::PreparedData(const std::filesystem::path& dir, int64_t global_batch, int64_t sequence_length,
                           uint64_t seed, int64_t vocab_size)
    : dir_(dir) {
  options_.global_batch = global_batch;
  options_.sequence_length = sequence_length;
  options_.seed = seed;
  options_.vocab_size = vocab_size;
  train_ = std::make_unique<data::InputPipeline>(data::list_shards(dir, "train"), options_);
}

void PreparedData::batch(int64_t index, uint64_t, bool validation, int64_t slice, int64_t slices, const Tensor& tokens,
                         const Tensor& targets) {
  const int64_t B = tokens.shape()[0], T = tokens.shape()[1];
  check(B * slices == options_.global_batch, "a slice of {} rows x {} does not make the global batch of {}", B, slices,
        options_.global_batch);
  const std::vector<int32_t>* rows = nullptr;
  if (validation) {
    // Evaluation reads batches 0, 1, ... of the validation split: a fresh, unshuffled pipeline each time.
    if (!validation_ || (index == 0 && last_validation_index_ != 0)) {
      data::PipelineOptions options = options_;
      options.shuffle_buffer = 1;
      options.shuffle_files = false;
      validation_ = std::make_unique<data::InputPipeline>(data::list_shards(dir_, "val"), options);
    }
    rows = &validation_->global_batch(index);
    last_validation_index_ = index;
  } else {
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

int32_t PreparedData::max_token() const { return train_->max_token(); }

std::string PreparedData::describe() const {
  nlohmann::json splits = data::read_manifest(dir_).at("splits");
  return fmt::format("{} train / {} validation tokens in {} train shards of {} (TFRecord pipeline)",
                     splits["train"].value("tokens", int64_t{0}), splits["val"].value("tokens", int64_t{0}),
                     train_->files().size(), dir_.string());
}

void PreparedData::restore(const nlohmann::json& state) {
  if (!state.empty()) train_->restore(state);
}

}  // namespace paraflow::train
