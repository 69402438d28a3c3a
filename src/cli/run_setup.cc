#include "cli/run_setup.h"

#include <filesystem>

#include "train/prepared_data.h"
#include "train/token_source.h"

namespace paraflow::cli {

RunSetup RunSetup::load(const std::string& config_path, const std::vector<std::string>& overrides) {
  Config config = Config::from_file(config_path);
  for (const std::string& assignment : overrides) config.set(assignment);
  RunSetup setup;
  setup.model = model::GptConfig::from_config(config);
  setup.train = train::TrainConfig::from_config(config);
  setup.data_path = config.require<std::string>("data.train");
  setup.validation_fraction = config.get<double>("data.validation_fraction", 0.05);
  setup.timeout = std::chrono::milliseconds(static_cast<int64_t>(1000 * config.get<double>("dist.timeout_seconds", 60)));
  setup.threads = config.get<int>("train.threads", 0);
  setup.train.tokenizer_dir = config.get<std::string>("data.tokenizer", "");
  config.check_all_used();
  return setup;
}

std::unique_ptr<train::BatchSource> RunSetup::open_data() const {
  if (std::filesystem::exists(std::filesystem::path(data_path) / "manifest.json")) {
    return std::make_unique<train::PreparedData>(data_path, train.batch_size, train.sequence_length, train.seed,
                                                 model.vocab_size);
  }
  return std::make_unique<train::TokenSource>(train::TokenSource::from_text_files(data_path, validation_fraction));
}

}  // namespace paraflow::cli
