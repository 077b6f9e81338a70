#!/usr/bin/env bash
# scripts/bench-h2c-zerocopy.sh — the initiator's zero-copy sends of write data (issue 27,
# BENCHMARKS.md "Zero-copy sends of write data"): `nvmf perf --zerocopy-send always|auto|off`
# writing sequentially to nvmfd's null namespace (bench/nvmfd-1m.json, max_io_size 1 MiB) at
# 16 KiB, 64 KiB, 128 KiB and 1 MiB, the three modes in rotated order per round, MiB/s per run
# and the means. nvmfd (release) runs on CPU 1 with --zerocopy-send off, nvmf perf on CPU 0.
# On loopback the kernel copies zero-copy sends anyway (and says so in its reports), so this
# measures what the mechanism costs where it cannot win.
#   scripts/bench-h2c-zerocopy.sh [ROUNDS] [SECONDS]      (default 3 rounds of 5 s)
#   environment: NVMFD_BIN (default target/release)
set -euo pipefail
cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.."
rounds=${1:-3}
secs=${2:-5}
bin=${NVMFD_BIN:-target/release}
[ -x "$bin/nvmfd" ] && [ -x "$bin/nvmf" ] || { echo "bench-h2c-zerocopy.sh: no $bin/nvmfd or $bin/nvmf (cargo build --release)" >&2; exit 1; }
tmp=$(mktemp -d /tmp/bench-h2c-zc.XXXXXX)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
nqn=$(python3 -c 'import json,sys; c=json.load(open("bench/nvmfd-1m.json")); print([m["params"]["nqn"] for s in c["subsystems"] if s["subsystem"]=="nvmf" for m in s["config"] if m["method"]=="nvmf_create_subsystem"][0])')
python3 - "$port" > "$tmp/cfg.json" <<'PYEOF'
import json, sys
c = json.load(open("bench/nvmfd-1m.json"))
for s in c["subsystems"]:
    for m in s.get("config", []):
        la = m.get("params", {}).get("listen_address")
        if la:
            la["trsvcid"] = sys.argv[1]
json.dump(c, sys.stdout)
PYEOF
taskset -c 1 "$bin/nvmfd" -m 1 -c "$tmp/cfg.json" -r "$tmp/rpc.sock" --zerocopy-send off > "$tmp/nvmfd.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$tmp"' EXIT
for _ in $(seq 1 100); do grep -q "listening on" "$tmp/nvmfd.log" && break; sleep 0.1; done
grep -q "listening on" "$tmp/nvmfd.log" || { cat "$tmp/nvmfd.log"; exit 1; }
trid="trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:$port subnqn:$nqn"
modes=(always auto off)
echo "| write size, QD | round | always MiB/s | auto MiB/s | off MiB/s |"
echo "|---|---:|---:|---:|---:|"
for shape in "16384 32" "65536 32" "131072 32" "1048576 8"; do
  set -- $shape
  declare -A sum=([always]=0 [auto]=0 [off]=0)
  for r in $(seq 1 "$rounds"); do
    declare -A got=()
    for k in 0 1 2; do
      m=${modes[$(( (k + r) % 3 ))]}
      out=$(taskset -c 0 "$bin/nvmf" perf -r "$trid" --ns 2 -w write -o "$1" -q "$2" -t "$secs" \
            --no-progress --zerocopy-send "$m" 2>&1)
      v=$(printf '%s\n' "$out" | awk '/^total:/ { print $4; exit }')
      [ -n "$v" ] || { printf '%s\n' "$out" >&2; exit 1; }
      got[$m]=$v
      sum[$m]=$(awk -v a="${sum[$m]}" -v b="$v" 'BEGIN { print a + b }')
    done
    echo "| $(( $1 / 1024 )) KiB, QD$2 | $r | ${got[always]} | ${got[auto]} | ${got[off]} |"
  done
  mean() { awk -v a="${sum[$1]}" -v n="$rounds" 'BEGIN { printf "%.0f", a / n }'; }
  echo "| $(( $1 / 1024 )) KiB, QD$2 | **mean** | $(mean always) ($(awk -v a="${sum[always]}" -v b="${sum[off]}" 'BEGIN { printf "%.2f", a / b }')×) | $(mean auto) ($(awk -v a="${sum[auto]}" -v b="${sum[off]}" 'BEGIN { printf "%.2f", a / b }')×) | $(mean off) |"
done
