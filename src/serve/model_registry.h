// The models a server serves and their versions, managed as TF Serving manages them. A model has
// a base path holding one export dir per version (<base_path>/<version>/, numeric names; others
// are ignored) and a version policy: the newest N (`latest`, N = 1 by default), `all`, or
// `specific` versions. The base path is polled: a version the policy wants is loaded (in the
// background, while the others serve), made available, and only then are the versions the policy
// no longer wants unloaded: new requests go to the new version at once, requests in flight finish
// on the old one. A version that fails to load (a truncated file, a bad config) is reported in
// its status and left alone until its files change; the versions already loaded keep serving.
// `--model <dir>` is the same with one version, 1, that is never polled. A new config (TF
// Serving's reload: its file read again, or gRPC's HandleReloadConfigRequest) swaps models and
// labels in the same way: what it wants is loaded first, then the swap, then the unloading.
//
// States are TF Serving's (ModelVersionStatus.State): LOADING, AVAILABLE, UNLOADING, END (unloaded,
// or failed: then with the error).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "infer/chat_template.h"
#include "infer/engine.h"
#include "infer/text_codec.h"
#include "model/model_files.h"
#include "serve/predict_batcher.h"
#include "tensorflow_serving/config/model_server_config.pb.h"

namespace paraflow::serve {

struct VersionPolicy {
  enum class Kind { latest, all, specific } kind = Kind::latest;
  int64_t latest_count = 1;       // latest: how many of the newest versions
  std::vector<int64_t> versions;  // specific: which
};

struct ModelSource {
  std::string name;
  std::filesystem::path base_path;
  VersionPolicy policy;
  std::map<std::string, int64_t> labels;  // version labels ("stable" -> 3)
  bool single_version = false;            // base_path is an export dir, served as version 1
};

// A TF Serving model config file (ModelServerConfig in protobuf text format): its model_config_list.
// Errors name the file, and the line and column or the model and field.
std::vector<ModelSource> read_model_config_file(const std::filesystem::path& file);
std::vector<ModelSource> parse_model_config(const std::string& text, const std::string& source);  // the file's text
// The same for a ModelServerConfig message (a gRPC reload's); `source` names it in errors.
std::vector<ModelSource> model_sources(const tensorflow::serving::ModelServerConfig& config, const std::string& source);

// Refuses a base path that is a file (InputError, naming it as `what` says): the versions are
// folders under it. One that does not exist yet is waited for.
void check_base_path(const std::filesystem::path& base_path, const std::string& what);

// One loaded model version, ready to serve. Destroyed by the registry only (never on an engine's
// thread): front ends hold the shared_ptr while they use the version, callbacks included.
struct ServedVersion {
  std::string model;
  int64_t version = 0;
  model::LoadedModel weights;
  std::unique_ptr<infer::TextCodec> codec;
  std::optional<infer::ChatTemplate> chat_template;  // the export's, when it has one (infer/chat_template.h)
  std::unique_ptr<infer::Engine> engine;          // stops before the weights go
  std::unique_ptr<PredictBatcher> batcher;        // with --enable_batching; stops before the engine

  // A Predict: through the batcher when there is one, else straight to the engine. Throws what
  // PredictBatcher::predict or start_predict throw.
  void predict(PredictInputs inputs, std::function<void(PredictOutcome)> done);
  // Stops taking work: the batches waiting run, then requests in flight finish until `deadline`
  // and the rest are cancelled.
  void drain(std::chrono::steady_clock::time_point deadline);
};

// The Loader a server uses: an export dir's weights and tokenizer, an engine with `options`, and
// a Predict batcher when `batching` is given.
std::unique_ptr<ServedVersion> load_export_dir(const std::filesystem::path& dir, Backend& backend,
                                               const infer::EngineOptions& options,
                                               const std::optional<BatchingOptions>& batching = std::nullopt);

// A version number as TF Serving writes one (a version dir's name, a model's ":3"): decimal
// digits only; nullopt for anything else.
std::optional<int64_t> version_number(const std::string& text);

enum class VersionState { loading, available, unloading, end };
const char* state_name(VersionState state);  // TF Serving's: "LOADING", "AVAILABLE", ...

struct VersionStatus {
  int64_t version = 0;
  VersionState state = VersionState::loading;
  std::string error;  // why loading failed; empty: OK
};

// A request names a model, version or label that is not served (HTTP 404, gRPC NOT_FOUND).
class ModelNotFound : public Error {
 public:
  using Error::Error;
};
// A request names a version label the model does not have: TF Serving's INVALID_ARGUMENT (HTTP
// 400). A ModelNotFound for the OpenAI API ("name:label" names no model version: 404).
class UnknownLabel : public ModelNotFound {
 public:
  using ModelNotFound::ModelNotFound;
};
// The model is known but has no version available: loading, or every version failed (503, UNAVAILABLE).
class ModelUnavailable : public Error {
 public:
  using Error::Error;
};

class ModelRegistry {
 public:
  // Makes a ServedVersion from an export dir; throws to report a version that cannot be served.
  using Loader = std::function<std::unique_ptr<ServedVersion>(const ModelSource& source, int64_t version,
                                                              const std::filesystem::path& dir)>;
  using Log = std::function<void(const std::string& line)>;

  // `unload_grace`: how long requests in flight on a version being unloaded may take.
  ModelRegistry(std::vector<ModelSource> sources, Loader loader, Log log, std::chrono::milliseconds unload_grace);
  ~ModelRegistry();  // stops polling, drains and unloads every version
  ModelRegistry(const ModelRegistry&) = delete;
  ModelRegistry& operator=(const ModelRegistry&) = delete;

  // One scan of every base path: loads what the policies want, then unloads what they no longer
  // want. A single-version model that fails to load throws (there is nothing else to serve).
  void poll();
  // Polls every `period` on a thread of its own (0: no more polls) until drain().
  void start_polling(std::chrono::milliseconds period);
  // Throws InputError naming each version label whose version is not available (TF Serving
  // refuses them unless --allow_version_labels_for_unavailable_models).
  void check_labels() const;
  // Serves `sources` from now on, as TF Serving's config reload does: models added, removed,
  // their base paths, policies and labels changed. Versions the new config wants are loaded
  // while the old config serves (a model whose base path changed is loaded anew beside the old
  // one); then labels move and new models appear at once; then what is no longer wanted is
  // unloaded (its requests in flight finish). A label whose version is not available (unless
  // `allow_unavailable_labels`) leaves that model's labels as they were, and throws InputError
  // once the rest is done.
  void reload(std::vector<ModelSource> sources, bool allow_unavailable_labels);

  bool ready() const;  // every model has a version available
  std::vector<std::string> model_names() const;  // in the order configured
  // The version a request names: the newest available (neither given), a version, or a label's.
  // Throws ModelNotFound or ModelUnavailable, naming what was asked for.
  std::shared_ptr<ServedVersion> find(const std::string& model, std::optional<int64_t> version = {},
                                      const std::string& label = "") const;
  // Every version the model has had, newest first, or only the one a version or label names
  // (whatever its state: a failed one's error included). Throws ModelNotFound (also when the
  // model has no versions yet).
  std::vector<VersionStatus> status(const std::string& model, std::optional<int64_t> version = {},
                                    const std::string& label = "") const;

  // Stops polling and every engine: requests in flight finish within `grace`, the rest are cancelled.
  void drain(std::chrono::milliseconds grace);
  // The engines' metrics, labelled model and version, with `own`'s (unlabelled) in one exposition.
  std::string render_metrics(const MetricsRegistry& own) const;

 private:
  struct Model {
    ModelSource source;
    std::map<int64_t, VersionStatus> status;
    std::map<int64_t, std::shared_ptr<ServedVersion>> available;
    std::map<int64_t, std::string> failed;  // version -> the fingerprint of its files when it failed
    bool said_empty = false;                 // "no versions yet" is logged once, not every poll
  };
  struct Reaper;

  // The model named (mutex_ held); throws ModelNotFound.
  const Model& model(const std::string& name) const;
  Model* find_model(const std::string& name);  // nullptr when none; poll_mutex_ or mutex_ held
  static int64_t labelled_version(const Model& model, const std::string& label);  // throws UnknownLabel
  // What is wrong with `labels` on `model` ("" when every one names an available version); mutex_ held.
  static std::string label_problems(const Model& model, const std::map<std::string, int64_t>& labels);
  std::vector<int64_t> load_wanted(Model& model);  // the versions the policy wants, loaded
  void unload_unwanted(Model& model, const std::vector<int64_t>& wanted);
  void load(Model& model, int64_t version, const std::filesystem::path& dir);
  void unload(Model& model, int64_t version);
  void set_state(Model& model, int64_t version, VersionState state, std::string error = "");

  Loader loader_;
  Log log_;
  std::chrono::milliseconds unload_grace_;
  std::shared_ptr<Reaper> reaper_;
  // Guards models_ (the list, and each one's status, available and labels); changes to the list
  // and to a model's source hold poll_mutex_ too, so a poll reads them without it.
  mutable std::mutex mutex_;
  std::vector<std::unique_ptr<Model>> models_;  // in the order configured; a Model never moves
  std::mutex poll_mutex_;     // one poll or reload at a time
  std::condition_variable stop_polling_;
  bool stopping_ = false;     // guarded by mutex_
  std::thread poller_;
};

}  // namespace paraflow::serve
