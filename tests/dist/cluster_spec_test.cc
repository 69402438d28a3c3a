// TF_CONFIG parsing against TensorFlow's rules, and errors that quote the offending part.
#include <gtest/gtest.h>

#include "base/error.h"
#include "dist/cluster_spec.h"

namespace paraflow::dist {
namespace {

void expect_error(const std::string& tf_config, const std::string& fragment) {
  try {
    ClusterSpec::parse(tf_config);
    ADD_FAILURE() << "accepted: " << tf_config;
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

TEST(ClusterSpec, ChiefAndWorkersGetRanksInOrder) {
  const std::string cluster = R"("cluster": {"chief": ["c:1"], "worker": ["w0:2", "w1:3"], "evaluator": ["e:4"]})";
  ClusterSpec chief = ClusterSpec::parse("{" + cluster + R"(, "task": {"type": "chief", "index": 0}})");
  EXPECT_EQ(chief.role(), Role::chief);
  EXPECT_EQ(chief.training_rank(), 0);
  EXPECT_EQ(chief.training_size(), 3);
  ClusterSpec worker = ClusterSpec::parse("{" + cluster + R"(, "task": {"type": "worker", "index": 1}})");
  EXPECT_EQ(worker.role(), Role::worker);
  EXPECT_EQ(worker.training_rank(), 2);
  EXPECT_EQ(worker.address(), "w1:3");
  EXPECT_EQ(worker.chief_address(), "c:1");
  ClusterSpec evaluator = ClusterSpec::parse("{" + cluster + R"(, "task": {"type": "evaluator", "index": 0}})");
  EXPECT_EQ(evaluator.role(), Role::evaluator);
  EXPECT_FALSE(evaluator.in_training_group());
}

TEST(ClusterSpec, WorkerZeroIsChiefWithoutAChiefJob) {
  ClusterSpec spec = ClusterSpec::parse(
      R"({"cluster": {"worker": ["a:1", "b:2"], "ps": ["p:3"]}, "task": {"type": "worker", "index": 0}})");
  EXPECT_EQ(spec.role(), Role::chief);
  EXPECT_EQ(spec.training_rank(), 0);
  EXPECT_EQ(spec.training_size(), 2);
  EXPECT_EQ(spec.chief_address(), "a:1");
  ClusterSpec second = ClusterSpec::parse(R"({"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 1}})");
  EXPECT_EQ(second.role(), Role::worker);
  EXPECT_EQ(second.training_rank(), 1);
}

// What Kubeflow's training operator writes into a TFJob's PS pod (deploy/kubernetes/train-ps.yaml):
// lowercase job names, the pods' service names, and an "environment" key TensorFlow ignores.
TEST(ClusterSpec, ReadsTheTfJobOperatorsTfConfig) {
  ClusterSpec spec = ClusterSpec::parse(
      R"({"cluster":{"chief":["paraflow-gpt-small-ps-chief-0.default.svc:2222"],)"
      R"("evaluator":["paraflow-gpt-small-ps-evaluator-0.default.svc:2222"],)"
      R"("ps":["paraflow-gpt-small-ps-ps-0.default.svc:2222","paraflow-gpt-small-ps-ps-1.default.svc:2222"],)"
      R"("worker":["paraflow-gpt-small-ps-worker-0.default.svc:2222"]},)"
      R"("task":{"type":"ps","index":1},"environment":"cloud"})");
  EXPECT_EQ(spec.role(), Role::ps);
  EXPECT_EQ(spec.address(), "paraflow-gpt-small-ps-ps-1.default.svc:2222");
  EXPECT_EQ(spec.jobs.at("ps").size(), 2u);
  EXPECT_FALSE(spec.in_training_group());
}

TEST(ClusterSpec, MalformedConfigsQuoteTheOffendingPart) {
  expect_error("{not json", "TF_CONFIG {not json: invalid JSON at byte");
  expect_error(R"({"task": {"type": "worker"}})", "needs a \"cluster\"");
  expect_error(R"({"cluster": {"chief": ["a:1", "b:2"]}, "task": {"type": "chief"}})", R"(["a:1","b:2"])");
  expect_error(R"({"cluster": {"worker": ["a:1"], "evaluator": ["e:1", "e:2"]}, "task": {"type": "worker"}})",
               "at most one evaluator");
  expect_error(R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 3}})", "out of range");
  expect_error(R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "master"}})", "\"master\"");
  expect_error(R"({"cluster": {"worker": ["a"]}, "task": {"type": "worker"}})", "\"a\" is not host:port");
  expect_error(R"({"cluster": {"worker": ["a:99999"]}, "task": {"type": "worker"}})", "port");
  expect_error(R"({"cluster": {"trainer": ["a:1"]}, "task": {"type": "worker"}})", "\"trainer\"");
  expect_error(R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": "0"}})", "task.index");
  // Sparse maps: keys that are not indices (one wrote out of bounds), gaps, and an index past int.
  expect_error(R"({"cluster": {"worker": {"-1": "a:1"}}, "task": {"type": "worker"}})", "key \"-1\" is not a task index");
  expect_error(R"({"cluster": {"worker": {"x": "a:1"}}, "task": {"type": "worker"}})", "key \"x\" is not a task index");
  expect_error(R"({"cluster": {"worker": {"0": "a:1", "2": "b:1"}}, "task": {"type": "worker"}})", "has no task 1");
  expect_error(R"({"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 4294967297}})",
               "out of range");
  // One address for two tasks (a ps would answer for two shards).
  expect_error(R"({"cluster": {"worker": ["w:1"], "ps": ["h:1", "h:1"]}, "task": {"type": "worker"}})",
               "cluster.ps[0] and cluster.ps[1] have the same address h:1");
  expect_error(R"({"cluster": {"chief": [], "worker": ["w:1"]}, "task": {"type": "worker"}})", "exactly one task");
}

}  // namespace
}  // namespace paraflow::dist
