// The config schema: its defaults are the ones the code uses, every declared bound is enforced
// with a message naming key and value, and docs/training.md's key table is the schema's.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include "base/file_io.h"
#include "cli/config_schema.h"
#include "cli/run_setup.h"
#include "reference_runner.h"

namespace paraflow {
namespace {

const char* kModel = "model: {vocab_size: 11, n_positions: 8, n_embd: 8, n_layer: 1, n_head: 2}\ndata: {train: corpus}\n";

Config model_only(const std::string& extra = "") {
  Config config = Config::from_string(std::string(kModel) + extra, "run.yaml", cli::run_config_schema());
  config.validate();
  return config;
}

TEST(ConfigSchema, DefaultsAreTheCodesDefaults) {
  const train::TrainConfig fallback;
  const train::TrainConfig read = train::TrainConfig::from_config(model_only());
  EXPECT_EQ(read.batch_size, fallback.batch_size);
  EXPECT_EQ(read.sequence_length, fallback.sequence_length);
  EXPECT_EQ(read.steps, fallback.steps);
  EXPECT_EQ(read.stop_at_step, fallback.stop_at_step);
  EXPECT_EQ(read.grad_accumulation, fallback.grad_accumulation);
  EXPECT_EQ(read.schedule.peak, fallback.schedule.peak);
  EXPECT_DOUBLE_EQ(read.schedule.floor, fallback.schedule.floor);  // train.lr / 10, up to rounding
  EXPECT_EQ(read.schedule.warmup, fallback.schedule.warmup);
  EXPECT_EQ(read.adamw.beta1, fallback.adamw.beta1);
  EXPECT_EQ(read.adamw.beta2, fallback.adamw.beta2);
  EXPECT_EQ(read.adamw.eps, fallback.adamw.eps);
  EXPECT_EQ(read.adamw.weight_decay, fallback.adamw.weight_decay);
  EXPECT_EQ(read.adamw.grad_clip, fallback.adamw.grad_clip);
  EXPECT_EQ(read.seed, fallback.seed);
  EXPECT_EQ(read.out_dir, fallback.out_dir);
  EXPECT_EQ(read.checkpoint_every, fallback.checkpoint_every);
  EXPECT_EQ(read.keep_checkpoints, fallback.keep_checkpoints);
  EXPECT_EQ(read.log_every, fallback.log_every);
  EXPECT_EQ(read.eval_every, fallback.eval_every);
  EXPECT_EQ(read.eval_batches, fallback.eval_batches);
  EXPECT_EQ(read.sync.bucket_bytes, fallback.sync.bucket_bytes);
  EXPECT_EQ(read.sync.overlap, fallback.sync.overlap);
  EXPECT_EQ(read.sync.zero, fallback.sync.zero);
  EXPECT_EQ(read.sync.exact, fallback.sync.exact);
  EXPECT_EQ(read.recompute, fallback.recompute);
  EXPECT_EQ(read.decay_embeddings, fallback.decay_embeddings);
  EXPECT_EQ(read.precision, fallback.precision);
  EXPECT_EQ(read.initial_loss_scale, fallback.initial_loss_scale);
  EXPECT_EQ(read.force_resume, fallback.force_resume);

  const model::GptConfig model_fallback;
  const model::GptConfig model_read = model::GptConfig::from_config(model_only());
  EXPECT_EQ(model_read.layer_norm_epsilon, model_fallback.layer_norm_epsilon);
  EXPECT_EQ(model_read.scale_attn_weights, model_fallback.scale_attn_weights);
  EXPECT_EQ(model_read.scale_attn_by_inverse_layer_idx, model_fallback.scale_attn_by_inverse_layer_idx);
}

TEST(ConfigSchema, AttentionScalingFromYaml) {
  Config yaml = Config::from_string(
      "model: {vocab_size: 11, n_positions: 8, n_embd: 8, n_layer: 1, n_head: 2, scale_attn_weights: false,\n"
      "        scale_attn_by_inverse_layer_idx: true}\ndata: {train: corpus}",
      "run.yaml", cli::run_config_schema());
  yaml.validate();
  model::GptConfig config = model::GptConfig::from_config(yaml);
  EXPECT_FALSE(config.scale_attn_weights);
  EXPECT_TRUE(config.scale_attn_by_inverse_layer_idx);
}

// The value just outside a bound: the bound itself when it is open, else one step beyond it.
std::string outside(double bound, bool open, double direction, ConfigType type) {
  if (open) return fmt::format("{}", bound);
  return type == ConfigType::integer ? fmt::format("{}", static_cast<int64_t>(bound + direction))
                                     : fmt::format("{}", bound + direction * std::max(1e-3, std::abs(bound) * 1e-3));
}

// A table of bad values, one or more per key, derived from each key's declared type and range.
TEST(ConfigSchema, EveryKeyRefusesBadValuesNamingKeyAndValue) {
  int checked = 0;
  for (const ConfigKey& spec : cli::run_config_schema()) {
    std::vector<std::string> bad;
    switch (spec.type) {
      case ConfigType::integer:
      case ConfigType::number:
        if (std::isfinite(spec.range.low)) bad.push_back(outside(spec.range.low, spec.range.low_open, -1, spec.type));
        if (std::isfinite(spec.range.high)) bad.push_back(outside(spec.range.high, spec.range.high_open, 1, spec.type));
        bad.push_back("'twelve'");
        if (spec.type == ConfigType::integer) bad.push_back("2.5");
        break;
      case ConfigType::boolean: bad.push_back("maybe"); break;
      case ConfigType::text:
        if (!spec.choices.empty()) bad.push_back("no-such-choice");
        bad.push_back("[a, b]");
        break;
    }
    for (const std::string& value : bad) {
      Config config = Config::from_string(kModel, "run.yaml", cli::run_config_schema());
      config.set(spec.key + "=" + value);
      try {
        config.validate();
        ADD_FAILURE() << spec.key << "=" << value << " was accepted";
      } catch (const InputError& e) {
        const std::string message = e.what();
        EXPECT_NE(message.find("run.yaml: key '" + spec.key + "'"), std::string::npos) << message;
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 100);
}

TEST(ConfigSchema, ValuesFromTheHardeningReportAreRefused) {
  for (const char* assignment : {"train.lr=-1", "train.min_lr=-1", "train.warmup_steps=-3", "train.eps=-1",
                                 "train.beta1=1.5", "train.grad_clip=-1", "train.threads=-1"}) {
    Config config = Config::from_string(kModel, "run.yaml", cli::run_config_schema());
    config.set(assignment);
    EXPECT_THROW(config.validate(), InputError) << assignment;
  }
  EXPECT_THROW(train::TrainConfig::from_config(model_only("train: {lr: 1.0e-4, min_lr: 1.0e-3}\n")), InputError);
}

// Evaluation without a validation split fails when the data is opened, naming the setting, not
// at the first evaluation (hours in, with the steps since the last checkpoint lost).
TEST(RunSetup, EvaluationWithoutValidationDataIsRefusedBeforeTraining) {
  testing::TempDir dir;
  write_file_atomic(dir.path() / "corpus.txt", std::string(4000, 'a'));
  write_file_atomic(dir.path() / "run.yaml",
                    fmt::format("model: {{vocab_size: 256, n_positions: 8, n_embd: 8, n_layer: 1, n_head: 2}}\n"
                                "data: {{train: {}, format: text, validation_fraction: 0}}\n"
                                "train: {{sequence_length: 8, eval_every: 5}}\n",
                                (dir.path() / "corpus.txt").string()));
  const cli::RunSetup setup = cli::RunSetup::load((dir.path() / "run.yaml").string(), {});
  try {
    setup.open_data();
    ADD_FAILURE() << "opened data with no validation split to evaluate on";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("data.validation_fraction 0"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(cli::RunSetup::load((dir.path() / "run.yaml").string(), {"train.eval_every=0"}).open_data());
}

TEST(ConfigSchema, TrainingGuideListsEveryKeyAsTheSchemaDoes) {
  std::ifstream guide(testing::source_dir() / "docs/training.md");
  std::stringstream text;
  text << guide.rdbuf();
  const std::string table = schema_markdown(cli::run_config_schema());
  EXPECT_NE(text.str().find(table), std::string::npos)
      << "docs/training.md's key table is stale: replace it with the output of `paraflow config keys`";
}

// configs/gpt-small.yaml, which docs/distributed.md's commands and deploy/kubernetes run as they
// stand, opens its data (the fortunes text that scripts/setup.sh installs) without an override.
TEST(ShippedConfigs, GptSmallOpensItsDataAsWritten) {
  const cli::RunSetup setup = cli::RunSetup::load((testing::source_dir() / "configs/gpt-small.yaml").string(), {});
  EXPECT_EQ(setup.data_format, "text");
  EXPECT_FALSE(setup.train_files.empty());
}

}  // namespace
}  // namespace paraflow
