// deploy/kubernetes/train.yaml's pods, as the trainer sees them: for every pod of the Indexed Job
// (and the evaluator Job), deploy/kubernetes/entrypoint.sh is run with the environment the
// manifest gives that container plus the JOB_COMPLETION_INDEX Kubernetes sets, and the TF_CONFIG
// it builds is parsed by the trainer's parser. Pod i must be training rank i of PARAFLOW_TASKS,
// at the DNS name Kubernetes gives it (<job>-<index>.<subdomain>, the rendezvous port), and
// every pod must agree on the chief's address.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <array>
#include <cstdio>
#include <map>
#include <memory>

#include "dist/cluster_spec.h"
#include "reference_runner.h"

namespace paraflow::dist {
namespace {

struct Pod {
  std::string job;
  YAML::Node spec;  // the Job's pod spec
  std::map<std::string, std::string> env;
};

std::vector<Pod> jobs_in(const std::filesystem::path& manifest) {
  std::vector<Pod> pods;
  for (const YAML::Node& object : YAML::LoadAllFromFile(manifest.string())) {
    if (!object || object["kind"].as<std::string>() != "Job") continue;
    Pod pod{.job = object["metadata"]["name"].as<std::string>(), .spec = object["spec"]};
    for (const YAML::Node& variable : pod.spec["template"]["spec"]["containers"][0]["env"]) {
      pod.env[variable["name"].as<std::string>()] = variable["value"].as<std::string>();
    }
    pods.push_back(pod);
  }
  return pods;
}

// What entrypoint.sh exports as TF_CONFIG for this environment (it prints it and exits).
std::string tf_config_of(const std::map<std::string, std::string>& env) {
  std::string command = "env -i PATH=/usr/bin:/bin";
  for (const auto& [name, value] : env) command += " " + name + "='" + value + "'";
  command += " bash " + (testing::source_dir() / "deploy/kubernetes/entrypoint.sh").string() + " --print-tf-config";
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(command.c_str(), "r"), pclose);
  std::string output;
  std::array<char, 4096> buffer{};
  while (size_t n = fread(buffer.data(), 1, buffer.size(), pipe.get())) output.append(buffer.data(), n);
  EXPECT_EQ(pclose(pipe.release()), 0) << command;
  return output;
}

TEST(KubernetesManifest, EveryPodGetsTheTfConfigOfItsPlaceInTheIndexedJob) {
  const std::vector<Pod> jobs = jobs_in(testing::source_dir() / "deploy/kubernetes/train.yaml");
  ASSERT_EQ(jobs.size(), 2u) << "train.yaml: the training Job and the evaluator Job";
  const Pod& training = jobs[0];
  ASSERT_EQ(training.spec["completionMode"].as<std::string>(), "Indexed");
  const int tasks = training.spec["completions"].as<int>();
  const std::string port = training.env.count("PARAFLOW_PORT") ? training.env.at("PARAFLOW_PORT") : "2222";
  const std::string subdomain = training.spec["template"]["spec"]["subdomain"].as<std::string>();
  const std::string chief = training.job + "-0." + subdomain + ":" + port;
  for (int index = 0; index < tasks; ++index) {
    std::map<std::string, std::string> env = training.env;
    env["JOB_COMPLETION_INDEX"] = std::to_string(index);
    const ClusterSpec spec = ClusterSpec::parse(tf_config_of(env));
    SCOPED_TRACE("pod " + std::to_string(index));
    EXPECT_EQ(spec.role(), index == 0 ? Role::chief : Role::worker);
    EXPECT_EQ(spec.training_rank(), index);
    EXPECT_EQ(spec.training_size(), tasks);
    // An Indexed Job's pod i is named <job>-<i>; with the subdomain its DNS name is <job>-<i>.<subdomain>.
    EXPECT_EQ(spec.address(), training.job + "-" + std::to_string(index) + "." + subdomain + ":" + port);
    EXPECT_EQ(spec.chief_address(), chief);
  }

  const Pod& evaluator = jobs[1];
  const ClusterSpec spec = ClusterSpec::parse(tf_config_of(evaluator.env));
  EXPECT_EQ(spec.role(), Role::evaluator);
  EXPECT_FALSE(spec.in_training_group());
  EXPECT_EQ(spec.training_size(), tasks);
  EXPECT_EQ(spec.chief_address(), chief);
}

}  // namespace
}  // namespace paraflow::dist
