// TF_CONFIG, parsed exactly as TensorFlow defines it: {"cluster": {job: [addresses]}, "task":
// {"type": job, "index": i}}. Jobs: chief, worker, ps, evaluator. Worker 0 acts as chief when
// there is no chief job. The training group (the all-reduce ranks) is the chief then the workers.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace paraflow::dist {

enum class Role { chief, worker, ps, evaluator };
const char* role_name(Role role);

struct ClusterSpec {
  std::map<std::string, std::vector<std::string>> jobs;  // job -> "host:port" by index
  std::string task_type;
  int task_index = 0;

  // Throws InputError quoting the offending part of the JSON.
  static ClusterSpec parse(const std::string& tf_config);
  // From the TF_CONFIG environment variable; nullopt when it is unset or empty.
  static std::optional<ClusterSpec> from_environment();

  Role role() const;               // chief also for worker 0 when there is no chief job
  bool in_training_group() const;  // chief or worker
  int training_rank() const;       // 0 = chief
  int training_size() const;       // chiefs + workers
  std::string address() const;     // this task's host:port
  std::string chief_address() const;  // the rank-0 task's host:port
  // The "cluster" part as compact JSON with sorted keys: equal for tasks of one job.
  std::string cluster_json() const;
};

// Splits "host:port"; throws InputError naming `what` when malformed.
std::pair<std::string, int> split_host_port(const std::string& address, const std::string& what);

}  // namespace paraflow::dist
