#include "cli/run_setup.h"

#include <algorithm>
#include <filesystem>

#include "base/config.h"
#include "base/file_io.h"
#include "cli/config_schema.h"
#include "data/prepare.h"
#include "data/tfrecord.h"
#include "data/tokenizer.h"
#include "train/tfrecord_data.h"
#include "train/token_source.h"

namespace paraflow::cli {

namespace {

namespace fs = std::filesystem;

std::vector<fs::path> required_files(const std::string& label, const fs::path& pattern) {
  std::vector<fs::path> files = list_files(pattern.string());
  check(!files.empty(), "{}: no such file, directory or matching glob", label);
  return files;
}

// data.format auto chose tfrecord: every file must start like a TFRecord file. Text is never
// guessed: a TFRecord file read as bytes would train on garbage without a word.
void check_tfrecord_files(const std::string& label, const std::vector<fs::path>& files) {
  for (const auto& file : files) {
    try {
      data::detect_compression(file);
    } catch (const InputError& e) {
      fail("{}: {}. For byte-level training on text files set data.format: text", label, e.what());
    }
  }
}

// Training files must not hold validation data: a `data prepare` directory that lost its
// manifest.json (an interrupted or partly copied prepare) read as plain TFRecord files, or
// data.validation files that data.train names too.
void check_splits_apart(const std::string& label, const std::vector<fs::path>& train_files,
                        const std::vector<fs::path>& validation_files) {
  for (const fs::path& file : train_files) {
    if (!data::is_shard_name(file.filename().string(), "val")) continue;
    const std::vector<fs::path> siblings = list_files(file.parent_path().string());
    const bool prepared = std::any_of(siblings.begin(), siblings.end(), [](const fs::path& sibling) {
      return data::is_shard_name(sibling.filename().string(), "train");
    });
    check(!prepared,
          "{} takes {}, the validation shard of a `paraflow data prepare` directory without its manifest.json (an "
          "interrupted or partly copied prepare): training on it would mix validation into the training data. Run "
          "`paraflow data prepare` again, or name the training shards alone (a glob of train-*.tfrecord*)",
          label, file.string());
  }
  for (const fs::path& file : validation_files) {
    check(std::find(train_files.begin(), train_files.end(), file) == train_files.end(),
          "{} is in both data.train and data.validation: train and validation data must not mix", file.string());
  }
}

// The tokenizer data.tokenizer names, its errors named after the key.
data::Tokenizer load_tokenizer(const Config& config) {
  const std::string label = config.describe_path("data.tokenizer");
  check(fs::is_directory(config.path("data.tokenizer")), "{}: no such directory", label);
  try {
    return data::Tokenizer::load(config.path("data.tokenizer"));
  } catch (const InputError& e) {
    fail("{}: {}", label, e.what());
  }
}

// What the model trains on must be what the export's tokenizer encodes: generate, serve and
// transformers feed the model the ids of the tokenizer the export carries.
void check_tokenizer_matches_data(const RunSetup& setup, const Config& config, const data::Tokenizer& tokenizer) {
  const std::string label = config.describe_path("data.tokenizer");
  check(setup.data_format != "text",
        "{} is set, but data.format text trains on bytes (ids 0-255), not on that tokenizer's ids: an export "
        "carrying it would decode the model's bytes as its tokens. Tokenize the text with `paraflow data prepare "
        "--tokenizer {}` and train on that directory, or remove data.tokenizer for a byte-level model",
        label, setup.train.tokenizer_dir.string());
  check(tokenizer.vocab_size() <= setup.model.vocab_size, "{} has {} tokens but model.vocab_size is {}", label,
        tokenizer.vocab_size(), setup.model.vocab_size);
  if (setup.data_format != "prepared") return;
  const nlohmann::json prepared_with = data::read_manifest(setup.data_path).value("tokenizer", nlohmann::json::object());
  const std::string fingerprint = prepared_with.value("fingerprint", std::string());
  check(fingerprint.empty() || fingerprint == tokenizer.fingerprint(),
        "{} is not the tokenizer {} was prepared with ({}, fingerprint {}; this one's is {}): the model would "
        "learn one tokenizer's ids and be exported with the other",
        label, config.describe_path("data.train"), prepared_with.value("path", std::string("?")), fingerprint,
        tokenizer.fingerprint());
}

}  // namespace

RunSetup RunSetup::load(const std::string& config_path, const std::vector<std::string>& overrides) {
  Config config = Config::from_file(config_path, run_config_schema());
  for (const std::string& assignment : overrides) config.set(assignment);
  config.validate();
  RunSetup setup;
  setup.model = model::GptConfig::from_config(config);
  setup.train = train::TrainConfig::from_config(config);
  setup.data_path = config.path("data.train").string();
  setup.data_label = config.describe_path("data.train");
  setup.data_feature = config.get<std::string>("data.feature");
  setup.data_compression = config.get<std::string>("data.compression");
  setup.validation_path = config.path("data.validation").string();
  setup.validation_fraction = config.get<double>("data.validation_fraction");
  setup.timeout = std::chrono::milliseconds(static_cast<int64_t>(1000 * config.get<double>("dist.timeout_seconds")));
  setup.ps_synchronous = config.get<std::string>("dist.ps_mode") == "sync";
  setup.max_staleness = config.get<int64_t>("dist.max_staleness");
  setup.tls_cert = config.path("dist.tls_cert").string();
  setup.tls_key = config.path("dist.tls_key").string();
  setup.tls_ca = config.path("dist.tls_ca").string();
  setup.auth_token_file = config.path("dist.auth_token_file").string();
  setup.threads = config.get<int>("train.threads");
  setup.train.tokenizer_dir = config.path("data.tokenizer");
  // Every path is checked now, not after hours of training (the export copies the tokenizer).
  const bool prepared_dir = fs::exists(fs::path(setup.data_path) / "manifest.json");
  const std::string format = config.get<std::string>("data.format");
  setup.data_format = format != "auto" ? format : prepared_dir ? "prepared" : "tfrecord";
  if (setup.data_format == "prepared") {
    check(fs::exists(setup.data_path), "{}: no such directory", setup.data_label);
    check(prepared_dir, "{} is not a `paraflow data prepare` directory (no manifest.json)", setup.data_label);
  } else {
    check(setup.data_format != "text" || !prepared_dir,
          "{} is a `paraflow data prepare` directory, but data.format text would read its shards as bytes: set "
          "data.format to prepared (or auto)", setup.data_label);
    setup.train_files = required_files(setup.data_label, setup.data_path);
    if (format == "auto") check_tfrecord_files(setup.data_label, setup.train_files);
  }
  if (!setup.validation_path.empty()) {
    setup.validation_files = required_files(config.describe_path("data.validation"), setup.validation_path);
  }
  check_splits_apart(setup.data_label, setup.train_files, setup.validation_files);
  check(setup.data_format != "tfrecord" || !setup.validation_path.empty() || setup.train.eval_every == 0,
        "train.eval_every is {} but there is no data.validation to evaluate on", setup.train.eval_every);
  if (!setup.train.tokenizer_dir.empty()) check_tokenizer_matches_data(setup, config, load_tokenizer(config));
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
        "train.eval_every is {} but {} has no validation shards to evaluate on", train.eval_every, data_label);
  data::PipelineOptions options;
  options.global_batch = train.batch_size;
  options.sequence_length = train.sequence_length;
  options.seed = train.seed;
  options.vocab_size = model.vocab_size;
  options.feature = data_feature;
  if (data_compression != "auto") options.compression = data::parse_compression(data_compression);
  if (data_format == "prepared") return train::TfRecordData::from_prepared_dir(data_path, options);
  return std::make_unique<train::TfRecordData>(train_files, validation_files, options, data_label);
}

}  // namespace paraflow::cli
