// SIGTERM/SIGINT (preemption, Ctrl-C). Signals are blocked in every thread from the first line of
// main() and received on one dedicated thread with sigwait(), so no signal ever interrupts a
// compute thread (oneDNN's JIT code, malloc) and no work runs in a signal handler.
//
// A long command that can stop at a safe point (train checkpoints, eval --watch finishes its
// evaluation) asks for stop_requests() and polls the flag. Any other command keeps the usual
// meaning of the signal: the process ends at once with status 128 + signal number.
#pragma once

#include <atomic>

namespace paraflow::cli {

// Call first in main(), before any thread exists, so that every later thread inherits the mask.
void receive_stop_signals_on_one_thread();

// From now on SIGTERM/SIGINT set the returned flag instead of ending the process.
const std::atomic<bool>* stop_requests();

}  // namespace paraflow::cli
