#include "cli/stop_signal.h"

#include <fmt/format.h>
#include <pthread.h>
#include <unistd.h>

#include <csignal>
#include <optional>
#include <string>
#include <system_error>
#include <thread>

namespace paraflow::cli {

namespace {

std::atomic<bool> stop_requested{false};
std::atomic<bool> stop_handled{false};  // some command polls stop_requested
std::string insisted_message;           // written before stop_handled is set, read after

sigset_t stop_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  return set;
}

[[noreturn]] void watch_signals(sigset_t set) {
  std::optional<std::chrono::steady_clock::time_point> first;  // of the stop request
  for (;;) {
    int signal_number = 0;
    if (sigwait(&set, &signal_number) != 0) continue;
    if (!stop_handled.load()) _exit(128 + signal_number);  // the default action, without a core
    const auto now = std::chrono::steady_clock::now();
    if (!first) {
      first = now;
      stop_requested.store(true);
    } else if (now - *first >= kSameStopRequest) {
      [[maybe_unused]] ssize_t written = write(STDERR_FILENO, insisted_message.data(), insisted_message.size());
      _exit(128 + signal_number);
    }
  }
}

}  // namespace

void receive_stop_signals_on_one_thread() {
  sigset_t set = stop_signals();
  if (int error = pthread_sigmask(SIG_BLOCK, &set, nullptr); error != 0) {
    throw std::system_error(error, std::generic_category(), "pthread_sigmask");
  }
  std::thread(watch_signals, set).detach();
}

const std::atomic<bool>* stop_requests(std::string_view skipped) {
  insisted_message = fmt::format("second stop signal: exiting without {}\n", skipped);
  stop_handled.store(true);
  return &stop_requested;
}

}  // namespace paraflow::cli
