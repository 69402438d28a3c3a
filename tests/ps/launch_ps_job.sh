#!/usr/bin/env bash
# Starts a parameter-server job on loopback as TF_CONFIG tasks: P ps tasks, W workers and a chief
# on free ports (optionally an evaluator: EVALUATOR=1), waits for all, and fails if any failed.
#   tests/ps/launch_ps_job.sh P W command args...
set -uo pipefail
ps_tasks=$1
workers=$2
shift 2
n=$((ps_tasks + workers + 1))
source "$(dirname "${BASH_SOURCE[0]}")/../dist/free_ports.sh"
pick_free_ports "$n"
list() {  # list FIRST COUNT: "127.0.0.1:p", ...
  local out=""
  for ((i = 0; i < $2; i++)); do out+="${out:+,}\"127.0.0.1:$(($1 + i))\""; done
  echo "$out"
}
cluster="\"cluster\":{\"chief\":[\"127.0.0.1:$base\"],\"worker\":[$(list $((base + 1)) "$workers")],\"ps\":[$(list $((base + 1 + workers)) "$ps_tasks")]}"
pids=()
launch() { TF_CONFIG="{$cluster,\"task\":{\"type\":\"$1\",\"index\":$2}}" "${@:3}" & pids+=($!); }
for ((i = 0; i < ps_tasks; i++)); do launch ps "$i" "$@"; done
for ((i = 0; i < workers; i++)); do launch worker "$i" "$@"; done
[[ "${EVALUATOR:-0}" == 1 ]] && launch evaluator 0 "$@"
launch chief 0 "$@"
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
exit $status
