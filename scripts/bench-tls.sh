#!/usr/bin/env bash
# scripts/bench-tls.sh - the cost of NVMe/TCP TLS 1.3 (PSK) on nvmfd, measured side by side:
# one nvmfd (release, RAM namespace, reactor on CPU 1) with the same subsystem on a clear-text
# listener and on a TLS listener (secure_channel, host PSK), and `nvmf perf` (release, on CPU 0)
# alternating clear / TLS for ROUNDS rounds of each shape:
#   4 KiB random read QD128 and 128 KiB sequential read QD32, 1 queue, SECONDS each (+2 s ramp).
# Prints a Markdown table (median of the rounds, and TLS/clear) for BENCHMARKS.md.
# Run on a quiet machine (no guest, build or busy-polling process).
#
# usage: scripts/bench-tls.sh [ROUNDS (3)] [SECONDS (10)]
set -euo pipefail
cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.."
rounds=${1:-3} secs=${2:-10}
say() { echo "bench-tls.sh: $*" >&2; }

cargo build -q --release -p nvmfd -p nvmf-host --bin nvmfd --bin nvmf
dir=$(mktemp -d "${TMPDIR:-/tmp}/nvmfd-bench-tls.XXXXXX")
pid=
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT

NQN=nqn.2024-01.io.nvmfd:tls-bench
HOST=nqn.2014-08.org.nvmexpress:uuid:7e1a0000-0000-4000-8000-00000000b001
# a fixed benchmark key (not a secret: nothing but this run uses it)
echo "NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:" > "$dir/key"
chmod 600 "$dir/key"
CLEAR=${NVMFD_BENCH_CLEAR_PORT:-4470} TLS=${NVMFD_BENCH_TLS_PORT:-4471}
cat > "$dir/nvmfd.json" <<EOF
{"subsystems":[
 {"subsystem":"keyring","config":[{"method":"keyring_file_add_key","params":{"name":"k0","path":"$dir/key"}}]},
 {"subsystem":"bdev","config":[{"method":"bdev_malloc_create","params":{"name":"M0","num_blocks":2097152,"block_size":512}}]},
 {"subsystem":"nvmf","config":[
  {"method":"nvmf_create_transport","params":{"trtype":"TCP"}},
  {"method":"nvmf_create_subsystem","params":{"nqn":"$NQN"}},
  {"method":"nvmf_subsystem_add_ns","params":{"nqn":"$NQN","namespace":{"nsid":1,"bdev_name":"M0"}}}, 
  {"method":"nvmf_subsystem_add_host","params":{"nqn":"$NQN","host":"$HOST","psk":"k0"}},
  {"method":"nvmf_subsystem_add_listener","params":{"nqn":"$NQN","listen_address":{"trtype":"TCP","adrfam":"IPv4","traddr":"127.0.0.1","trsvcid":"$CLEAR"}}},
  {"method":"nvmf_subsystem_add_listener","params":{"nqn":"$NQN","secure_channel":true,"listen_address":{"trtype":"TCP","adrfam":"IPv4","traddr":"127.0.0.1","trsvcid":"$TLS"}}}]}]}
EOF
target/release/nvmfd -c "$dir/nvmfd.json" -m 1 -r "$dir/rpc.sock" > "$dir/nvmfd.log" 2>&1 &
pid=$!
for _ in $(seq 100); do grep -q "listening on 127.0.0.1:$TLS" "$dir/nvmfd.log" && break; sleep 0.1; done
grep -q "listening on 127.0.0.1:$TLS" "$dir/nvmfd.log" || { cat "$dir/nvmfd.log" >&2; say "nvmfd did not start"; exit 1; }

run() { # mode shape-args... -> "iops MiB/s"
  local mode=$1; shift
  local port=$CLEAR extra=()
  if [ "$mode" = tls ]; then port=$TLS; extra=(--tls-key "$dir/key"); fi
  target/release/nvmf perf -r "trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:$port subnqn:$NQN" \
    --hostnqn "$HOST" "${extra[@]}" --ns 1 --queues 1 -t "$secs" --ramp 2 --cores 0 --no-progress --json "$@" \
    | python3 -c 'import json,sys; j=json.load(sys.stdin)["jobs"][0]; r=j["read"]; print(r["iops"], r["bw"]/1024)'
}

declare -A res
for shape in "4k-randread-qd128" "128k-read-qd32"; do
  case $shape in
    4k-*) args=(-w randread -o 4k -q 128) ;;
    128k-*) args=(-w read -o 128k -q 32) ;;
  esac
  for r in $(seq "$rounds"); do
    order="clear tls"; [ $((r % 2)) = 0 ] && order="tls clear"
    for mode in $order; do
      out=$(run "$mode" "${args[@]}")
      say "$shape round $r $mode: $out (IOPS MiB/s)"
      res[$shape/$mode]+="$out;"
    done
  done
done
grep -E "TLS 1.3 session established" "$dir/nvmfd.log" | tail -1 | sed 's/^/bench-tls.sh: nvmfd: /' >&2 || true

echo "| shape | clear IOPS | TLS IOPS | clear MiB/s | TLS MiB/s | TLS / clear |"
echo "|---|---:|---:|---:|---:|---:|"
for shape in "4k-randread-qd128" "128k-read-qd32"; do
  python3 - "$shape" "${res[$shape/clear]}" "${res[$shape/tls]}" <<'EOF'
import statistics, sys
shape, c, t = sys.argv[1:4]
def med(s, i):
    return statistics.median(float(x.split()[i]) for x in s.split(';') if x.strip())
ci, ti, cb, tb = med(c, 0), med(t, 0), med(c, 1), med(t, 1)
print(f"| {shape} | {ci:,.0f} | {ti:,.0f} | {cb:,.1f} | {tb:,.1f} | {ti / ci:.3f} |")
EOF
done
