// SIGTERM/SIGINT (preemption, Ctrl-C) ask long commands to stop at a safe point: the trainer
// checkpoints, the evaluator finishes its evaluation. The flag is the one global a signal needs.
#pragma once

#include <atomic>
#include <csignal>

namespace paraflow::cli {

inline std::atomic<bool>& stop_flag() {
  static std::atomic<bool> requested{false};
  return requested;
}

// Installs the handlers; returns the flag they set.
inline const std::atomic<bool>* stop_on_termination_signals() {
  auto handler = [](int) { stop_flag().store(true); };
  std::signal(SIGTERM, handler);
  std::signal(SIGINT, handler);
  return &stop_flag();
}

}  // namespace paraflow::cli
