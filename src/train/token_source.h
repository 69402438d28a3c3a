// A corpus of text files read as bytes (a byte-level vocabulary of 256 ids), split into train
// and validation, and sampled as windows of T+1 tokens — for quick runs without a tokenizer or
// `data prepare`. Batch k depends only on (seed, k), so the data position in a checkpoint is just
// the step, and resuming replays exactly.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "train/batch_source.h"

namespace paraflow::train {

class TokenSource final : public BatchSource {
 public:
  // The bytes of `files`, concatenated in order.
  static TokenSource from_text_files(const std::vector<std::filesystem::path>& files, double validation_fraction);
  static TokenSource from_tokens(std::vector<int32_t> tokens, double validation_fraction);

  void batch(int64_t index, uint64_t seed, bool validation, int64_t slice, int64_t slices, const Tensor& tokens,
             const Tensor& targets) override;
  std::string describe() const override;
  // The corpus's identity (a CRC-32C of its tokens, the split), so that a run resumed on other
  // data is refused, as TFRecord data's fingerprint does; batches depend on nothing else.
  nlohmann::json state() const override;
  void restore(const nlohmann::json& state) override;

  int64_t train_tokens() const { return split_; }
  int64_t validation_tokens() const { return static_cast<int64_t>(tokens_.size()) - split_; }
  int32_t max_token() const override { return max_token_; }

 private:
  std::vector<int32_t> tokens_;
  int64_t split_ = 0;
  int32_t max_token_ = 0;
  uint32_t fingerprint_ = 0;  // CRC-32C of the tokens
};

}  // namespace paraflow::train
