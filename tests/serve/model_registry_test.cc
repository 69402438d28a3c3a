// The registry of served models and versions: TF Serving's model config files, base paths
// polled for versions under each version policy, a failed version reported while the previous
// one keeps serving, labels, and a swap that lets a request in flight on the old version finish.
// The versions are real export dirs (tiny random GPTs) loaded with real engines.
#include "serve/model_registry.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <fstream>
#include <future>

#include "base/file_io.h"
#include "expect_error.h"
#include "model/model_files.h"
#include "model_configs.h"
#include "reference_runner.h"

namespace paraflow::serve {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

fs::path write(const fs::path& path, const std::string& text) {
  std::ofstream(path) << text;
  return path;
}

TEST(ModelConfigFile, TfServingsTextFormat) {
  testing::TempDir dir;
  const auto sources = read_model_config_file(write(dir.path() / "models.config", R"(
    model_config_list {
      config {
        name: 'gpt'
        base_path: '/models/gpt'
        model_platform: 'tensorflow'
        model_version_policy { specific { versions: 1 versions: 2 } }
        version_labels { key: 'stable' value: 1 }
        version_labels { key: 'canary' value: 2 }
      }
      config { name: 'small' base_path: '/models/small' model_version_policy { latest { num_versions: 2 } } }
      config { name: 'every' base_path: '/models/every' model_version_policy { all {} } }
      config { name: 'plain' base_path: '/models/plain' }
    })"));
  ASSERT_EQ(sources.size(), 4u);
  EXPECT_EQ(sources[0].name, "gpt");
  EXPECT_EQ(sources[0].base_path, "/models/gpt");
  EXPECT_EQ(sources[0].policy.kind, VersionPolicy::Kind::specific);
  EXPECT_EQ(sources[0].policy.versions, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(sources[0].labels, (std::map<std::string, int64_t>{{"canary", 2}, {"stable", 1}}));
  EXPECT_EQ(sources[1].policy.kind, VersionPolicy::Kind::latest);
  EXPECT_EQ(sources[1].policy.latest_count, 2);
  EXPECT_EQ(sources[2].policy.kind, VersionPolicy::Kind::all);
  EXPECT_EQ(sources[3].policy.kind, VersionPolicy::Kind::latest);  // TF Serving's default: the newest one
  EXPECT_EQ(sources[3].policy.latest_count, 1);
}

TEST(ModelConfigFile, ErrorsNameTheFileLineAndField) {
  testing::TempDir dir;
  const fs::path file = dir.path() / "bad.config";
  testing::expect_error<InputError>([&] { read_model_config_file(write(file, "model_config_list {\n  config { nam: 'x' }\n}")); },
                             {file.string() + ":2:", "nam"});
  testing::expect_error<InputError>([&] { read_model_config_file(write(file, "model_config_list { config { name: 'x' } }")); },
                             {"config[0].base_path: is empty"});
  testing::expect_error<InputError>(
      [&] { read_model_config_file(write(file, "model_config_list { config { name: 'x' base_path: '/a' } config { name: 'x' base_path: '/b' } }")); },
      {"config[1].name", "twice"});
  testing::expect_error<InputError>(
      [&] { read_model_config_file(write(file, "model_config_list { config { name: 'x' base_path: '/a' model_platform: 'onnx' } }")); },
      {"model_platform", "onnx"});
  testing::expect_error<InputError>(
      [&] { read_model_config_file(write(file, "model_config_list { config { name: 'x' base_path: '/a' model_version_policy { specific {} } } }")); },
      {"specific: names no versions"});
  testing::expect_error<InputError>([&] { read_model_config_file(write(file, "")); }, {"names no model"});
}

// A name with ':' or '/' could not be reached ("a:b" reads as model a, label b), so it is
// refused when the server starts, from a config file or a flag alike.
TEST(ModelRegistryNames, ColonsAndSlashesAreRefused) {
  for (const char* name : {"llama:7b", "team/gpt"}) {
    testing::expect_error<InputError>(
        [&] { ModelRegistry({{.name = name, .base_path = "/nowhere"}}, nullptr, nullptr, 1s); }, {name, "cannot be in a model name"});
  }
}

// Export dirs of tiny random GPTs under <base>/<version>/; each version has its own weights.
class VersionsTest : public ::testing::Test {
 protected:
  // Under `under` (default: base()).
  void add_version(int64_t version, const fs::path& under = {}) {
    const model::GptConfig config = testing::gpt_config(37, 24, 16, 1, 2);
    model::ParameterSet parameters(model::gpt_tensor_specs(config), cpu_backend());
    Rng rng(static_cast<uint64_t>(version));
    model::initialize_gpt(parameters, config, rng.next_u64());
    model::save_model_dir((under.empty() ? base() : under) / std::to_string(version), config, parameters);
  }
  fs::path base() const { return dir.path() / "gpt"; }

  ModelRegistry& registry(VersionPolicy policy = {}, std::map<std::string, int64_t> labels = {}) {
    registry_.emplace(std::vector<ModelSource>{{.name = "gpt", .base_path = base(), .policy = policy, .labels = labels}},
                      [](const ModelSource&, int64_t, const fs::path& version_dir) {
                        return load_export_dir(version_dir, cpu_backend(), {.kv_cache_gb = 0.002});
                      },
                      [this](const std::string& line) { log.push_back(line); }, 10s);
    return *registry_;
  }
  // version -> state name, and errors, as status() reports them.
  std::map<int64_t, std::string> states() const {
    std::map<int64_t, std::string> states;
    for (const VersionStatus& status : registry_->status("gpt")) {
      states[status.version] = std::string(state_name(status.state)) + (status.error.empty() ? "" : " " + status.error);
    }
    return states;
  }

  testing::TempDir dir;
  std::vector<std::string> log;
  std::optional<ModelRegistry> registry_;
};

TEST_F(VersionsTest, TheNewestVersionServesAndAnOlderOneIsUnloaded) {
  ModelRegistry& models = registry();
  fs::create_directories(base());
  models.poll();
  EXPECT_FALSE(models.ready());
  testing::expect_error<ModelUnavailable>([&] { models.find("gpt"); }, {"no version available yet", base().string()});
  testing::expect_error<ModelNotFound>([&] { models.status("gpt"); }, {"could not find any versions"});

  add_version(1);
  fs::create_directories(base() / "not-a-version");
  models.poll();
  EXPECT_TRUE(models.ready());
  EXPECT_EQ(models.find("gpt")->version, 1);
  add_version(3);
  add_version(2);
  models.poll();
  EXPECT_EQ(models.find("gpt")->version, 3);
  EXPECT_EQ(states(), (std::map<int64_t, std::string>{{1, "END"}, {3, "AVAILABLE"}}));
  testing::expect_error<ModelNotFound>([&] { models.find("gpt", 1); }, {"no version 1"});
  testing::expect_error<ModelNotFound>([&] { models.find("gpt", 2); }, {"no version 2"});
  testing::expect_error<ModelNotFound>([&] { models.find("other"); }, {"no model \"other\"", "\"gpt\""});

  fs::remove_all(base() / "3");  // a version removed from disk is unloaded; the newest left is loaded
  models.poll();
  EXPECT_EQ(models.find("gpt")->version, 2);
  EXPECT_EQ(states().at(3), "END");
}

TEST_F(VersionsTest, PoliciesLatestNAllAndSpecific) {
  for (int64_t version : {1, 2, 3}) add_version(version);
  {
    ModelRegistry& models = registry({.kind = VersionPolicy::Kind::latest, .latest_count = 2});
    models.poll();
    EXPECT_EQ(states(), (std::map<int64_t, std::string>{{2, "AVAILABLE"}, {3, "AVAILABLE"}}));
    EXPECT_EQ(models.find("gpt")->version, 3);
    EXPECT_EQ(models.find("gpt", 2)->version, 2);
  }
  registry({.kind = VersionPolicy::Kind::all}).poll();
  EXPECT_EQ(states(), (std::map<int64_t, std::string>{{1, "AVAILABLE"}, {2, "AVAILABLE"}, {3, "AVAILABLE"}}));
  ModelRegistry& models = registry({.kind = VersionPolicy::Kind::specific, .versions = {1, 3}}, {{"stable", 1}, {"canary", 3}, {"gone", 2}});
  models.poll();
  EXPECT_EQ(states(), (std::map<int64_t, std::string>{{1, "AVAILABLE"}, {3, "AVAILABLE"}}));
  EXPECT_EQ(models.find("gpt", {}, "stable")->version, 1);
  EXPECT_EQ(models.find("gpt", {}, "canary")->version, 3);
  testing::expect_error<UnknownLabel>([&] { models.find("gpt", {}, "beta"); }, {"no version label \"beta\"", "canary, gone, stable"});
  testing::expect_error<ModelNotFound>([&] { models.find("gpt", {}, "gone"); }, {"no version 2", "label \"gone\""});
}

TEST_F(VersionsTest, AVersionThatFailsToLoadIsReportedAndThePreviousKeepsServing) {
  add_version(1);
  ModelRegistry& models = registry();
  models.poll();
  add_version(2);
  const fs::path weights = base() / "2" / "model.safetensors";
  fs::resize_file(weights, fs::file_size(weights) / 2);  // a copy cut short
  models.poll();
  EXPECT_EQ(models.find("gpt")->version, 1);
  const std::map<int64_t, std::string> reported = states();
  EXPECT_EQ(reported.at(1), "AVAILABLE");
  EXPECT_EQ(reported.at(2).rfind("END ", 0), 0u) << reported.at(2);
  EXPECT_NE(reported.at(2).find("model.safetensors"), std::string::npos) << reported.at(2);
  const std::vector<VersionStatus> failed = models.status("gpt", 2);  // asked for by version: still reported
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_EQ(failed[0].state, VersionState::end);
  EXPECT_FALSE(failed[0].error.empty());
  models.poll();  // the same files: not tried again
  EXPECT_EQ(std::count_if(log.begin(), log.end(), [](const std::string& line) { return line.find("version 2 failed") != std::string::npos; }), 1);

  add_version(2);  // the copy completed: loaded on the next poll
  models.poll();
  EXPECT_EQ(models.find("gpt")->version, 2);
  EXPECT_EQ(states(), (std::map<int64_t, std::string>{{1, "END"}, {2, "AVAILABLE"}}));
}

// A version whose files keep changing (a copy in progress: here each failure is followed by one
// more file) is tried once per poll, and loads on a later poll once it is whole. (Every failure
// made it wanted again at once: a tight loop of failing loads for as long as the copy lasted.)
TEST_F(VersionsTest, AVersionStillBeingCopiedIsTriedOncePerPoll) {
  add_version(1);
  int calls = 0;
  ModelRegistry models({{.name = "gpt", .base_path = base()}},
                       [&](const ModelSource&, int64_t, const fs::path& version_dir) {
                         if (++calls <= 3) throw InputError("still being copied");
                         return load_export_dir(version_dir, cpu_backend(), {.kv_cache_gb = 0.002});
                       },
                       [&](const std::string& line) {
                         if (line.find("failed to load") != std::string::npos) {
                           write_file_atomic(base() / "1" / fmt::format("part-{}", calls), "more bytes");
                         }
                       },
                       10s);
  models.poll();
  EXPECT_EQ(calls, 1);
  models.poll();
  EXPECT_EQ(calls, 2);
  models.poll();
  models.poll();
  EXPECT_EQ(calls, 4);
  EXPECT_EQ(models.find("gpt")->version, 1);
}

// Counts the tokens of one engine request; after the first, the engine waits for open().
class GatedSink : public infer::RequestSink {
 public:
  bool on_token(const infer::TokenEvent&) override {
    if (++tokens == 1) gate_.get_future().wait();
    return true;
  }
  void on_finish(const infer::Outcome& outcome) override { finished.set_value(outcome); }
  void open() { gate_.set_value(); }
  std::atomic<int> tokens{0};
  std::promise<infer::Outcome> finished;

 private:
  std::promise<void> gate_;
};

template <typename Condition>
void wait_until(Condition condition) {
  const auto until = std::chrono::steady_clock::now() + 30s;
  while (!condition()) {
    ASSERT_LT(std::chrono::steady_clock::now(), until) << "timed out";
    std::this_thread::sleep_for(1ms);
  }
}

TEST_F(VersionsTest, ARequestInFlightFinishesOnTheVersionBeingReplaced) {
  add_version(1);
  ModelRegistry& models = registry();
  models.poll();
  std::shared_ptr<ServedVersion> old = models.find("gpt");
  auto sink = std::make_shared<GatedSink>();
  infer::Request request;
  request.prompt = {1, 2, 3};
  request.max_tokens = 20;
  old->engine->submit(request, sink);
  wait_until([&] { return sink->tokens.load() == 1; });  // in flight, held at its first token

  add_version(2);
  auto polled = std::async(std::launch::async, [&] { models.poll(); });
  wait_until([&] { return states().at(1) == "UNLOADING"; });
  EXPECT_EQ(models.find("gpt")->version, 2);  // new requests go to version 2
  old.reset();  // a front end lets go once its request is submitted; the engine still runs it
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(states().at(1), "UNLOADING");
  sink->open();
  const infer::Outcome outcome = sink->finished.get_future().get();
  EXPECT_TRUE(outcome.error.empty()) << outcome.error;
  EXPECT_EQ(sink->tokens.load(), 20);
  polled.get();
  EXPECT_EQ(states().at(1), "END");
}

// TF Serving's config reload: models added and removed, policies changed, labels moved once the
// versions they name are loaded; a label naming a version that is not available is refused
// (unless allowed), leaving that model's labels as they were.
TEST_F(VersionsTest, AReloadAddsRemovesAndMovesLabels) {
  for (int64_t version : {1, 2}) add_version(version);
  add_version(5, dir.path() / "other");
  const VersionPolicy only_1{.kind = VersionPolicy::Kind::specific, .versions = {1}};
  ModelRegistry& models = registry(only_1, {{"stable", 1}});
  models.poll();
  models.check_labels();

  const ModelSource other{.name = "other", .base_path = dir.path() / "other"};
  models.reload({{.name = "gpt", .base_path = base(), .policy = {.kind = VersionPolicy::Kind::all},
                  .labels = {{"stable", 1}, {"canary", 2}}},
                 other},
                false);
  EXPECT_EQ(models.model_names(), (std::vector<std::string>{"gpt", "other"}));
  EXPECT_EQ(models.find("gpt", {}, "canary")->version, 2);
  EXPECT_EQ(models.find("other")->version, 5);

  models.reload({other, {.name = "gpt", .base_path = base(), .policy = {.kind = VersionPolicy::Kind::latest},
                         .labels = {{"stable", 2}}}},
                false);
  EXPECT_EQ(models.model_names(), (std::vector<std::string>{"other", "gpt"}));
  EXPECT_EQ(models.find("gpt", {}, "stable")->version, 2);
  testing::expect_error<UnknownLabel>([&] { models.find("gpt", {}, "canary"); }, {"\"canary\""});
  EXPECT_EQ(states(), (std::map<int64_t, std::string>{{1, "END"}, {2, "AVAILABLE"}}));

  testing::expect_error<InputError>(
      [&] { models.reload({{.name = "gpt", .base_path = base(), .labels = {{"stable", 7}}}}, false); },
      {"model \"gpt\": version label \"stable\" names version 7, which is not available",
       "--allow_version_labels_for_unavailable_models"});
  EXPECT_EQ(models.model_names(), (std::vector<std::string>{"gpt"}));  // the rest of the reload applied
  testing::expect_error<ModelNotFound>([&] { models.find("other"); }, {"no model \"other\""});
  EXPECT_EQ(models.find("gpt", {}, "stable")->version, 2);  // the label as it was

  models.reload({{.name = "gpt", .base_path = base(), .labels = {{"stable", 7}}}}, true);
  testing::expect_error<ModelNotFound>([&] { models.find("gpt", {}, "stable"); }, {"no version 7", "label \"stable\""});
  testing::expect_error<InputError>([&] { models.check_labels(); }, {"names version 7"});

  models.reload({{.name = "gpt", .base_path = dir.path() / "other"}}, false);  // served from elsewhere now
  EXPECT_EQ(models.find("gpt")->version, 5);
  EXPECT_EQ(states(), (std::map<int64_t, std::string>{{5, "AVAILABLE"}}));
}

TEST(ModelBasePath, AFileIsRefusedNamingIt) {
  testing::TempDir dir;
  const fs::path file = write(dir.path() / "model.safetensors", "x");
  testing::expect_error<InputError>([&] { check_base_path(file, "--model_base_path"); },
                                    {"--model_base_path " + file.string(), "is a file, not a folder"});
  check_base_path(dir.path() / "not-yet", "--model_base_path");  // waited for
  testing::expect_error<InputError>(
      [&] { read_model_config_file(write(dir.path() / "m.config", "model_config_list { config { name: 'x' base_path: '" +
                                                                 file.string() + "' } }")); },
      {"config[0].base_path " + file.string(), "is a file"});
}

}  // namespace
}  // namespace paraflow::serve
