#include "dist/cluster_spec.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <map>

#include "base/error.h"
#include "base/json.h"

namespace paraflow::dist {

const char* role_name(Role role) {
  switch (role) {
    case Role::chief: return "chief";
    case Role::worker: return "worker";
    case Role::ps: return "ps";
    case Role::evaluator: return "evaluator";
  }
  return "?";
}

std::pair<std::string, int> split_host_port(const std::string& address, const std::string& what) {
  size_t colon = address.rfind(':');
  check(colon != std::string::npos && colon > 0 && colon + 1 < address.size(), "{}: address \"{}\" is not host:port",
        what, address);
  std::string port_text = address.substr(colon + 1);
  char* end = nullptr;
  long port = std::strtol(port_text.c_str(), &end, 10);
  check(*end == '\0' && port > 0 && port < 65536, "{}: port in \"{}\" must be 1..65535", what, address);
  return {address.substr(0, colon), static_cast<int>(port)};
}

ClusterSpec ClusterSpec::parse(const std::string& tf_config) {
  const nlohmann::json json = parse_json(tf_config, "TF_CONFIG " + tf_config);
  check(json.is_object(), "TF_CONFIG must be a JSON object, got {}", json.dump());
  check(json.contains("cluster") && json["cluster"].is_object(), "TF_CONFIG needs a \"cluster\" object, got {}",
        json.dump());
  ClusterSpec spec;
  for (auto& [job, addresses] : json["cluster"].items()) {
    check(job == "chief" || job == "worker" || job == "ps" || job == "evaluator",
          "TF_CONFIG cluster job \"{}\" is not one of chief, worker, ps, evaluator", job);
    std::vector<std::string> list;
    if (addresses.is_array()) {
      for (const auto& address : addresses) {
        check(address.is_string(), "TF_CONFIG cluster.{} entries must be \"host:port\" strings, got {}", job,
              address.dump());
        list.push_back(address.get<std::string>());
      }
    } else if (addresses.is_object()) {  // TensorFlow also accepts a sparse {index: address} map
      constexpr size_t kMaxTasks = 100000;
      for (auto& [index, address] : addresses.items()) {
        check(address.is_string(), "TF_CONFIG cluster.{}.{} must be a \"host:port\" string", job, index);
        check(!index.empty() && index.size() <= 6 && std::all_of(index.begin(), index.end(), ::isdigit) &&
                  std::stoul(index) < kMaxTasks,
              "TF_CONFIG cluster.{}: key \"{}\" is not a task index (0..{})", job, index, kMaxTasks - 1);
        const size_t i = std::stoul(index);
        if (list.size() <= i) list.resize(i + 1);
        list[i] = address.get<std::string>();
      }
      for (size_t i = 0; i < list.size(); ++i) {
        check(!list[i].empty(), "TF_CONFIG cluster.{} has no task {} (its indices must run 0..{} without a gap)", job,
              i, list.size() - 1);
      }
    } else {
      fail("TF_CONFIG cluster.{} must be a list of \"host:port\", got {}", job, addresses.dump());
    }
    for (const auto& address : list) split_host_port(address, "TF_CONFIG cluster." + job);
    spec.jobs[job] = list;
  }
  // Two tasks at one address would be one process answering for both (a ps holding two shards'
  // places, its Loads overwriting each other).
  std::map<std::string, std::string> owner;
  for (const auto& [job, list] : spec.jobs) {
    for (size_t i = 0; i < list.size(); ++i) {
      const std::string task = fmt::format("{}[{}]", job, i);
      const auto [at, fresh] = owner.emplace(list[i], task);
      check(fresh, "TF_CONFIG: cluster.{} and cluster.{} have the same address {}", at->second, task, list[i]);
    }
  }
  if (spec.jobs.count("chief")) {
    check(spec.jobs["chief"].size() == 1, "TF_CONFIG: cluster.chief must hold exactly one task, got {}",
          json["cluster"]["chief"].dump());
  }
  if (spec.jobs.count("evaluator")) {
    check(spec.jobs["evaluator"].size() <= 1, "TF_CONFIG: at most one evaluator, got {}",
          json["cluster"]["evaluator"].dump());
  }
  check(spec.jobs.count("chief") || spec.jobs.count("worker"), "TF_CONFIG cluster has neither chief nor worker: {}",
        json["cluster"].dump());
  check(json.contains("task") && json["task"].is_object(), "TF_CONFIG needs a \"task\" object, got {}", json.dump());
  const auto& task = json["task"];
  check(task.contains("type") && task["type"].is_string(), "TF_CONFIG task.type must be a string, got {}", task.dump());
  spec.task_type = task["type"].get<std::string>();
  if (task.contains("index")) {
    check(task["index"].is_number_integer(), "TF_CONFIG task.index must be an integer, got {}", task.dump());
    const auto index = task["index"].get<int64_t>();  // as int64: an int would wrap 2^32 + 1 to 1
    check(task["index"].is_number_unsigned() || index >= 0, "TF_CONFIG task.index must not be negative, got {}",
          task.dump());
    check(index <= std::numeric_limits<int>::max(), "TF_CONFIG task.index {} is out of range", index);
    spec.task_index = static_cast<int>(index);
  }
  check(spec.task_type == "chief" || spec.task_type == "worker" || spec.task_type == "ps" ||
            spec.task_type == "evaluator",
        "TF_CONFIG task.type \"{}\" is not one of chief, worker, ps, evaluator", spec.task_type);
  if (spec.task_type != "evaluator" || spec.jobs.count("evaluator")) {
    auto job = spec.jobs.find(spec.task_type);
    check(job != spec.jobs.end(), "TF_CONFIG task {} names a job the cluster does not have: {}", task.dump(),
          json["cluster"].dump());
    check(spec.task_index >= 0 && spec.task_index < static_cast<int>(job->second.size()),
          "TF_CONFIG task {} is out of range: cluster.{} has {} entries", task.dump(), spec.task_type,
          job->second.size());
  }
  return spec;
}

std::optional<ClusterSpec> ClusterSpec::from_environment() {
  const char* value = std::getenv("TF_CONFIG");
  if (value == nullptr || *value == '\0') return std::nullopt;
  return parse(value);
}

Role ClusterSpec::role() const {
  if (task_type == "chief") return Role::chief;
  if (task_type == "ps") return Role::ps;
  if (task_type == "evaluator") return Role::evaluator;
  return (!jobs.count("chief") && task_index == 0) ? Role::chief : Role::worker;
}

bool ClusterSpec::in_training_group() const { return task_type == "chief" || task_type == "worker"; }

int ClusterSpec::training_rank() const {
  if (task_type == "chief") return 0;
  return task_index + (jobs.count("chief") ? 1 : 0);
}

int ClusterSpec::training_size() const {
  auto count = [&](const char* job) { return jobs.count(job) ? static_cast<int>(jobs.at(job).size()) : 0; };
  return count("chief") + count("worker");
}

std::string ClusterSpec::address() const {
  auto job = jobs.find(task_type);
  return job == jobs.end() ? "" : job->second.at(static_cast<size_t>(task_index));
}

std::string ClusterSpec::cluster_json() const { return nlohmann::json(jobs).dump(); }

std::string ClusterSpec::chief_address() const {
  return jobs.count("chief") ? jobs.at("chief")[0] : jobs.at("worker")[0];
}

}  // namespace paraflow::dist
