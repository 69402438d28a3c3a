// The chief's dispatch of steps to worker tasks: one thread per worker takes the next step from a
// shared queue, so a slow worker runs fewer steps and a dead one none. A call that finds its
// worker unreachable puts the step back for another worker and marks that worker down until it
// answers again (a relaunched pod rejoins by itself).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "ps/channel.h"
#include "ps/parameter_server.pb.h"

namespace paraflow::ps {

// A ps task failed under a step (or was reloaded): the chief must recover before going on.
class ShardFailure : public Error {
 public:
  using Error::Error;
};

class WorkerPool {
 public:
  WorkerPool(const std::vector<std::string>& addresses, ChannelSecurity security, std::chrono::milliseconds timeout,
             int64_t max_message_bytes);
  ~WorkerPool();

  // Runs every step on some worker and returns the replies in the steps' order. Throws
  // ShardFailure when a worker reports a ps failure (after every call in flight has returned),
  // InputError when a worker refuses a step (its config or TF_CONFIG differs from the chief's),
  // and Error when no worker answers within the timeout.
  std::vector<StepReply> run(const std::vector<StepRequest>& steps);

  // Every worker's peak RSS growth as its Status tells it; -1 for a worker that does not answer
  // (within a second) or is in a step.
  std::vector<int64_t> peak_rss_grown();

  // Asks every worker to exit (ps::shut_down_tasks, with the pool's timeout); run() may not be
  // called after it.
  void shut_down_workers(bool wait_for_starting);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace paraflow::ps
