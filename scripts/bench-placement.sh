#!/usr/bin/env bash
# scripts/bench-placement.sh - queue placement over reactors (BENCHMARKS.md "Queue placement"):
# `nvmf perf` with 4 queues x QD32, 4 KiB randread on a 1 GiB null bdev against
#   one  nvmfd -m 0                               (1 reactor)
#   bal  nvmfd -m 0,1                             (2 reactors, --queue-placement balanced)
#   ker  nvmfd -m 0,1 --queue-placement kernel    (2 reactors, the SO_REUSEPORT hash decides)
# each variant -t T seconds, ROUNDS rounds, order rotated every round. Prints per run: IOPS, the
# per-reactor I/O queue split (nvmf_get_stats current_io_qpairs, read mid-run) and nvmfd's
# CPU (% of one core). On a 2-core machine the initiator shares the cores with the reactors.
#
#   T=5 ROUNDS=3 PERF_ARGS="--poll-us 0" scripts/bench-placement.sh
#
# Needs target/release/{nvmfd,nvmf} (cargo build --release -p nvmfd -p nvmf-host), python3.
# Measures nothing useful on a busy machine: check `uptime` first. Stops what it starts.
set -u
cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.."
B=$PWD/target/release
D=$(mktemp -d /tmp/bench-placement.XXXXXX)
T=${T:-5}
ROUNDS=${ROUNDS:-3}
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
NQN=nqn.2016-06.io.spdk:place
PID=""
trap '[ -n "$PID" ] && kill $PID 2>/dev/null; rm -rf "$D"' EXIT
cat > "$D/nvmf.json" <<JSON
{"subsystems":[{"subsystem":"bdev","config":[{"method":"bdev_null_create","params":{"name":"Null0","block_size":512,"num_blocks":2097152}}]},
{"subsystem":"nvmf","config":[{"method":"nvmf_create_transport","params":{"trtype":"TCP"}},
{"method":"nvmf_create_subsystem","params":{"nqn":"$NQN","allow_any_host":true}},
{"method":"nvmf_subsystem_add_ns","params":{"nqn":"$NQN","namespace":{"nsid":1,"bdev_name":"Null0"}}},
{"method":"nvmf_subsystem_add_listener","params":{"nqn":"$NQN","listen_address":{"trtype":"TCP","adrfam":"IPv4","traddr":"127.0.0.1","trsvcid":"$PORT"}}}]}]}
JSON
TRID="trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:$PORT subnqn:$NQN"
variant() { # name, nvmfd args...
  local name=$1; shift
  "$B/nvmfd" -c "$D/nvmf.json" -r "$D/n.sock" "$@" 2>"$D/nvmfd-$name.log" &
  PID=$!
  for _ in $(seq 1 100); do grep -q "listening on 127.0.0.1:$PORT" "$D/nvmfd-$name.log" && break; sleep 0.05; done
  local t0; t0=$(awk '{print $14+$15}' /proc/$PID/stat)
  # shellcheck disable=SC2086
  timeout $((T + 30)) "$B/nvmf" perf -r "$TRID" --ns 1 --queues 4 -q 32 -w randread -o 4096 \
    -t "$T" ${PERF_ARGS:-} --json --no-progress > "$D/perf-$name.json" &
  local perf=$!
  sleep $((T / 2))
  local split; split=$(timeout 10 "$B/nvmf" rpc -s "$D/n.sock" nvmf_get_stats 2>/dev/null | python3 -c \
    'import json,sys; print("/".join(str(g["current_io_qpairs"]) for g in json.load(sys.stdin)["poll_groups"]))')
  wait $perf
  local t1; t1=$(awk '{print $14+$15}' /proc/$PID/stat)
  kill $PID; wait $PID 2>/dev/null; PID=""
  local iops; iops=$(python3 -c 'import json,sys; print(int(json.load(open(sys.argv[1]))["total"]["read"]["iops"]))' \
    "$D/perf-$name.json" 2>/dev/null || echo ERR)
  echo "$name iops=$iops split=$split nvmfd_cpu=$(( (t1 - t0) * 100 / 100 / T ))%"
}
echo "start $(date -u +%T) loadavg $(cat /proc/loadavg) perf extra args: ${PERF_ARGS:-none}"
for r in $(seq 1 "$ROUNDS"); do
  case $((r % 3)) in 1) order="one bal ker" ;; 2) order="bal ker one" ;; *) order="ker one bal" ;; esac
  for v in $order; do
    case $v in
      one) variant one -m 0 ;;
      bal) variant bal -m 0,1 ;;
      ker) variant ker -m 0,1 --queue-placement kernel ;;
    esac
  done
done
echo "end $(date -u +%T) loadavg $(cat /proc/loadavg)"
