// A worker task: serves the Worker gRPC service, running each step the chief hands it — pull the
// parameters from every ps task, forward and backward on its slice of the step's batch, push
// each ps task its part of the gradients. It holds no state between steps but the model's graph.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "ps/channel.h"
#include "ps/placement.h"
#include "train/batch_source.h"
#include "train/trainer.h"

namespace paraflow::ps {

struct WorkerSettings {
  std::string address;                   // this task's, from TF_CONFIG
  std::vector<std::string> ps_addresses;  // by ps task index
  ChannelSecurity security;
  std::chrono::milliseconds timeout{60000};  // for each call to a ps task
  int64_t max_message_bytes = 0;
  bool synchronous = true;
  int slices = 1;  // a step's batch is split into this many slices (synchronous: one per worker task)
  std::string cluster;  // its TF_CONFIG cluster (dist::ClusterSpec::cluster_json); "": not compared
  int64_t rss_before = 0;  // the process's peak RSS when the task started: Status tells the growth since
};

// Refuses, by name, a batch that the worker tasks cannot split in synchronous mode: every task
// (ps, worker, chief) checks it at start.
void check_synchronous_batch(int64_t batch_size, int workers);

class WorkerTask {
 public:
  WorkerTask(const model::GptConfig& model_config, const train::TrainConfig& config, train::BatchSource& data,
             Backend& backend, Placement placement, WorkerSettings settings);
  ~WorkerTask();

  // Returns after the chief's Shutdown, or `grace` after *stop becomes true (see ShutdownLatch).
  void serve(const std::atomic<bool>* stop, std::chrono::milliseconds grace);
  int port() const;  // the one it listens on (settings.address may ask for port 0: a free one)

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace paraflow::ps
