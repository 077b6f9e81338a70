#!/usr/bin/env bash
# scripts/bench.sh - reproduce BENCHMARKS.md: nvmfd on core 0 (`nvmfd -m 0`), the user-space
# initiator `nvmf perf` on core 1 (`--cores 1`), over 127.0.0.1 only.
#
#   scripts/bench.sh [--quick] [-t SECONDS] [--runs N] [--out DIR] [--only CASES]
#
# Cases (each variant runs N times, variants alternating, the order rotated every round so
# that drift shows up in every variant alike):
#   rr128   4 KiB randread QD128: null bdev vs malloc bdev
#   qd1     4 KiB randread QD1:   null vs malloc (mean, p99, p99.9 latency)
#   seq128  128 KiB seq read QD32 (null, malloc) vs iperf3 single stream on the same cores
#           (`iperf3 -s -A 0` / `iperf3 -c 127.0.0.1 -A 1 -t N`, and the same with -l 1M)
#   rw      4 KiB randrw 75/25 QD64: malloc vs file (bdev_uring_create, a 1 GiB file under
#           target/bench-data on a real disk, O_DIRECT)
# Default: -t 10, 5 runs (about 10 minutes). --quick: -t 3, 3 runs. --only rr128,qd1 runs a
# subset. --out DIR keeps the configs, logs and every run's JSON there (else a temp dir that
# is removed). Prints markdown (also written to DIR/report.md). No pass/fail: exit status is
# non-zero only when the script itself cannot run (build, start-up, tools).
#
# Needs: cargo, python3, iperf3 (installed with apt-get when missing and running as root),
# /usr/bin/time (package `time`, same). Everything it starts is stopped on exit (trap).
set -euo pipefail
cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.."
export PATH="$HOME/.cargo/bin:$PATH:/usr/sbin:/sbin"
REPO=$PWD

T=10 RUNS=5 OUT="" ONLY="rr128,qd1,seq128,rw"
while [ $# -gt 0 ]; do
  case $1 in
    --quick) T=3 RUNS=3; shift ;;
    -t) T=$2; shift 2 ;;
    --runs) RUNS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --only) ONLY=$2; shift 2 ;;
    -h|--help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
say() { echo "bench.sh: $*" >&2; }
want() { case ",$ONLY," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }

# ---- tools -------------------------------------------------------------------------------
need_pkgs=()
command -v iperf3 >/dev/null || need_pkgs+=(iperf3)
[ -x /usr/bin/time ] || need_pkgs+=(time)
command -v python3 >/dev/null || need_pkgs+=(python3)
if [ ${#need_pkgs[@]} -gt 0 ]; then
  [ "$(id -u)" = 0 ] || { say "missing ${need_pkgs[*]}; install them (apt-get install ${need_pkgs[*]})"; exit 1; }
  say "installing ${need_pkgs[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q "${need_pkgs[@]}" >/dev/null 2>&1 ||
    { apt-get update -q >/dev/null && apt-get install -y -q "${need_pkgs[@]}" >/dev/null; }
fi
[ "$(nproc)" -ge 2 ] || { say "needs at least 2 CPUs (target on 0, initiator on 1)"; exit 1; }

say "building nvmfd and nvmf (release)"
cargo build --release -q -p nvmfd -p nvmf-host --bin nvmfd --bin nvmf
# what was built (others may commit or edit crates/ while this runs)
BUILT="$(git rev-parse --short HEAD 2>/dev/null || echo '?')"
DIRTY=$(git status --porcelain -- crates 2>/dev/null | awk '{print $2}' | tr '\n' ' ' || true)
[ -z "$DIRTY" ] || BUILT="$BUILT + uncommitted changes in crates/: $DIRTY"
NVMFD=$REPO/target/release/nvmfd
NVMF=$REPO/target/release/nvmf
REPORT="python3 $REPO/scripts/bench-report.py"

# ---- work dir, cleanup -------------------------------------------------------------------
if [ -n "$OUT" ]; then mkdir -p "$OUT"; W=$(readlink -f "$OUT"); KEEP=1
else W=$(mktemp -d "${TMPDIR:-/tmp}/nvmfd-bench.XXXXXX"); KEEP=0; fi
DATA_DIR=$REPO/target/bench-data
DATA_FILE=$DATA_DIR/uring0.img
PIDS=()
cleanup() {
  local p
  for p in "${PIDS[@]}"; do
    if kill -0 "$p" 2>/dev/null; then
      kill -TERM "$p" 2>/dev/null || true
      for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
      kill -KILL "$p" 2>/dev/null || true
    fi
    wait "$p" 2>/dev/null || true
  done
  PIDS=()
  rm -f "$DATA_FILE"
  rmdir "$DATA_DIR" 2>/dev/null || true
  [ "$KEEP" = 1 ] || rm -rf "$W"
}
trap 'cleanup' EXIT
trap 'exit 130' INT TERM

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# LISTEN state (0A) on 127.0.0.1 (0100007F) or any address, port in hex
listening() {
  local hex; hex=$(printf '%04X' "$1")
  awk -v h=":$hex" 'NR>1 && $4=="0A" && substr($2, length($2)-4)==h {f=1} END {exit !f}' /proc/net/tcp
}

# ---- QEMU guests (the interop tests) would steal a CPU: wait for them, bounded -----------
QEMU_NOTE="no QEMU guest running at start"
if pgrep -a qemu >/dev/null 2>&1; then
  say "a QEMU guest is running; waiting up to 180 s for it to finish:"; pgrep -a qemu >&2 || true
  for _ in $(seq 180); do pgrep qemu >/dev/null || break; sleep 1; done
  if pgrep qemu >/dev/null; then QEMU_NOTE="QEMU guest(s) STILL RUNNING during the benchmark: $(pgrep -a qemu | cut -c1-120 | tr '\n' ';')"
  else QEMU_NOTE="a QEMU guest was running at start; waited for it to exit"; fi
fi
say "$QEMU_NOTE"

# ---- config ------------------------------------------------------------------------------
PORT=$(free_port)
NQN=nqn.2016-06.io.spdk:bench
TRID="trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:$PORT subnqn:$NQN"
USE_FILE=0
if want rw; then
  mkdir -p "$DATA_DIR"
  avail_kb=$(df -Pk "$DATA_DIR" | awk 'NR==2 {print $4}')
  fstype=$(df -PT "$DATA_DIR" | awk 'NR==2 {print $2}')
  [ "$fstype" != tmpfs ] || { say "$DATA_DIR is on tmpfs; the file backend needs a disk"; exit 1; }
  [ "$avail_kb" -gt $((4 * 1024 * 1024)) ] || { say "less than 4 GiB free under $DATA_DIR"; exit 1; }
  say "writing the 1 GiB file-backend image $DATA_FILE ($fstype on $(df -P "$DATA_DIR" | awk 'NR==2 {print $1}'))"
  # real writes (not fallocate): reads of unwritten extents would never reach the disk
  dd if=/dev/zero of="$DATA_FILE" bs=1M count=1024 oflag=direct conv=fsync status=none
  USE_FILE=1
fi
python3 - "$W/nvmf.json" "$PORT" "$NQN" "$USE_FILE" "$DATA_FILE" <<'EOF'
import json, sys
path, port, nqn, use_file, data_file = sys.argv[1:6]
blocks = 2 * 1024 * 1024  # 1 GiB in 512-byte blocks
bdev = [
    {"method": "bdev_null_create", "params": {"name": "Null0", "num_blocks": blocks, "block_size": 512}},
    {"method": "bdev_malloc_create", "params": {"name": "Malloc0", "num_blocks": blocks, "block_size": 512}},
]
ns = [("Null0", 1), ("Malloc0", 2)]
if use_file == "1":
    bdev.append({"method": "bdev_uring_create",
                 "params": {"name": "Uring0", "filename": data_file, "block_size": 512}})
    ns.append(("Uring0", 3))
nvmf = [
    {"method": "nvmf_create_transport", "params": {"trtype": "TCP"}},
    {"method": "nvmf_create_subsystem",
     "params": {"nqn": nqn, "serial_number": "NVMFDBENCH0001", "model_number": "nvmfd bench",
                "allow_any_host": True}},
] + [
    {"method": "nvmf_subsystem_add_ns", "params": {"nqn": nqn, "namespace": {"bdev_name": b, "nsid": n}}}
    for b, n in ns
] + [
    {"method": "nvmf_subsystem_add_listener",
     "params": {"nqn": nqn, "listen_address": {"trtype": "TCP", "adrfam": "IPv4",
                                               "traddr": "127.0.0.1", "trsvcid": port}}},
]
json.dump({"subsystems": [{"subsystem": "bdev", "config": bdev},
                          {"subsystem": "nvmf", "config": nvmf}]}, open(path, "w"), indent=1)
EOF

# ---- start nvmfd on core 0 ---------------------------------------------------------------
"$NVMFD" -c "$W/nvmf.json" -m 0 >"$W/nvmfd.log" 2>&1 &
NVMFD_PID=$!
PIDS+=("$NVMFD_PID")
for _ in $(seq 300); do
  grep -q "listening on" "$W/nvmfd.log" && break
  kill -0 "$NVMFD_PID" 2>/dev/null || { say "nvmfd exited during start-up:"; cat "$W/nvmfd.log" >&2; exit 1; }
  sleep 0.1
done
grep -q "listening on" "$W/nvmfd.log" || { say "nvmfd did not start"; cat "$W/nvmfd.log" >&2; exit 1; }
grep -q "buffered" "$W/nvmfd.log" && say "WARNING: file bdev fell back to buffered I/O (see $W/nvmfd.log)"
say "nvmfd pid $NVMFD_PID on core 0, 127.0.0.1:$PORT; results in $W"

ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
HZ=$(getconf CLK_TCK)
RES=$W/results.tsv
: >"$RES"
declare -A NSID=([null]=1 [malloc]=2 [file]=3)

# one `nvmf perf` run: CASE VARIANT ROUND NS perf-args...
perf_run() {
  local case=$1 variant=$2 round=$3 ns=$4; shift 4
  local j="$W/$case-${variant// /_}-$round.json" t0 t1 w0 w1
  t0=$(ticks "$NVMFD_PID"); w0=$(date +%s.%N)
  if ! /usr/bin/time -f '%U %S' -o "$j.time" \
        "$NVMF" perf -r "$TRID" --ns "$ns" --cores 1 -t "$T" --json --no-progress "$@" \
        >"$j" 2>"$j.err"; then
    say "run $case/$variant/$round failed: $(tail -2 "$j.err" | tr '\n' ' ')"
  fi
  t1=$(ticks "$NVMFD_PID"); w1=$(date +%s.%N)
  local ccpu; ccpu=$(awk 'END {print $1 + $2}' "$j.time" 2>/dev/null || echo 0)
  printf '%s\t%s\t%s\tperf\t%s\t%s\t%s\t%s\n' "$case" "$variant" "$round" "$j" \
    "$(echo "$w1 - $w0" | bc -l 2>/dev/null || python3 -c "print($w1-$w0)")" \
    "$(python3 -c "print(($t1-$t0)/$HZ)")" "$ccpu" >>"$RES"
}

IPERF_PORT=""
IPERF_PID=""
iperf_run() {  # CASE VARIANT ROUND extra-client-args...
  local case=$1 variant=$2 round=$3; shift 3
  local j="$W/$case-${variant// /_}-$round.json"
  iperf3 -c 127.0.0.1 -p "$IPERF_PORT" -A 1 -t "$T" -J "$@" >"$j" 2>"$j.err" ||
    say "run $case/$variant/$round failed: $(jq -r .error "$j" 2>/dev/null || tail -2 "$j.err")"
  printf '%s\t%s\t%s\tiperf3\t%s\t%s\t0\t0\n' "$case" "$variant" "$round" "$j" "$T" >>"$RES"
  sleep 0.5  # let the server take the next client
}

# exact commands, for the report
CMDS=$W/commands.md
{
  echo "- target: \`nvmfd -c nvmf.json -m 0\` (config: bdevs Null0/Malloc0 1 GiB, 512 B blocks$([ $USE_FILE = 1 ] && echo ", Uring0 = bdev_uring_create on a 1 GiB file"); namespaces 1/2/3; listener 127.0.0.1:PORT)"
  echo "- initiator: \`nvmf perf -r 'trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:PORT subnqn:$NQN' --ns NSID --cores 1 -t $T --json ARGS\`"
} >"$CMDS"

LOADS=$W/load.md
: >"$LOADS"
run_case() {  # CASE "VARIANT|ns|args" ... (ns "iperf3" = iperf3 client args)
  local case=$1; shift
  local variants=("$@") n=${#variants[@]} r i k v ns args
  $REPORT snap "$W/snap-$case-a.json"
  for ((r = 1; r <= RUNS; r++)); do
    for ((i = 0; i < n; i++)); do
      k=$(((i + r - 1) % n))   # rotate the order every round
      IFS='|' read -r v ns args <<<"${variants[$k]}"
      say "$case: $v run $r/$RUNS"
      if [ "$ns" = iperf3 ]; then
        # shellcheck disable=SC2086
        iperf_run "$case" "$v" "$r" $args
      else
        # shellcheck disable=SC2086
        perf_run "$case" "$v" "$r" "$ns" $args
      fi
    done
  done
  $REPORT snap "$W/snap-$case-b.json"
  {
    echo "**$case**"
    echo
    $REPORT load "$W/snap-$case-a.json" "$W/snap-$case-b.json" "$NVMFD_PID,${IPERF_PID}" "$RES" "$case"
    echo
  } >>"$LOADS"
  for ((i = 0; i < n; i++)); do
    IFS='|' read -r v ns args <<<"${variants[$i]}"
    if [ "$ns" = iperf3 ]; then
      echo "- $case / $v: \`iperf3 -s -A 0 -p PORT\` + \`iperf3 -c 127.0.0.1 -p PORT -A 1 -t $T -J $args\`" >>"$CMDS"
    else
      echo "- $case / $v: \`nvmf perf ... --ns $ns --cores 1 -t $T --json $args\`" >>"$CMDS"
    fi
  done
}

uptime_start=$(uptime)
$REPORT snap "$W/snap-all-a.json"
ps -eo pid,pcpu,etime,args --sort=-pcpu | head -8 | cut -c1-150 >"$W/ps-before.txt"

# warm-up (not reported): fault in the malloc bdev's pages and open the connections once
say "warm-up: 128 KiB sequential write over the malloc namespace, 2 s"
"$NVMF" perf -r "$TRID" --ns 2 --cores 1 -w write -o 128k -q 16 -t 2 --no-progress >/dev/null 2>&1 ||
  say "warm-up failed"

if want rr128; then
  run_case rr128 "null|1|-w randread -o 4096 -q 128" "malloc|2|-w randread -o 4096 -q 128"
fi
if want qd1; then
  run_case qd1 "null|1|-w randread -o 4096 -q 1" "malloc|2|-w randread -o 4096 -q 1"
fi
if want seq128; then
  IPERF_PORT=$(free_port)
  iperf3 -s -A 0 -p "$IPERF_PORT" >"$W/iperf3-server.log" 2>&1 &
  IPERF_PID=$!
  PIDS+=("$IPERF_PID")
  for _ in $(seq 50); do listening "$IPERF_PORT" && break; sleep 0.1; done
  run_case seq128 "nvmfd null|1|-w read -o 131072 -q 32" \
    "iperf3 (default 128 KiB writes)|iperf3|" \
    "nvmfd malloc|2|-w read -o 131072 -q 32" \
    "iperf3 -l 1M|iperf3|-l 1M"
  kill -TERM "$IPERF_PID" 2>/dev/null || true
  wait "$IPERF_PID" 2>/dev/null || true
  IPERF_PID=""
fi
if want rw; then
  run_case rw "malloc|2|-w randrw -M 75 -o 4096 -q 64" "file|3|-w randrw -M 75 -o 4096 -q 64"
fi

$REPORT snap "$W/snap-all-b.json"
ps -eo pid,pcpu,etime,args --sort=-pcpu | head -8 | cut -c1-150 >"$W/ps-after.txt"

{
  echo "## nvmfd benchmark, $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo
  echo "- machine: $(nproc) CPUs, $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(lscpu | sed -n 's/^Hypervisor vendor: *//p' | head -1 | sed 's/./hypervisor &/;') kernel $(uname -r)"
  echo "- built from: $BUILT; -t $T s per run, $RUNS runs per variant, variants alternating (order rotated every round)"
  echo "- $QEMU_NOTE$(pgrep qemu >/dev/null && echo '; a QEMU guest is running at the end')"
  echo "- uptime at start: \`$uptime_start\`"
  echo "- uptime at end:   \`$(uptime)\`"
  echo
  echo "### Commands"
  echo
  cat "$CMDS"
  $REPORT table "$RES"
  echo
  echo "### Load on the machine during each case"
  echo
  cat "$LOADS"
  echo "**whole run**"
  echo
  $REPORT load "$W/snap-all-a.json" "$W/snap-all-b.json" "$NVMFD_PID" "$RES" all
  echo
  echo "\`ps\` top CPU (lifetime average %) before:"
  echo
  echo '```'
  cat "$W/ps-before.txt"
  echo '```'
  echo "after:"
  echo
  echo '```'
  cat "$W/ps-after.txt"
  echo '```'
} | tee "$W/report.md"
grep -qi "error\|panic" "$W/nvmfd.log" && say "nvmfd logged errors: $(grep -ci 'error\|panic' "$W/nvmfd.log") lines (see $W/nvmfd.log)"
say "done; $([ "$KEEP" = 1 ] && echo "raw results in $W" || echo "use --out DIR to keep the raw results")"
