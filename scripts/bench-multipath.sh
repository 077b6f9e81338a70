#!/usr/bin/env bash
# scripts/bench-multipath.sh - `nvmf perf` over one path vs two paths (BENCHMARKS.md "Multipath"):
# two nvmfd gateways export one subsystem NQN, each on its own core (G0: nvmfd -m 0, G1: nvmfd -m 1)
# with a 1 GiB null bdev, and `nvmf perf` runs against
#   one    -r G0                               (one path: one gateway does all the work)
#   rr     -r G0 -r G1                         (two paths, --policy round-robin, the default)
#   qd     -r G0 -r G1 --policy queue-depth    (two paths, fewest in flight)
# for two workloads (4 KiB randread, 2 queues x QD32; 128 KiB sequential read, 2 queues x QD16),
# each run -t T seconds, ROUNDS rounds, variant order rotated every round. Prints per run: total
# IOPS and MiB/s, the per-path split of I/Os, and each gateway's CPU (% of one core).
# Holds /tmp/nvmfd-bench.lock while it runs (others' builds and tests wait for it).
#
#   T=5 ROUNDS=3 PERF_ARGS="--poll-us 0" scripts/bench-multipath.sh
#
# Needs target/release/{nvmfd,nvmf} (cargo build --release -p nvmfd -p nvmf-host), python3.
# Stops what it starts.
set -u
cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.."
B=$PWD/target/release
D=$(mktemp -d /tmp/bench-multipath.XXXXXX)
T=${T:-5}
ROUNDS=${ROUNDS:-3}
NQN=nqn.2016-06.io.spdk:mpath
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
P0=$(free_port)
P1=$(free_port)
PIDS=()
LOCK=/tmp/nvmfd-bench.lock
while [ -e $LOCK ]; do sleep 5; done
echo "bench-multipath $$" > $LOCK
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done; rm -rf "$D"; rm -f $LOCK' EXIT
gateway() { # index, port, core
  cat > "$D/g$1.json" <<JSON
{"subsystems":[{"subsystem":"bdev","config":[{"method":"bdev_null_create","params":{"name":"Null0","block_size":512,"num_blocks":2097152}}]},
{"subsystem":"nvmf","config":[{"method":"nvmf_create_transport","params":{"trtype":"TCP"}},
{"method":"nvmf_create_subsystem","params":{"nqn":"$NQN","allow_any_host":true,"serial_number":"MPATHBENCH"}},
{"method":"nvmf_subsystem_add_ns","params":{"nqn":"$NQN","namespace":{"nsid":1,"bdev_name":"Null0"}}},
{"method":"nvmf_subsystem_add_listener","params":{"nqn":"$NQN","listen_address":{"trtype":"TCP","adrfam":"IPv4","traddr":"127.0.0.1","trsvcid":"$2"}}}]}]}
JSON
  "$B/nvmfd" -c "$D/g$1.json" -r "$D/g$1.sock" -m "$3" 2>"$D/g$1.log" &
  PIDS+=($!)
  for _ in $(seq 1 100); do grep -q "listening on 127.0.0.1:$2" "$D/g$1.log" && break; sleep 0.05; done
}
gateway 0 "$P0" 0
gateway 1 "$P1" 1
G0=${PIDS[0]}
G1=${PIDS[1]}
T0="trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:$P0 subnqn:$NQN"
T1="trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:$P1 subnqn:$NQN"
cpu() { awk '{print $14+$15}' "/proc/$1/stat"; }
run() { # variant, workload name, perf workload args...
  local v=$1 w=$2; shift 2
  local paths
  case $v in
    one) paths=(-r "$T0") ;;
    rr) paths=(-r "$T0" -r "$T1") ;;
    qd) paths=(-r "$T0" -r "$T1" --policy queue-depth) ;;
  esac
  local a0 b0; a0=$(cpu "$G0"); b0=$(cpu "$G1")
  # shellcheck disable=SC2086
  timeout $((T + 30)) "$B/nvmf" perf "${paths[@]}" --ns 1 "$@" -t "$T" ${PERF_ARGS:-} --json --no-progress \
    > "$D/perf.json" 2>"$D/perf.err"
  local a1 b1; a1=$(cpu "$G0"); b1=$(cpu "$G1")
  python3 - "$D/perf.json" "$v" "$w" $(( (a1 - a0) / T )) $(( (b1 - b0) / T )) <<'PY'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except Exception as e:
    print(f"{sys.argv[3]} {sys.argv[2]} ERROR {e}"); sys.exit()
t = r["total"]["read"]
paths = "/".join(str(p["total_ios"]) for p in r["paths"])
print(f"{sys.argv[3]:<9} {sys.argv[2]:<4} iops={int(t['iops'])} MiB/s={t['bw_bytes']/1048576:.0f} "
      f"per-path-ios={paths} errors={r['total']['error']} G0_cpu={sys.argv[4]}% G1_cpu={sys.argv[5]}%")
PY
}
echo "start $(date -u +%T) loadavg $(cat /proc/loadavg) T=$T rounds=$ROUNDS perf extra args: ${PERF_ARGS:-none}"
for r in $(seq 1 "$ROUNDS"); do
  case $((r % 3)) in 1) order="one rr qd" ;; 2) order="rr qd one" ;; *) order="qd one rr" ;; esac
  for v in $order; do
    run "$v" 4k-rand --queues 2 -q 32 -w randread -o 4096
    run "$v" 128k-seq --queues 2 -q 16 -w read -o 131072
  done
done
echo "end $(date -u +%T) loadavg $(cat /proc/loadavg)"
