// What `paraflow train`, `eval` and `plan` read from a YAML config and --set overrides, checked
// against the config schema and the files it names before any work starts.
#pragma once

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "model/gpt_config.h"
#include "train/batch_source.h"
#include "train/trainer.h"

namespace paraflow::cli {

struct RunSetup {
  model::GptConfig model;
  train::TrainConfig train;
  // Paths are resolved (Config::path): a relative one written in the config file is relative to
  // the file's folder.
  std::string data_path;
  std::string data_label;  // "data.train 'as written' (resolved)", for messages
  std::string data_format;  // prepared | tfrecord | text (auto resolved)
  std::string data_feature;
  std::string data_compression;  // auto | none | gzip | zlib
  std::string validation_path;
  // The files data.train and data.validation name (format tfrecord or text), listed once.
  std::vector<std::filesystem::path> train_files, validation_files;
  double validation_fraction = 0.05;
  std::chrono::milliseconds timeout{60000};
  // Parameter-server mode (TF_CONFIG with ps tasks).
  bool ps_synchronous = true;
  int64_t max_staleness = 4;
  std::string tls_cert, tls_key, tls_ca, auth_token_file;
  int threads = 0;  // 0: all cores

  // Validates every key (unknown keys, types, ranges) and that the data and tokenizer it names
  // exist and are readable.
  static RunSetup load(const std::string& config_path, const std::vector<std::string>& overrides);

  std::unique_ptr<train::BatchSource> open_data() const;
};

}  // namespace paraflow::cli
