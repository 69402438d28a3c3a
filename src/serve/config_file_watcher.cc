#include "serve/config_file_watcher.h"

#include <fmt/format.h>

#include "base/file_io.h"

namespace paraflow::serve {

ConfigFileWatcher::ConfigFileWatcher(ModelRegistry& registry, std::filesystem::path file, std::string applied,
                                     std::chrono::milliseconds period, bool allow_unavailable_labels,
                                     ModelRegistry::Log log)
    : registry_(registry), file_(std::move(file)), applied_(std::move(applied)),
      allow_unavailable_labels_(allow_unavailable_labels), log_(std::move(log)) {
  thread_ = std::thread([this, period] {
    std::unique_lock lock(mutex_);
    while (!wake_.wait_for(lock, period, [this] { return stopping_; })) {
      lock.unlock();
      check();
      lock.lock();
    }
  });
}

ConfigFileWatcher::~ConfigFileWatcher() { stop(); }

void ConfigFileWatcher::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void ConfigFileWatcher::check() {
  const std::string where = "--model_config_file " + file_.string();
  std::string text;
  try {
    text = read_file(file_);
  } catch (const std::exception& error) {
    // A file being replaced may be missing for a moment: said once, tried again next period.
    if (applied_ != "") log_(fmt::format("{}: {}; still serving the config read before", where, error.what()));
    applied_ = "";
    return;
  }
  if (text == applied_) return;
  applied_ = text;  // a bad file is reported once, not every period
  try {
    log_(fmt::format("{} changed: reloading it", where));
    registry_.reload(parse_model_config(text, file_.string()), allow_unavailable_labels_);
  } catch (const std::exception& error) {
    log_(fmt::format("{}: the reload failed: {}", where, error.what()));
  }
}

}  // namespace paraflow::serve
