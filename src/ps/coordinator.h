// The chief of a parameter-server job (TensorFlow's ClusterCoordinator): loads the ps tasks'
// shards from the latest checkpoint (or a fresh initialisation), hands steps to whichever worker
// is free, and checkpoints by taking every shard's snapshot. A worker that dies has its step run
// by another; a ps task that fails makes the chief wait for it and reload every shard from the
// latest checkpoint; a relaunched chief resumes from it. Summaries and exports are the chief's.
// The chief never holds the model: it loads, snapshots (into a sharded checkpoint, a file per ps
// task) and exports one piece (a tensor, or a block of the embedding's rows) at a time.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "ps/channel.h"
#include "ps/placement.h"
#include "train/trainer.h"

namespace paraflow::ps {

struct ClusterSettings {
  std::vector<std::string> ps_addresses, worker_addresses;
  ChannelSecurity security;
  std::chrono::milliseconds timeout{60000};  // per call, and for a peer to come back
  int64_t max_message_bytes = 0;
  bool synchronous = true;
  int64_t max_staleness = 0;  // asynchronous
  std::string cluster;        // the chief's TF_CONFIG cluster (dist::ClusterSpec::cluster_json)
  int64_t rss_before = 0;     // the chief's peak RSS when it started
};

class Coordinator {
 public:
  Coordinator(model::GptConfig model_config, train::TrainConfig config, Placement placement, ClusterSettings settings);
  ~Coordinator();

  // Trains until train.steps (or stop_at_step) or until *stop, then checkpoints, exports, prints
  // every task's peak RSS growth and shuts the ps and worker tasks down (also when it fails on
  // wrong input).
  void run(const std::atomic<bool>* stop);

 private:
  void train_and_export(const std::atomic<bool>* stop);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace paraflow::ps
