// `--model_config_file_poll_wait_seconds`: TF Serving's model config file read again every period
// while serving; a changed file is applied with ModelRegistry::reload (models added and removed,
// policies and labels changed). A file that cannot be read or parsed, or whose labels are
// refused, is reported in the log, and the models keep serving as they were.
#pragma once

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>

#include "serve/model_registry.h"

namespace paraflow::serve {

class ConfigFileWatcher {
 public:
  // `applied`: the file's text as the server read it at start (a change from it is reloaded).
  ConfigFileWatcher(ModelRegistry& registry, std::filesystem::path file, std::string applied,
                    std::chrono::milliseconds period, bool allow_unavailable_labels, ModelRegistry::Log log);
  ~ConfigFileWatcher();  // stop()
  ConfigFileWatcher(const ConfigFileWatcher&) = delete;
  ConfigFileWatcher& operator=(const ConfigFileWatcher&) = delete;

  // Reads the file now, and reloads it if it changed.
  void check();
  void stop();  // no more reads; waits for a reload in progress

 private:
  ModelRegistry& registry_;
  std::filesystem::path file_;
  std::string applied_;  // the text last applied or reported
  bool allow_unavailable_labels_;
  ModelRegistry::Log log_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace paraflow::serve
