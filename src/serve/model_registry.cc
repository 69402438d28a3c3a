#include "serve/model_registry.h"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>

#include "infer/model_source.h"
#include "serve/text_proto.h"

namespace paraflow::serve {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

VersionPolicy version_policy(const tensorflow::serving::FileSystemStoragePathSourceConfig::ServableVersionPolicy& policy,
                             const std::string& where) {
  VersionPolicy result;
  if (policy.has_all()) {
    result.kind = VersionPolicy::Kind::all;
  } else if (policy.has_specific()) {
    result.kind = VersionPolicy::Kind::specific;
    result.versions.assign(policy.specific().versions().begin(), policy.specific().versions().end());
    check(!result.versions.empty(), "{}.model_version_policy.specific: names no versions", where);
  } else if (policy.has_latest() && policy.latest().num_versions() > 0) {
    result.latest_count = policy.latest().num_versions();
  }
  return result;
}

// Which files a version dir holds, their sizes and times: a failed version is tried again once
// this changes (the copy it failed on was still being written, or was replaced).
std::string fingerprint(const fs::path& dir) {
  std::vector<std::string> entries;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(dir, error)) {
    std::error_code ignored;
    entries.push_back(fmt::format("{}:{}:{}", entry.path().filename().string(), entry.file_size(ignored),
                                  entry.last_write_time(ignored).time_since_epoch().count()));
  }
  std::sort(entries.begin(), entries.end());
  std::string joined;
  for (const std::string& entry : entries) joined += entry + ";";
  return joined;
}

// The version dirs under a base path: numeric names only (TF Serving ignores the others).
std::map<int64_t, fs::path> version_dirs(const ModelSource& source) {
  if (source.single_version) return {{1, source.base_path}};
  std::map<int64_t, fs::path> versions;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(source.base_path, error)) {
    const std::optional<int64_t> version = version_number(entry.path().filename().string());
    if (entry.is_directory() && version) versions.emplace(*version, entry.path());
  }
  return versions;
}

// ':' would read as a version label in OpenAI's `model` field ("name:label"), '/' as a path step
// in TF Serving's REST paths: a model so named could not be reached.
void check_name(const std::string& name) {
  check(name.find_first_of(":/") == std::string::npos,
        "model name \"{}\": ':' and '/' cannot be in a model name (\"name:label\" selects a version; TF "
        "Serving's paths split at '/')", name);
}

}  // namespace

std::optional<int64_t> version_number(const std::string& text) {
  const bool digits = !text.empty() && text.size() <= 18 &&
                      std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (!digits) return std::nullopt;
  return std::stoll(text);
}

std::vector<ModelSource> read_model_config_file(const fs::path& file) {
  std::ifstream in(file);
  if (!in) throw IoError(fmt::format("--model_config_file {}: cannot be read", file.string()));
  std::stringstream text;
  text << in.rdbuf();
  return parse_model_config(text.str(), file.string());
}

std::vector<ModelSource> parse_model_config(const std::string& text, const std::string& source) {
  tensorflow::serving::ModelServerConfig config;
  parse_text_proto(text, config, source);
  return model_sources(config, source);
}

std::vector<ModelSource> model_sources(const tensorflow::serving::ModelServerConfig& config, const std::string& source) {
  check(config.has_model_config_list() && config.model_config_list().config_size() > 0,
        "{}: model_config_list names no model (expected model_config_list {{ config {{ name: ... base_path: ... }} }})",
        source);
  std::vector<ModelSource> sources;
  std::set<std::string> names;
  for (int i = 0; i < config.model_config_list().config_size(); ++i) {
    const auto& model = config.model_config_list().config(i);
    const std::string where = fmt::format("{}: model_config_list.config[{}]", source, i);
    check(!model.name().empty(), "{}.name: is empty", where);
    check(names.insert(model.name()).second, "{}.name: \"{}\" is configured twice", where, model.name());
    check(!model.base_path().empty(), "{}.base_path: is empty (model \"{}\")", where, model.name());
    check_base_path(model.base_path(), where + ".base_path");
    // Every platform's clients are served the same way: paraflow's export dirs are the only format.
    check(model.model_platform().empty() || model.model_platform() == "tensorflow" || model.model_platform() == "paraflow",
          "{}.model_platform: \"{}\" cannot be served (tensorflow or paraflow: paraflow export dirs)", where,
          model.model_platform());
    ModelSource parsed{.name = model.name(), .base_path = model.base_path(),
                       .policy = version_policy(model.model_version_policy(), where)};
    for (const auto& [label, version] : model.version_labels()) parsed.labels.emplace(label, version);
    sources.push_back(std::move(parsed));
  }
  return sources;
}

void check_base_path(const fs::path& base_path, const std::string& what) {
  std::error_code error;
  check(!fs::exists(base_path, error) || fs::is_directory(base_path, error),
        "{} {}: is a file, not a folder (the versions are export dirs under it: <base_path>/<version>/)", what,
        base_path.string());
}

std::unique_ptr<ServedVersion> load_export_dir(const fs::path& dir, Backend& backend, const infer::EngineOptions& options,
                                               const std::optional<BatchingOptions>& batching) {
  auto version = std::make_unique<ServedVersion>();
  // The template is refused here when outside the Jinja subset.
  infer::ModelSource source = infer::load_model_source(dir, backend, /*chat_template=*/true);
  version->weights = std::move(source.model);
  version->codec = std::make_unique<infer::TextCodec>(std::move(source.codec));
  version->chat_template = std::move(source.chat_template);
  version->engine = std::make_unique<infer::Engine>(version->weights.config, version->weights.parameters, backend, options);
  if (batching) version->batcher = std::make_unique<PredictBatcher>(*version->engine, *batching, version->engine->metrics());
  return version;
}

void ServedVersion::predict(PredictInputs inputs, std::function<void(PredictOutcome)> done) {
  if (batcher) {
    batcher->predict(std::move(inputs), std::move(done));
  } else {
    start_predict(*engine, std::move(inputs), std::move(done));
  }
}

void ServedVersion::drain(Clock::time_point deadline) {
  // The batches run into the engine until the deadline; then the engine cancels what is left,
  // and refuses the batches still waiting, so that the batcher stops at once.
  if (batcher) batcher->finish_until(deadline);
  engine->drain(std::max(std::chrono::milliseconds(0),
                         std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now())));
  if (batcher) batcher->stop();
}

const char* state_name(VersionState state) {
  switch (state) {
    case VersionState::loading: return "LOADING";
    case VersionState::available: return "AVAILABLE";
    case VersionState::unloading: return "UNLOADING";
    case VersionState::end: return "END";
  }
  return "UNKNOWN";
}

// Versions are deleted here, on the poller's thread or in the destructor, whoever let go of them
// last: the last holder may be a callback on the version's own engine thread, which cannot join itself.
struct ModelRegistry::Reaper {
  std::mutex mutex;
  std::condition_variable wake;
  std::vector<ServedVersion*> dead;
  size_t alive = 0;
  bool stop = false;

  std::shared_ptr<ServedVersion> adopt(std::unique_ptr<ServedVersion> version, std::shared_ptr<Reaper> self) {
    std::lock_guard lock(mutex);
    ++alive;
    return std::shared_ptr<ServedVersion>(version.release(), [self = std::move(self)](ServedVersion* dead_version) {
      std::lock_guard lock(self->mutex);
      self->dead.push_back(dead_version);
      self->wake.notify_all();
    });
  }
  // Deletes the versions let go of so far; call without the mutex held.
  void reap() {
    std::vector<ServedVersion*> taken;
    {
      std::lock_guard lock(mutex);
      taken.swap(dead);
    }
    for (ServedVersion* version : taken) delete version;
    std::lock_guard lock(mutex);
    alive -= taken.size();
  }
};

ModelRegistry::ModelRegistry(std::vector<ModelSource> sources, Loader loader, Log log,
                             std::chrono::milliseconds unload_grace)
    : loader_(std::move(loader)), log_(std::move(log)), unload_grace_(unload_grace),
      reaper_(std::make_shared<Reaper>()) {
  for (ModelSource& source : sources) {
    check_name(source.name);
    models_.push_back(std::make_unique<Model>(Model{.source = std::move(source)}));
  }
}

ModelRegistry::~ModelRegistry() {
  drain(std::chrono::milliseconds(0));
  {
    std::lock_guard lock(mutex_);
    for (auto& model : models_) model->available.clear();
  }
  // Whoever still holds a version lets go of it soon (a request's last callback): wait for them.
  const auto until = Clock::now() + std::chrono::seconds(10);
  for (;;) {
    reaper_->reap();
    std::unique_lock lock(reaper_->mutex);
    if (reaper_->alive == 0 || Clock::now() > until) break;
    reaper_->wake.wait_for(lock, std::chrono::milliseconds(50));
  }
}

const ModelRegistry::Model& ModelRegistry::model(const std::string& name) const {
  std::string known;
  for (const auto& model : models_) {
    if (model->source.name == name) return *model;
    known += (known.empty() ? "\"" : ", \"") + model->source.name + "\"";
  }
  throw ModelNotFound(fmt::format("no model \"{}\" is served (models: {})", name, known));
}

ModelRegistry::Model* ModelRegistry::find_model(const std::string& name) {
  for (auto& model : models_) {
    if (model->source.name == name) return model.get();
  }
  return nullptr;
}

int64_t ModelRegistry::labelled_version(const Model& model, const std::string& label) {
  const auto labelled = model.source.labels.find(label);
  if (labelled == model.source.labels.end()) {
    std::string labels;
    for (const auto& [known, version] : model.source.labels) labels += (labels.empty() ? "" : ", ") + known;
    throw UnknownLabel(fmt::format("model \"{}\" has no version label \"{}\" (labels: {})", model.source.name,
                                   label, labels.empty() ? "none" : labels));
  }
  return labelled->second;
}

std::string ModelRegistry::label_problems(const Model& model, const std::map<std::string, int64_t>& labels) {
  std::string problems;
  for (const auto& [label, version] : labels) {
    if (model.available.contains(version)) continue;
    problems += fmt::format("{}model \"{}\": version label \"{}\" names version {}, which is not available",
                            problems.empty() ? "" : "; ", model.source.name, label, version);
  }
  return problems;
}

void ModelRegistry::check_labels() const {
  std::lock_guard lock(mutex_);
  std::string problems;
  for (const auto& model : models_) {
    const std::string these = label_problems(*model, model->source.labels);
    if (!these.empty()) problems += (problems.empty() ? "" : "; ") + these;
  }
  check(problems.empty(), "{} (--allow_version_labels_for_unavailable_models lets a label name a version before it "
        "is available)", problems);
}

std::vector<std::string> ModelRegistry::model_names() const {
  std::lock_guard lock(mutex_);
  std::vector<std::string> names;
  for (const auto& model : models_) names.push_back(model->source.name);
  return names;
}

void ModelRegistry::set_state(Model& model, int64_t version, VersionState state, std::string error) {
  std::lock_guard lock(mutex_);
  model.status[version] = VersionStatus{version, state, std::move(error)};
}

void ModelRegistry::poll() {
  std::lock_guard polling(poll_mutex_);
  for (auto& model : models_) unload_unwanted(*model, load_wanted(*model));
}

void ModelRegistry::reload(std::vector<ModelSource> sources, bool allow_unavailable_labels) {
  for (const ModelSource& source : sources) check_name(source.name);
  std::lock_guard polling(poll_mutex_);
  // Each model of the new config, with its new labels set aside until its versions are loaded.
  // A new model, or one whose base path changed, is loaded beside what serves, and swapped in.
  std::vector<std::pair<Model*, std::map<std::string, int64_t>>> plan;
  std::vector<std::unique_ptr<Model>> added;
  for (ModelSource& source : sources) {
    std::map<std::string, int64_t> labels = std::move(source.labels);
    Model* model = find_model(source.name);
    if (model == nullptr || model->source.base_path != source.base_path) {
      added.push_back(std::make_unique<Model>(Model{.source = std::move(source)}));
      model = added.back().get();
    } else {
      std::lock_guard lock(mutex_);
      source.labels = std::move(model->source.labels);
      model->source = std::move(source);
    }
    plan.emplace_back(model, std::move(labels));
  }
  std::map<Model*, std::vector<int64_t>> wanted;
  for (auto& [model, labels] : plan) wanted[model] = load_wanted(*model);
  std::string problems;
  std::vector<std::unique_ptr<Model>> removed;
  {
    std::lock_guard lock(mutex_);
    if (stopping_) return;
    for (auto& [model, labels] : plan) {
      const std::string these = allow_unavailable_labels ? "" : label_problems(*model, labels);
      if (these.empty()) model->source.labels = std::move(labels);
      problems += (problems.empty() || these.empty() ? "" : "; ") + these;
    }
    std::vector<std::unique_ptr<Model>> next;
    for (auto& [model, labels] : plan) {
      auto& from = find_model(model->source.name) == model ? models_ : added;
      const auto it = std::find_if(from.begin(), from.end(), [&](const auto& owned) { return owned.get() == model; });
      next.push_back(std::move(*it));
      from.erase(it);
    }
    removed.swap(models_);  // what is left: the models the new config leaves out, or serves from elsewhere
    models_ = std::move(next);
  }
  for (auto& model : removed) {
    log_(fmt::format("model {} from {} is no longer configured: unloading it", model->source.name,
                     model->source.base_path.string()));
    unload_unwanted(*model, {});
  }
  for (auto& [model, labels] : plan) unload_unwanted(*model, wanted[model]);
  log_(fmt::format("reloaded the model config: {} models", plan.size()));
  check(problems.empty(), "{}: kept the labels as they were (--allow_version_labels_for_unavailable_models lets "
        "a label name a version before it is available)", problems);
}

std::vector<int64_t> ModelRegistry::load_wanted(Model& model) {
  const std::map<int64_t, fs::path> on_disk = version_dirs(model.source);
  if (on_disk.empty() && !model.said_empty) {
    log_(fmt::format("no versions of model {} under {} yet (waiting for <base_path>/<version>/ export dirs)",
                     model.source.name, model.source.base_path.string()));
  }
  model.said_empty = on_disk.empty();
  // The versions the policy wants, newest first, leaving out those that failed on these files,
  // and those this poll tried already (a version still being copied changes its files between
  // tries: it waits for the next poll, not a tight loop of failing loads).
  std::set<int64_t> tried;
  auto wanted = [&] {
    std::vector<int64_t> versions;
    for (auto it = on_disk.rbegin(); it != on_disk.rend(); ++it) {
      const auto failed = model.failed.find(it->first);
      if (failed != model.failed.end() && (tried.contains(it->first) || failed->second == fingerprint(it->second))) {
        continue;
      }
      const VersionPolicy& policy = model.source.policy;
      if (policy.kind == VersionPolicy::Kind::specific &&
          std::find(policy.versions.begin(), policy.versions.end(), it->first) == policy.versions.end()) {
        continue;
      }
      versions.push_back(it->first);
      if (policy.kind == VersionPolicy::Kind::latest && static_cast<int64_t>(versions.size()) == policy.latest_count) {
        break;
      }
    }
    return versions;
  };
  // A version failing to load changes what is wanted (the next older one): ask again until stable.
  std::vector<int64_t> versions;
  for (bool loaded_all = false; !loaded_all;) {
    versions = wanted();
    loaded_all = true;
    for (int64_t version : versions) {
      bool loaded;
      {
        std::lock_guard lock(mutex_);
        if (stopping_) return versions;
        loaded = model.available.contains(version);
      }
      if (loaded) continue;
      tried.insert(version);
      load(model, version, on_disk.at(version));
      std::lock_guard lock(mutex_);
      if (!model.available.contains(version)) loaded_all = false;
    }
  }
  return versions;
}

void ModelRegistry::unload_unwanted(Model& model, const std::vector<int64_t>& versions) {
  std::vector<int64_t> unwanted;
  {
    std::lock_guard lock(mutex_);
    for (const auto& [version, served] : model.available) {
      if (std::find(versions.begin(), versions.end(), version) == versions.end()) unwanted.push_back(version);
    }
  }
  for (int64_t version : unwanted) unload(model, version);
}

void ModelRegistry::load(Model& model, int64_t version, const fs::path& dir) {
  const std::string name = model.source.name;
  set_state(model, version, VersionState::loading);
  log_(fmt::format("loading model {} version {} from {}", name, version, dir.string()));
  try {
    std::shared_ptr<ServedVersion> served = reaper_->adopt(loader_(model.source, version, dir), reaper_);
    served->model = name;
    served->version = version;
    std::lock_guard lock(mutex_);
    model.available.emplace(version, std::move(served));
    model.status[version] = VersionStatus{version, VersionState::available, ""};
    model.failed.erase(version);
  } catch (const std::exception& error) {
    set_state(model, version, VersionState::end, error.what());
    model.failed[version] = fingerprint(dir);
    log_(fmt::format("model {} version {} failed to load: {}", name, version, error.what()));
    if (model.source.single_version) throw;
    return;
  }
  log_(fmt::format("model {} version {} is available", name, version));
}

void ModelRegistry::unload(Model& model, int64_t version) {
  std::shared_ptr<ServedVersion> served;
  {
    std::lock_guard lock(mutex_);
    served = std::move(model.available.at(version));
    model.available.erase(version);
    model.status[version] = VersionStatus{version, VersionState::unloading, ""};
  }
  log_(fmt::format("unloading model {} version {}", model.source.name, version));
  // New requests no longer find it. Those that found it just before may not have reached the
  // engine yet: wait for them to let go before the engine refuses new work.
  const auto until = Clock::now() + unload_grace_;
  while (served.use_count() > 1 && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  served->drain(until);
  served.reset();
  set_state(model, version, VersionState::end);
}

void ModelRegistry::start_polling(std::chrono::milliseconds period) {
  poller_ = std::thread([this, period] {
    auto next_poll = period.count() > 0 ? Clock::now() + period : Clock::time_point::max();
    for (;;) {
      {
        std::unique_lock lock(reaper_->mutex);
        reaper_->wake.wait_until(lock, next_poll, [&] { return reaper_->stop || !reaper_->dead.empty(); });
        if (reaper_->stop) return;
      }
      reaper_->reap();
      if (Clock::now() < next_poll) continue;
      try {
        poll();
      } catch (const std::exception& error) {
        log_(fmt::format("polling the model base paths failed: {}", error.what()));
      }
      next_poll = Clock::now() + period;
    }
  });
}

bool ModelRegistry::ready() const {
  std::lock_guard lock(mutex_);
  return std::all_of(models_.begin(), models_.end(), [](const auto& model) { return !model->available.empty(); });
}

std::shared_ptr<ServedVersion> ModelRegistry::find(const std::string& name, std::optional<int64_t> version,
                                                   const std::string& label) const {
  std::lock_guard lock(mutex_);
  const Model& found = model(name);
  if (!label.empty()) version = labelled_version(found, label);
  if (version) {
    const auto served = found.available.find(*version);
    if (served != found.available.end()) return served->second;
    const auto status = found.status.find(*version);
    if (status == found.status.end() || status->second.state == VersionState::end) {
      throw ModelNotFound(fmt::format("model \"{}\" has no version {} available{}", name, *version,
                                      label.empty() ? "" : fmt::format(" (label \"{}\")", label)));
    }
    throw ModelUnavailable(fmt::format("model \"{}\" version {} is {}", name, *version, state_name(status->second.state)));
  }
  if (found.available.empty()) {
    throw ModelUnavailable(fmt::format("model \"{}\" has no version available yet (base path {})", name,
                                       found.source.base_path.string()));
  }
  return found.available.rbegin()->second;
}

std::vector<VersionStatus> ModelRegistry::status(const std::string& name, std::optional<int64_t> version,
                                               const std::string& label) const {
  std::lock_guard lock(mutex_);
  const Model& found = model(name);
  if (!label.empty()) version = labelled_version(found, label);
  if (found.status.empty()) {
    throw ModelNotFound(fmt::format("could not find any versions of model \"{}\" (base path {})", name,
                                    found.source.base_path.string()));
  }
  if (version) {
    const auto status = found.status.find(*version);
    if (status == found.status.end()) throw ModelNotFound(fmt::format("model \"{}\" has no version {}", name, *version));
    return {status->second};
  }
  std::vector<VersionStatus> statuses;
  for (auto it = found.status.rbegin(); it != found.status.rend(); ++it) statuses.push_back(it->second);
  return statuses;
}

void ModelRegistry::drain(std::chrono::milliseconds grace) {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  {
    std::lock_guard lock(reaper_->mutex);
    reaper_->stop = true;
    reaper_->wake.notify_all();
  }
  if (poller_.joinable()) poller_.join();
  std::lock_guard polling(poll_mutex_);
  std::vector<std::shared_ptr<ServedVersion>> versions;
  {
    std::lock_guard lock(mutex_);
    for (auto& model : models_) {
      for (const auto& [version, served] : model->available) versions.push_back(served);
    }
  }
  // Every version stops taking work first (the front ends refuse new requests already), then
  // each waits for its own against one shared deadline: the engines keep running side by side.
  const auto until = Clock::now() + grace;
  for (const auto& served : versions) {
    if (served->batcher) served->batcher->stop_accepting();
  }
  for (const auto& served : versions) served->drain(until);
}

std::string ModelRegistry::render_metrics(const MetricsRegistry& own) const {
  std::vector<std::shared_ptr<ServedVersion>> versions;
  std::vector<LabelledMetrics> sources;
  {
    std::lock_guard lock(mutex_);
    for (const auto& model : models_) {
      for (const auto& [version, served] : model->available) {
        versions.push_back(served);
        sources.push_back({&served->engine->metrics(), {{"model", model->source.name}, {"version", std::to_string(version)}}});
      }
    }
  }
  sources.push_back({&own, {}});
  return paraflow::render_metrics(sources);
}

}  // namespace paraflow::serve
