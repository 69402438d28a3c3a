#include "cli/run_setup.h"

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
  config.check_all_used();
  return setup;
}

}  // namespace paraflow::cli
