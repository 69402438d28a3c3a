#!/usr/bin/env bash
# Starts N processes of a command as a TF_CONFIG cluster on loopback (chief + N-1 workers on
# random free ports), waits for all, and fails if any failed.
#   tests/dist/launch_tf_config.sh N command args...
set -uo pipefail
n=$1
shift
source "$(dirname "${BASH_SOURCE[0]}")/free_ports.sh"
pick_free_ports "$n"
workers=""
for ((i = 1; i < n; i++)); do workers+="${workers:+,}\"127.0.0.1:$((base + i))\""; done
cluster="\"cluster\":{\"chief\":[\"127.0.0.1:$base\"]${workers:+,\"worker\":[$workers]}}"
pids=()
for ((i = 0; i < n; i++)); do
  if ((i == 0)); then task='{"type":"chief","index":0}'; else task="{\"type\":\"worker\",\"index\":$((i - 1))}"; fi
  TF_CONFIG="{$cluster,\"task\":$task}" "$@" &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
exit $status
