#include "cli/stop_signal.h"

#include <pthread.h>
#include <unistd.h>

#include <csignal>
#include <system_error>
#include <thread>

namespace paraflow::cli {

namespace {

std::atomic<bool> stop_requested{false};
std::atomic<bool> stop_handled{false};  // some command polls stop_requested

sigset_t stop_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  return set;
}

[[noreturn]] void watch_signals(sigset_t set) {
  for (;;) {
    int signal_number = 0;
    if (sigwait(&set, &signal_number) != 0) continue;
    if (!stop_handled.load()) _exit(128 + signal_number);  // the default action, without a core
    if (stop_requested.exchange(true)) {
      // A second signal while the first is being honoured: the user insists.
      static const char message[] = "second stop signal: exiting without a checkpoint\n";
      [[maybe_unused]] ssize_t written = write(STDERR_FILENO, message, sizeof message - 1);
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

const std::atomic<bool>* stop_requests() {
  stop_handled.store(true);
  return &stop_requested;
}

}  // namespace paraflow::cli
