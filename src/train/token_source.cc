#include "train/token_source.h"

#include <algorithm>
#include <filesystem>

#include "base/error.h"
#include "base/file_io.h"
#include "base/random.h"

namespace paraflow::train {

TokenSource TokenSource::from_text_files(const std::vector<std::filesystem::path>& files, double validation_fraction) {
  std::vector<int32_t> tokens;
  for (const auto& file : files) {
    std::string text = read_file(file);
    for (unsigned char byte : text) tokens.push_back(byte);
  }
  return from_tokens(std::move(tokens), validation_fraction);
}

TokenSource TokenSource::from_tokens(std::vector<int32_t> tokens, double validation_fraction) {
  check(validation_fraction >= 0 && validation_fraction < 1, "data.validation_fraction must be in [0, 1), got {}",
        validation_fraction);
  TokenSource source;
  source.tokens_ = std::move(tokens);
  source.split_ = static_cast<int64_t>(static_cast<double>(source.tokens_.size()) * (1.0 - validation_fraction));
  source.max_token_ = source.tokens_.empty() ? 0 : *std::max_element(source.tokens_.begin(), source.tokens_.end());
  source.fingerprint_ = crc32c(source.tokens_.data(), source.tokens_.size() * sizeof(int32_t));
  return source;
}

nlohmann::json TokenSource::state() const {
  return {{"tokens_crc32c", fingerprint_}, {"tokens", tokens_.size()}, {"train_tokens", split_}};
}

void TokenSource::restore(const nlohmann::json& state) {
  if (!state.contains("tokens_crc32c")) return;  // a checkpoint from before the fingerprint
  const auto crc = state.value("tokens_crc32c", uint32_t{0});
  const auto tokens = state.value("tokens", size_t{0});
  const auto train_tokens = state.value("train_tokens", int64_t{0});
  check(crc == fingerprint_ && tokens == tokens_.size() && train_tokens == split_,
        "data.train: not the corpus this run was trained on ({} tokens, {} for training, CRC-32C {:08x} in the "
        "checkpoint; {}, {}, {:08x} now): resume it on its own data, or train in another train.out_dir",
        tokens, train_tokens, crc, tokens_.size(), split_, fingerprint_);
}

std::string TokenSource::describe() const {
  return fmt::format("{} train / {} validation tokens (bytes)", train_tokens(), validation_tokens());
}

void TokenSource::batch(int64_t index, uint64_t seed, bool validation, int64_t slice, int64_t slices,
                        const Tensor& tokens, const Tensor& targets) {
  const int64_t B = tokens.shape()[0], T = tokens.shape()[1];
  const int64_t begin = validation ? split_ : 0;
  const int64_t length = validation ? static_cast<int64_t>(tokens_.size()) - split_ : split_;
  check(length > T + 1, "the {} split has {} tokens, fewer than one sequence of {}", validation ? "validation" : "train",
        length, T + 1);
  // A generator per batch, seeded by (seed, index): batch k is the same however we got to it.
  Rng rng(seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(index) * 2 + (validation ? 1 : 0));
  int32_t* x = tokens.data<int32_t>();
  int32_t* y = targets.data<int32_t>();
  std::vector<int64_t> starts(static_cast<size_t>(B * slices));
  for (int64_t& start : starts) start = begin + static_cast<int64_t>(rng.below(static_cast<uint64_t>(length - T - 1)));
  for (int64_t b = 0; b < B; ++b) {
    int64_t start = starts[static_cast<size_t>(slice * B + b)];
    for (int64_t t = 0; t < T; ++t) {
      x[b * T + t] = tokens_[static_cast<size_t>(start + t)];
      y[b * T + t] = tokens_[static_cast<size_t>(start + t + 1)];
    }
  }
}

}  // namespace paraflow::train
