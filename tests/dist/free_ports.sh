# Sourced by the launchers: sets `base` to the first of N consecutive free loopback ports below the
# kernel's ephemeral range (32768 and up by default), so that no outgoing connection of another
# test holds one of them; nothing may be listening on them either.
#   source tests/dist/free_ports.sh; pick_free_ports N
pick_free_ports() {
  local n=$1 ephemeral_low taken
  read -r ephemeral_low _ < /proc/sys/net/ipv4/ip_local_port_range
  for attempt in $(seq 1 50); do
    base=$((10000 + RANDOM % (ephemeral_low - 10000 - n)))
    taken=0
    for ((i = 0; i < n; i++)); do
      (exec 3<>/dev/tcp/127.0.0.1/$((base + i))) 2>/dev/null && taken=1
    done
    ((taken == 0)) && return 0
  done
  return 1
}
