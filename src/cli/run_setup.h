// What `paraflow train` and `paraflow eval` read from a YAML config and --set overrides.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "base/config.h"
#include "model/gpt_config.h"
#include "train/batch_source.h"
#include "train/trainer.h"

namespace paraflow::cli {

struct RunSetup {
  model::GptConfig model;
  train::TrainConfig train;
  std::string data_path;
  double validation_fraction = 0.05;
  std::chrono::milliseconds timeout{60000};
  int threads = 0;  // 0: all cores

  // Reads every key and refuses unknown ones.
  static RunSetup load(const std::string& config_path, const std::vector<std::string>& overrides);

  // data.train: a `paraflow data prepare` directory (TFRecord input pipeline) or text files read
  // as bytes.
  std::unique_ptr<train::BatchSource> open_data() const;
};

}  // namespace paraflow::cli
