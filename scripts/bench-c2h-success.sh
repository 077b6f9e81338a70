#!/usr/bin/env bash
# scripts/bench-c2h-success.sh - what the NVMe/TCP rule on the C2H SUCCESS flag costs (BENCHMARKS.md,
# "Issue 27"): a target may end a read with its last C2HData PDU (SUCCESS flag) instead of a
# separate CapsuleResp only on a queue whose host disabled SQ flow control. `nvmf perf` disables
# it by default (so nvmfd uses the flag); `--sqflow` keeps it on, as spdk_nvme_perf and the
# Linux host do, and then nvmfd sends the CapsuleResp the spec requires (SPDK's target sets the
# flag anyway). Same nvmfd, the two initiator settings alternating, fresh connection per run.
#
#   scripts/bench-c2h-success.sh [SECONDS [ROUNDS]]     (default 10 s, 3 rounds)
#   environment: NVMFD_BIN  directory with nvmfd and nvmf (default target/release)
# nvmfd on CPU 1 (-m 1), nvmf perf on CPU 0; bench/nvmfd.json (RAM namespace 1, null namespace 2).
# Run on a quiet machine with cubic congestion control.
set -euo pipefail
cd "$(dirname "$0")/.."
T=${1:-10} ROUNDS=${2:-3} BIN=${NVMFD_BIN:-target/release}
W=$(mktemp -d /tmp/bench-c2h.XXXXXX)
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
python3 - "$PORT" "$W/nvmfd.json" <<'PY'
import json, sys
c = json.load(open("bench/nvmfd.json"))
for sub in c["subsystems"]:
    for m in sub["config"]:
        if m["method"] == "nvmf_subsystem_add_listener":
            m["params"]["listen_address"]["trsvcid"] = sys.argv[1]
json.dump(c, open(sys.argv[2], "w"))
PY
"$BIN/nvmfd" -c "$W/nvmfd.json" -m 1 -r "$W/rpc.sock" >"$W/nvmfd.log" 2>&1 &
PID=$!
trap 'kill $PID 2>/dev/null; wait $PID 2>/dev/null; rm -rf "$W"' EXIT
for _ in $(seq 100); do grep -q "listening on" "$W/nvmfd.log" && break; sleep 0.1; done
TRID="trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:$PORT subnqn:nqn.2016-06.io.spdk:bench"
echo "nvmfd $("$BIN/nvmfd" --version) on CPU 1, nvmf perf on CPU 0, ${T} s runs, $ROUNDS rounds; $(uptime)"
for r in $(seq "$ROUNDS"); do
  for case in "4k-randread-qd128 -w randread -o 4096 -q 128 --ns 2" "128k-read-qd32 -w read -o 131072 -q 32 --ns 2"; do
    set -- $case; name=$1; shift
    order="flag sqflow"; [ $((r % 2)) = 0 ] && order="sqflow flag"
    for v in $order; do
      extra=""; [ "$v" = sqflow ] && extra="--sqflow"
      "$BIN/nvmf" perf -r "$TRID" --cores 0 -t "$T" --json --no-progress $extra "$@" >"$W/$name-$v-$r.json"
      python3 - "$W/$name-$v-$r.json" "$name" "$v" "$r" <<'PY'
import json, sys
j = json.load(open(sys.argv[1])); t = j["total"]["read"]
print(f"{sys.argv[2]}\t{sys.argv[3]}\t{sys.argv[4]}\t{t['iops']:.0f}\t{t['lat_ns']['mean']/1000:.1f}")
PY
    done
  done
done | tee "$W/rows.tsv"
python3 - "$W/rows.tsv" <<'PY'
import statistics, sys
rows = [l.split("\t") for l in open(sys.argv[1]) if l.strip()]
res = {}
for name, v, r, iops, mean in rows:
    res.setdefault((name, v), []).append((float(iops), float(mean)))
print()
print("| workload | SUCCESS flag (SQ flow control off) IOPS | CapsuleResp (SQ flow control on) IOPS | cost of the rule |")
print("|---|---:|---:|---:|")
for name in dict.fromkeys(n for n, _ in res):
    a = statistics.median(x[0] for x in res[(name, "flag")])
    b = statistics.median(x[0] for x in res[(name, "sqflow")])
    print(f"| {name} | {a:,.0f} | {b:,.0f} | {b / a:.3f}x |")
PY
