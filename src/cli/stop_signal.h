// SIGTERM/SIGINT (preemption, Ctrl-C). Signals are blocked in every thread from the first line of
// main() and received on one dedicated thread with sigwait(), so no signal ever interrupts a
// compute thread (oneDNN's JIT code, malloc) and no work runs in a signal handler.
//
// A long command that can stop at a safe point (train checkpoints, serve drains, eval --watch
// finishes its evaluation) asks for stop_requests() and polls the flag. Any other command keeps
// the usual meaning of the signal: the process ends at once with status 128 + signal number.
//
// One stop request often arrives twice: GNU timeout and process managers signal the process and
// then its process group, and a terminal's Ctrl-C reaches every process of the foreground group.
// So copies within kSameStopRequest of the first signal are that one request; a signal after it
// is the user insisting, and ends the process at once (status 128 + signal number).
#pragma once

#include <atomic>
#include <chrono>
#include <string_view>

namespace paraflow::cli {

inline constexpr std::chrono::milliseconds kSameStopRequest{1000};

// Call first in main(), before any thread exists, so that every later thread inherits the mask.
void receive_stop_signals_on_one_thread();

// From now on SIGTERM/SIGINT set the returned flag instead of ending the process. `skipped` names
// what an insisting second signal gives up, for its message: "second stop signal: exiting without
// <skipped>" ("a checkpoint", "draining the requests in flight").
const std::atomic<bool>* stop_requests(std::string_view skipped);

}  // namespace paraflow::cli
