#!/usr/bin/env bash
# scripts/bench-rbd.sh - nvmfd as an RBD gateway against librbd itself: the issue's seed workloads
# through `nvmf perf` -> nvmfd -> RBD, side by side with fio's rbd engine on the same image.
#
#   scripts/bench-rbd.sh [-t SECONDS] [--runs N] [--out DIR] [--gw-core N] [--cli-core N]
#                        [--nvmfd-args "ARGS"]   (extra nvmfd options, e.g. "--poll-us 0")
#                        [--perf-args "ARGS"]    (extra nvmf perf options, e.g. "--poll-us 0": on a
#                                                 2-core box a busy-polling initiator takes the CPU the
#                                                 unpinned OSD needs, which fio-rbd has no initiator to do)
#                        [--old-nvmfd BIN]       (an earlier nvmfd build as a third side, "nvmfd-old":
#                                                 before/after in the same run, same options)
#
# Starts a one-node Ceph cluster (testbed/ceph-cluster, 1 OSD on a file, 127.0.0.1), makes a
# 1 GiB image without exclusive-lock (--image-feature layering) and fills it (so reads reach
# the OSD's data), starts nvmfd pinned to the gateway core (`-m GW`) with the image as a
# namespace (bdev_rbd_register_cluster + bdev_rbd_create, 4 KiB blocks, nvmfd's defaults:
# rbd_cache off; the whole process, librbd's threads included, under taskset), then runs,
# alternating, each case RUNS times for -t seconds:
#   randrw  4 KiB randrw 75/25 QD64
#   randrd  4 KiB randread QD128
# as `nvmf perf` on the client core against nvmfd, and as `fio --ioengine=rbd` pinned to the
# gateway core (fio does in-process the librbd work nvmfd does; same rbd_cache=false).
# Ceph's daemons run unpinned. Prints a markdown table: IOPS, mean and p99.9 latency,
# gateway CPU per I/O (nvmfd's or fio's own CPU time from /proc/PID/stat over the run / I/Os)
# and the nvmfd / fio-rbd ratios (medians over the runs). Defaults: -t 10, --runs 3,
# --gw-core 0, --cli-core 1. Run on a quiet machine (no QEMU guest, no builds). Needs root
# (the cluster's OSD), fio with the rbd engine, python3. Everything started is stopped on exit.
set -euo pipefail
cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.."
export PATH="$HOME/.cargo/bin:$PATH:/usr/sbin:/sbin"
REPO=$PWD

T=10 RUNS=3 OUT="" GW=0 CLI=1 NVMFD_ARGS="" PERF_ARGS="" OLD_NVMFD=""
while [ $# -gt 0 ]; do
  case $1 in
    -t) T=$2; shift 2 ;;
    --runs) RUNS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --gw-core) GW=$2; shift 2 ;;
    --cli-core) CLI=$2; shift 2 ;;
    --nvmfd-args) NVMFD_ARGS=$2; shift 2 ;;
    --perf-args) PERF_ARGS=$2; shift 2 ;;
    --old-nvmfd) OLD_NVMFD=$(readlink -f "$2"); shift 2 ;;
    -h|--help) sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench-rbd.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
say() { echo "bench-rbd.sh: $*" >&2; }

command -v fio >/dev/null || { say "fio missing (apt-get install fio)"; exit 1; }
fio --enghelp=rbd >/dev/null 2>&1 || { say "this fio has no rbd engine"; exit 1; }
[ -x /usr/bin/ceph-osd ] || { say "Ceph missing (scripts/test.sh installs ceph-mon ceph-mgr ceph-osd ceph-common)"; exit 1; }
[ "$(id -u)" = 0 ] || { say "needs root (the OSD opens its block file with O_DIRECT)"; exit 1; }

say "building nvmfd and nvmf (release)"
cargo build --release -q -p nvmfd -p nvmf-host --bin nvmfd --bin nvmf
BUILT="$(git rev-parse --short HEAD 2>/dev/null || echo '?')"
NVMFD=$REPO/target/release/nvmfd
NVMF=$REPO/target/release/nvmf

if [ -n "$OUT" ]; then mkdir -p "$OUT"; W=$(readlink -f "$OUT"); KEEP=1
else W=$(mktemp -d "${TMPDIR:-/tmp}/nvmfd-bench-rbd.XXXXXX"); KEEP=0; fi
CEPH=$W/ceph
CLUSTER=$REPO/testbed/ceph-cluster
NVMFD_PID="" OLD_PID=""
cleanup() {
  for pid in $NVMFD_PID $OLD_PID; do
    kill -0 "$pid" 2>/dev/null || continue
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  done
  [ -e "$CEPH/ceph.conf" ] && "$CLUSTER" stop "$CEPH" >/dev/null 2>&1 || true
  [ "$KEEP" = 1 ] || rm -rf "$W"
}
trap 'cleanup' EXIT
trap 'exit 130' INT TERM

# ---- cluster and image -------------------------------------------------------------------
t0=$(date +%s.%N)
"$CLUSTER" start "$CEPH" --osds 1 --pool rbd --owner-pid $$ >"$W/cluster.log" 2>&1 ||
  { cat "$W/cluster.log" >&2; say "cluster start failed"; exit 1; }
CLUSTER_S=$(python3 -c "import time; print(f'{time.time() - $t0:.1f}')")
say "cluster up in $CLUSTER_S s"
CONF=$CEPH/ceph.conf
timeout 60 rbd -c "$CONF" create --size 1G --image-feature layering rbd/bench
# fio's librbd reads this conf: same cache setting as nvmfd's default.
FIO_CONF=$W/fio-ceph.conf
{ cat "$CONF"; printf '\n[client]\nrbd_cache = false\n'; } >"$FIO_CONF"
say "filling the image (1 GiB sequential writes through fio's rbd engine)"
CEPH_CONF=$FIO_CONF timeout 300 fio --name=fill --ioengine=rbd --clientname=admin --pool=rbd \
  --rbdname=bench --rw=write --bs=1M --iodepth=16 --size=1G >"$W/fill.log" 2>&1 ||
  { tail -5 "$W/fill.log" >&2; say "fill failed"; exit 1; }

# ---- nvmfd -------------------------------------------------------------------------------
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
PORT=$(free_port)
NQN=nqn.2016-06.io.spdk:rbdbench
TRID="trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:$PORT subnqn:$NQN"
gateway_config() {
python3 - "$1" "$2" "$NQN" "$CONF" <<'EOF'
import json, sys
path, port, nqn, conf = sys.argv[1:5]
bdev = [
    {"method": "bdev_rbd_register_cluster", "params": {"name": "bench", "config_file": conf}},
    {"method": "bdev_rbd_create", "params": {"name": "Rbd0", "pool_name": "rbd", "rbd_name": "bench",
                                             "block_size": 4096, "cluster_name": "bench"}},
]
nvmf = [
    {"method": "nvmf_create_transport", "params": {"trtype": "TCP"}},
    {"method": "nvmf_create_subsystem",
     "params": {"nqn": nqn, "serial_number": "NVMFDRBD0001", "model_number": "nvmfd rbd bench",
                "allow_any_host": True}},
    {"method": "nvmf_subsystem_add_ns", "params": {"nqn": nqn, "namespace": {"bdev_name": "Rbd0", "nsid": 1}}},
    {"method": "nvmf_subsystem_add_listener",
     "params": {"nqn": nqn, "listen_address": {"trtype": "TCP", "adrfam": "IPv4",
                                               "traddr": "127.0.0.1", "trsvcid": port}}},
]
json.dump({"subsystems": [{"subsystem": "bdev", "config": bdev},
                          {"subsystem": "nvmf", "config": nvmf}]}, open(path, "w"), indent=1)
EOF
}
# start_gateway BIN CONFIG LOG: the whole process on the gateway core (librbd's threads too,
# as fio's are), its RPC socket next to CONFIG, started in the background; waits until it
# listens.
start_gateway() {
  # shellcheck disable=SC2086
  taskset -c "$GW" "$1" -c "$2" -r "$2.sock" -m "$GW" $NVMFD_ARGS >"$3" 2>&1 &
  STARTED=$!
  for _ in $(seq 300); do
    grep -q "listening on" "$3" && break
    kill -0 "$STARTED" 2>/dev/null || { cat "$3" >&2; say "$1 exited during start-up"; exit 1; }
    sleep 0.1
  done
  grep -q "listening on" "$3" || { cat "$3" >&2; say "$1 did not start"; exit 1; }
}
gateway_config "$W/nvmf.json" "$PORT"
start_gateway "$NVMFD" "$W/nvmf.json" "$W/nvmfd.log"
NVMFD_PID=$STARTED
say "nvmfd pid $NVMFD_PID on core $GW, 127.0.0.1:$PORT; work dir $W"
SIDES="nvmfd fio-rbd"
if [ -n "$OLD_NVMFD" ]; then
  OLD_PORT=$(free_port)
  OLD_TRID="trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:$OLD_PORT subnqn:$NQN"
  gateway_config "$W/nvmf-old.json" "$OLD_PORT"
  start_gateway "$OLD_NVMFD" "$W/nvmf-old.json" "$W/nvmfd-old.log"
  OLD_PID=$STARTED
  say "nvmfd-old ($OLD_NVMFD) pid $OLD_PID on core $GW, 127.0.0.1:$OLD_PORT"
  SIDES="nvmfd-old nvmfd fio-rbd"
fi

ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
HZ=$(getconf CLK_TCK)
RES=$W/results.tsv
: >"$RES"

# nvmf perf against a gateway: SIDE CASE ROUND perf-args...
run_nvmfd() {
  local side=$1 case=$2 round=$3; shift 3
  local j=$W/$case-$side-$round.json c0 c1 pid=$NVMFD_PID trid=$TRID
  if [ "$side" = nvmfd-old ]; then pid=$OLD_PID trid=$OLD_TRID; fi
  c0=$(ticks "$pid")
  taskset -c "$CLI" "$NVMF" perf -r "$trid" --ns 1 --cores "$CLI" -t "$T" --json --no-progress $PERF_ARGS "$@" \
    >"$j" 2>"$j.err" || say "$side $case run $round failed: $(tail -2 "$j.err" | tr '\n' ' ')"
  c1=$(ticks "$pid")
  printf '%s\t%s\t%s\t%s\t%s\n' "$case" "$side" "$round" "$j" "$(python3 -c "print(($c1-$c0)/$HZ)")" >>"$RES"
}

# fio's rbd engine on the gateway core: CASE ROUND fio-args...
run_fio() {
  local case=$1 round=$2; shift 2
  local j=$W/$case-fio-$round.json
  CEPH_CONF=$FIO_CONF taskset -c "$GW" /usr/bin/time -f '%U %S' -o "$j.time" \
    fio --name="$case" --ioengine=rbd --clientname=admin --pool=rbd --rbdname=bench \
      --direct=1 --time_based --runtime="$T" --output-format=json "$@" >"$j" 2>"$j.err" ||
    say "fio $case run $round failed: $(tail -2 "$j.err" | tr '\n' ' ')"
  printf '%s\tfio-rbd\t%s\t%s\t%s\n' "$case" "$round" "$j" "$(awk 'END {print $1 + $2}' "$j.time")" >>"$RES"
}

declare -A PERF=([randrw]="-w randrw -M 75 -o 4096 -q 64" [randrd]="-w randread -o 4096 -q 128")
declare -A FIO=([randrw]="--rw=randrw --rwmixread=75 --bs=4k --iodepth=64"
                [randrd]="--rw=randread --bs=4k --iodepth=128")
uptime_start=$(uptime)
for case in randrw randrd; do
  for ((r = 1; r <= RUNS; r++)); do
    say "$case run $r/$RUNS"
    # rotate which goes first
    order=$SIDES
    for ((k = 1; k < r; k++)); do order="${order#* } ${order%% *}"; done
    for side in $order; do
      # shellcheck disable=SC2086
      case $side in
        fio-rbd) run_fio "$case" "$r" ${FIO[$case]} ;;
        *) run_nvmfd "$side" "$case" "$r" ${PERF[$case]} ;;
      esac
    done
  done
done

{
  echo "## nvmfd over RBD vs fio's rbd engine, $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo
  echo "- machine: $(nproc) CPUs, $(lscpu | sed -n 's/^Model name: *//p' | head -1), kernel $(uname -r); built from $BUILT"
  echo "- Ceph $(ceph --version | awk '{print $3}'), one node on 127.0.0.1, 1 OSD (bluestore on a file), pool size 1; cluster start-up $CLUSTER_S s; image 1 GiB, layering only, filled; rbd_cache off on both sides"
  if [ -n "$OLD_NVMFD" ]; then
    echo "- nvmfd-old: $OLD_NVMFD, same options, its own port; nvmfd: $NVMFD"
  fi
  echo "- gateway core $GW (\`taskset -c $GW nvmfd -m $GW $NVMFD_ARGS\`, or \`taskset -c $GW fio\`: librbd's threads on it too), client core $CLI (\`nvmf perf --cores $CLI\`); Ceph daemons unpinned"
  echo "- nvmfd: \`nvmf perf -r '$TRID' --ns 1 --cores $CLI -t $T --json $PERF_ARGS ARGS\` (randrw: \`${PERF[randrw]}\`; randrd: \`${PERF[randrd]}\`)"
  echo "- fio-rbd: \`CEPH_CONF=... taskset -c $GW fio --ioengine=rbd --clientname=admin --pool=rbd --rbdname=bench --direct=1 --time_based --runtime=$T ARGS\` (randrw: \`${FIO[randrw]}\`; randrd: \`${FIO[randrd]}\`)"
  echo "- $RUNS runs of $T s each, alternating; medians (min-max); uptime at start: \`$uptime_start\`, at end: \`$(uptime)\`"
  echo
  python3 - "$RES" <<'EOF'
import json, statistics, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
def metrics(path, cpu):
    try:
        j = json.load(open(path))
    except Exception:
        return None
    t = j["total"] if "total" in j else j["jobs"][0]
    r, w = t["read"], t["write"]
    ios = r["total_ios"] + w["total_ios"]
    n = r["lat_ns"]["N"] + w["lat_ns"]["N"]
    if not ios or not n:
        return None
    p999 = max(x["clat_ns"]["percentile"]["99.900000"] for x in (r, w) if x["clat_ns"]["N"])
    return {
        "iops": r["iops"] + w["iops"],
        "mean": (r["lat_ns"]["mean"] * r["lat_ns"]["N"] + w["lat_ns"]["mean"] * w["lat_ns"]["N"]) / n / 1000,
        "p999": p999 / 1000,
        "cpu": 1e6 * float(cpu) / ios,
        "errors": t.get("error", 0),
    }
res = {}
for case, who, rnd, path, cpu in rows:
    m = metrics(path, cpu)
    if m:
        res.setdefault((case, who), []).append(m)
def med(case, who, k):
    v = [m[k] for m in res.get((case, who), [])]
    return (statistics.median(v), min(v), max(v)) if v else None
def cell(x, nd=0):
    return "-" if x is None else f"{x[0]:,.{nd}f} ({x[1]:,.{nd}f}-{x[2]:,.{nd}f})"
names = {"randrw": "4 KiB randrw 75/25 QD64", "randrd": "4 KiB randread QD128"}
print("| workload | path | IOPS | mean µs | p99.9 µs (worse of r/w) | gateway CPU µs per I/O |")
print("|---|---|---:|---:|---:|---:|")
label = {"nvmfd": "nvmf perf → nvmfd → RBD", "nvmfd-old": "nvmf perf → nvmfd (earlier build) → RBD",
         "fio-rbd": "fio --ioengine=rbd"}
for case in ("randrw", "randrd"):
    for who in ("nvmfd-old", "nvmfd", "fio-rbd"):
        if (case, who) not in res:
            continue
        print(f"| {names[case]} | {label[who]} | "
              f"{cell(med(case, who, 'iops'))} | {cell(med(case, who, 'mean'), 1)} | "
              f"{cell(med(case, who, 'p999'))} | {cell(med(case, who, 'cpu'), 1)} |")
print()
for case in ("randrw", "randrd"):
    a, b = med(case, "nvmfd", "iops"), med(case, "fio-rbd", "iops")
    ca, cb = med(case, "nvmfd", "cpu"), med(case, "fio-rbd", "cpu")
    if a and b:
        extra = f"; gateway CPU per I/O {ca[0] / cb[0]:.2f}x fio's" if ca and cb and cb[0] else ""
        print(f"- {names[case]}: nvmfd / fio-rbd IOPS ratio {a[0] / b[0]:.2f}{extra}")
    o, co = med(case, "nvmfd-old", "iops"), med(case, "nvmfd-old", "cpu")
    if o and b:
        extra = f"; gateway CPU per I/O {co[0] / cb[0]:.2f}x fio's" if co and cb and cb[0] else ""
        print(f"- {names[case]}: nvmfd-old / fio-rbd IOPS ratio {o[0] / b[0]:.2f}{extra}")
errs = sum(m["errors"] for v in res.values() for m in v)
if errs:
    print(f"- I/O errors reported: {errs}")
EOF
} | tee "$W/report.md"
say "done; $([ "$KEEP" = 1 ] && echo "raw results in $W" || echo "use --out DIR to keep the raw results")"
