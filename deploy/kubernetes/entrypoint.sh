#!/usr/bin/env bash
# Container entrypoint for a paraflow training cluster on Kubernetes: builds TF_CONFIG from the
# pod's place in an Indexed Job (JOB_COMPLETION_INDEX) and runs the same command in every pod.
# Index 0 is the chief, 1..N-1 are workers; the evaluator runs as its own Job with
# PARAFLOW_ROLE=evaluator. Pods reach each other through the headless Service:
#   <job name>-<index>.<service>:<port>
#
# Environment: PARAFLOW_JOB (Job name), PARAFLOW_SERVICE (headless Service), PARAFLOW_TASKS
# (chief + workers), PARAFLOW_PORT (default 2222), PARAFLOW_ROLE (train | evaluator),
# JOB_COMPLETION_INDEX (set by Kubernetes). `--print-tf-config` prints TF_CONFIG and exits.
set -euo pipefail
job=${PARAFLOW_JOB:?set PARAFLOW_JOB}
service=${PARAFLOW_SERVICE:?set PARAFLOW_SERVICE}
tasks=${PARAFLOW_TASKS:?set PARAFLOW_TASKS}
port=${PARAFLOW_PORT:-2222}
role=${PARAFLOW_ROLE:-train}

address() { echo "\"$job-$1.$service:$port\""; }
workers=""
for ((i = 1; i < tasks; i++)); do workers+="${workers:+,}$(address "$i")"; done
cluster="\"cluster\":{\"chief\":[$(address 0)]${workers:+,\"worker\":[$workers]},\"evaluator\":[\"$job-evaluator.$service:$port\"]}"
if [[ "$role" == evaluator ]]; then
  task='{"type":"evaluator","index":0}'
else
  index=${JOB_COMPLETION_INDEX:?not in an Indexed Job}
  if ((index == 0)); then task='{"type":"chief","index":0}'; else task="{\"type\":\"worker\",\"index\":$((index - 1))}"; fi
fi
export TF_CONFIG="{$cluster,\"task\":$task}"
if [[ "${1:-}" == --print-tf-config ]]; then
  echo "$TF_CONFIG"
  exit 0
fi
exec paraflow "$@"
