// A ps task: holds its shard of the variables (parameters and AdamW's two moments) and serves the
// ParameterServer gRPC service until the chief shuts it down or a stop is requested. It starts
// empty and learns everything — pieces, values, optimizer settings, mode — from the chief's Load.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>

#include "backend/backend.h"
#include "ps/channel.h"

namespace paraflow::ps {

class ParameterServerTask {
 public:
  // Listens on `address` at once (port 0: a free one). `cluster`: its TF_CONFIG cluster
  // (dist::ClusterSpec::cluster_json), which Status tells the chief; "" when unknown. `rss_before`:
  // the process's peak RSS when the task started (Status tells the chief its growth since).
  ParameterServerTask(const std::string& address, ChannelSecurity security, int64_t max_message_bytes,
                      Backend& backend, std::string cluster = "", int64_t rss_before = 0);
  ~ParameterServerTask();

  // Returns after the chief's Shutdown, or `grace` after *stop becomes true (see ShutdownLatch).
  void serve(const std::atomic<bool>* stop, std::chrono::milliseconds grace);
  int port() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace paraflow::ps
