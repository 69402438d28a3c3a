#include <gtest/gtest.h>

#include "base/config.h"

namespace paraflow {
namespace {

const ConfigSchema& test_schema() {
  static const ConfigSchema schema = {
      {.key = "train.lr", .type = ConfigType::number, .default_value = "6e-4", .range = above(0)},
      {.key = "train.steps", .type = ConfigType::integer, .default_value = "1000", .range = at_least(1)},
      {.key = "train.beta1", .type = ConfigType::number, .default_value = "0.9",
       .range = {.low = 0, .high = 1, .high_open = true}},
      {.key = "train.flag", .type = ConfigType::boolean, .default_value = "false"},
      {.key = "train.mode", .type = ConfigType::text, .default_value = "a", .choices = {"a", "b"}},
      {.key = "train.min_lr", .type = ConfigType::number, .range = at_least(0), .optional = true},
      {.key = "model.n_layer", .type = ConfigType::integer, .range = at_least(1), .help = "blocks"},
  };
  return schema;
}

std::string error_of(const std::function<void()>& body) {
  try {
    body();
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Config, OverridesDefaultsAndTypedAccess) {
  Config config = Config::from_string("train:\n  lr: 0.001\n  steps: 10\nmodel:\n  n_layer: 2\n", "test.yaml", test_schema());
  config.set("train.lr=3e-4");
  config.set("train.flag=true");
  EXPECT_NO_THROW(config.validate());
  EXPECT_DOUBLE_EQ(config.get<double>("train.lr"), 3e-4);
  EXPECT_EQ(config.get<int64_t>("train.steps"), 10);
  EXPECT_DOUBLE_EQ(config.get<double>("train.beta1"), 0.9);  // the schema's default
  EXPECT_TRUE(config.get<bool>("train.flag"));
  EXPECT_EQ(config.get<std::string>("train.mode"), "a");
  EXPECT_FALSE(config.has("train.min_lr"));
  EXPECT_EQ(config.get<int>("model.n_layer"), 2);
  EXPECT_THROW(config.get<int>("train.undeclared"), Error);  // a programming error, not input
}

TEST(Config, ValidateNamesKeyValueAndRange) {
  auto invalid = [](const std::string& assignment) {
    Config config = Config::from_string("model:\n  n_layer: 2\n", "run.yaml", test_schema());
    config.set(assignment);
    return error_of([&] { config.validate(); });
  };
  EXPECT_EQ(invalid("train.lr=-1"), "run.yaml: key 'train.lr' is -1, must be > 0");
  EXPECT_EQ(invalid("train.lr=0"), "run.yaml: key 'train.lr' is 0, must be > 0");
  EXPECT_EQ(invalid("train.beta1=1.5"), "run.yaml: key 'train.beta1' is 1.5, must be in [0, 1)");
  EXPECT_EQ(invalid("train.beta1=1"), "run.yaml: key 'train.beta1' is 1, must be in [0, 1)");
  EXPECT_EQ(invalid("train.steps=0"), "run.yaml: key 'train.steps' is 0, must be >= 1");
  EXPECT_EQ(invalid("train.min_lr=-1"), "run.yaml: key 'train.min_lr' is -1, must be >= 0");
  EXPECT_EQ(invalid("train.lr=.nan"), "run.yaml: key 'train.lr' is .nan, must be > 0");
  EXPECT_EQ(invalid("train.mode=c"), "run.yaml: key 'train.mode' is 'c', must be one of a, b");
  EXPECT_NE(invalid("train.steps=ten").find("key 'train.steps' has value 'ten', which is not a valid integer"),
            std::string::npos);
  EXPECT_NE(invalid("train.steps=1.5").find("key 'train.steps' has value '1.5'"), std::string::npos);
  EXPECT_NE(invalid("train.flag=maybe").find("key 'train.flag' has value 'maybe', which is not a valid bool"),
            std::string::npos);
  EXPECT_NE(invalid("train.steps=[1, 2]").find("key 'train.steps' must be a single integer"), std::string::npos);
  EXPECT_NE(invalid("train.stpes=3").find("unknown config key(s): train.stpes"), std::string::npos);
  EXPECT_EQ(invalid("train.lr=1e-3"), "(no error)");
}

TEST(Config, MissingRequiredKeyAndBrokenYaml) {
  Config config = Config::from_string("train:\n  lr: 0.1\n", "run.yaml", test_schema());
  EXPECT_EQ(error_of([&] { config.validate(); }), "run.yaml: missing required key 'model.n_layer' (blocks)");
  EXPECT_THROW(Config::from_string("a: [1, 2", "broken.yaml", test_schema()), InputError);
  EXPECT_THROW(config.set("novalue"), InputError);
}

TEST(Config, SchemaMarkdownListsEveryKey) {
  const std::string table = schema_markdown(test_schema());
  EXPECT_NE(table.find("| `train.lr` | number | `6e-4` | > 0 |"), std::string::npos) << table;
  EXPECT_NE(table.find("| `train.beta1` | number | `0.9` | in [0, 1) |"), std::string::npos) << table;
  EXPECT_NE(table.find("| `train.mode` | string | `a` | a \\| b |"), std::string::npos) << table;
  EXPECT_NE(table.find("| `model.n_layer` | integer | required | >= 1 | blocks |"), std::string::npos) << table;
}

}  // namespace
}  // namespace paraflow
