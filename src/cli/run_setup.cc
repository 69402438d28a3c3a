#include "cli/run_setup.h"

#include <filesystem>

#include "base/file_io.h"
#include "cli/config_schema.h"
#include "data/prepare.h"
#include "data/tfrecord.h"
#include "data/tokenizer.h"
#include "train/tfrecord_data.h"
#include "train/token_source.h"

namespace paraflow::cli {

namespace {

std::vector<std::filesystem::path> required_files(const std::string& key, const std::string& pattern) {
  std::vector<std::filesystem::path> files = list_files(pattern);
  check(!files.empty(), "{} '{}': no such file, directory or matching glob", key, pattern);
  return files;
}

// data.format auto chose tfrecord: every file must start like a TFRecord file. Text is never
// guessed: a TFRecord file read as bytes would train on garbage without a word.
void check_tfrecord_files(const std::string& path, const std::vector<std::filesystem::path>& files) {
  for (const auto& file : files) {
    try {
      data::detect_compression(file);
    } catch (const InputError& e) {
      fail("data.train '{}': {}. For byte-level training on text files set data.format: text", path, e.what());
    }
  }
}

}  // namespace

RunSetup RunSetup::load(const std::string& config_path, const std::vector<std::string>& overrides) {
  Config config = Config::from_file(config_path, run_config_schema());
  for (const std::string& assignment : overrides) config.set(assignment);
  config.validate();
  RunSetup setup;
  setup.model = model::GptConfig::from_config(config);
  setup.train = train::TrainConfig::from_config(config);
  setup.data_path = config.get<std::string>("data.train");
  setup.data_feature = config.get<std::string>("data.feature");
  setup.data_compression = config.get<std::string>("data.compression");
  setup.validation_path = config.get<std::string>("data.validation");
  setup.validation_fraction = config.get<double>("data.validation_fraction");
  setup.timeout = std::chrono::milliseconds(static_cast<int64_t>(1000 * config.get<double>("dist.timeout_seconds")));
  setup.ps_synchronous = config.get<std::string>("dist.ps_mode") == "sync";
  setup.max_staleness = config.get<int64_t>("dist.max_staleness");
  setup.tls_cert = config.get<std::string>("dist.tls_cert");
  setup.tls_key = config.get<std::string>("dist.tls_key");
  setup.tls_ca = config.get<std::string>("dist.tls_ca");
  setup.auth_token_file = config.get<std::string>("dist.auth_token_file");
  setup.threads = config.get<int>("train.threads");
  setup.train.tokenizer_dir = config.get<std::string>("data.tokenizer");
  // Every path is checked now, not after hours of training (the export copies the tokenizer).
  const bool prepared_dir = std::filesystem::exists(std::filesystem::path(setup.data_path) / "manifest.json");
  const std::string format = config.get<std::string>("data.format");
  setup.data_format = format != "auto" ? format : prepared_dir ? "prepared" : "tfrecord";
  if (setup.data_format == "prepared") {
    check(prepared_dir, "data.train '{}' is not a `paraflow data prepare` directory (no manifest.json)",
          setup.data_path);
  } else {
    setup.train_files = required_files("data.train", setup.data_path);
    if (format == "auto") check_tfrecord_files(setup.data_path, setup.train_files);
  }
  if (!setup.validation_path.empty()) setup.validation_files = required_files("data.validation", setup.validation_path);
  check(setup.data_format != "tfrecord" || !setup.validation_path.empty() || setup.train.eval_every == 0,
        "train.eval_every is {} but there is no data.validation to evaluate on", setup.train.eval_every);
  if (!setup.train.tokenizer_dir.empty()) {
    const data::Tokenizer tokenizer = data::Tokenizer::load(setup.train.tokenizer_dir);
    check(tokenizer.vocab_size() <= setup.model.vocab_size,
          "data.tokenizer '{}' has {} tokens but model.vocab_size is {}", setup.train.tokenizer_dir.string(),
          tokenizer.vocab_size(), setup.model.vocab_size);
  }
  return setup;
}

std::unique_ptr<train::BatchSource> RunSetup::open_data() const {
  // Evaluation needs a validation split: checked now, not at the first evaluation.
  const bool evaluates = train.eval_every > 0;
  if (data_format == "text") {
    auto source = std::make_unique<train::TokenSource>(train::TokenSource::from_text_files(train_files, validation_fraction));
    check(!evaluates || source->validation_tokens() > train.sequence_length + 1,
          "train.eval_every is {} but the validation split (data.validation_fraction {}) has {} tokens, fewer than one "
          "sequence of {}",
          train.eval_every, validation_fraction, source->validation_tokens(), train.sequence_length + 1);
    return source;
  }
  check(!evaluates || data_format != "prepared" || !data::list_shards(data_path, "val").empty(),
        "train.eval_every is {} but {} has no validation shards to evaluate on", train.eval_every, data_path);
  data::PipelineOptions options;
  options.global_batch = train.batch_size;
  options.sequence_length = train.sequence_length;
  options.seed = train.seed;
  options.vocab_size = model.vocab_size;
  options.feature = data_feature;
  if (data_compression != "auto") options.compression = data::parse_compression(data_compression);
  if (data_format == "prepared") return train::TfRecordData::from_prepared_dir(data_path, options);
  return std::make_unique<train::TfRecordData>(train_files, validation_files, options, "data.train '" + data_path + "'");
}

}  // namespace paraflow::cli
