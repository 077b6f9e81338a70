#!/usr/bin/env bash
# scripts/benchmarks.sh — the one command that reproduces BENCHMARKS.md's "nvmf bench" section:
# builds nvmfd and nvmf (release), runs `nvmf bench run` on the spec in bench/ and writes the
# report (bench.json, bench.csv, bench.md, bench.html) to bench/report/, then puts bench.md into
# BENCHMARKS.md between its "nvmf bench: begin/end" markers.
#
#   scripts/benchmarks.sh [--out DIR] [--no-splice] [--spec FILE]
#   environment: NVMFD_SPDK_DIR  a built SPDK tree (build/bin/nvmf_tgt): with it the spec is
#                                bench/benchmarks.toml (nvmfd side by side with SPDK nvmf_tgt),
#                                without it bench/benchmarks-nvmfd.toml (nvmfd alone)
#
# For the run it sets the system's TCP congestion control to cubic (restored after: with BBR,
# loopback sends are paced by a timer and results depend on it more than on the targets) and,
# for SPDK as root, mounts hugetlbfs and reserves 2 MiB hugepages when none are free. Measure
# on a quiet machine (no build, guest or busy-polling process running): the report records the
# load and flags busy cores, but cannot undo them. About 6 minutes with SPDK, 3 without.
set -euo pipefail
cd "$(dirname "$0")/.."
out=bench/report
splice=1
spec=
while [ $# -gt 0 ]; do
    case "$1" in
    --out) out=$2; shift 2 ;;
    --no-splice) splice=0; shift ;;
    --spec) spec=$2; shift 2 ;;
    -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "benchmarks.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
if [ -z "$spec" ]; then
    if [ -n "${NVMFD_SPDK_DIR:-}" ] && [ -x "$NVMFD_SPDK_DIR/build/bin/nvmf_tgt" ]; then
        spec=bench/benchmarks.toml
    else
        echo "benchmarks.sh: NVMFD_SPDK_DIR unset or without build/bin/nvmf_tgt: nvmfd alone (bench/benchmarks-nvmfd.toml)" >&2
        spec=bench/benchmarks-nvmfd.toml
    fi
fi
cargo build --release -q -p nvmfd -p nvmf-host

if [ "$spec" = bench/benchmarks.toml ] && [ "$(id -u)" = 0 ]; then
    mountpoint -q /dev/hugepages || { mkdir -p /dev/hugepages; mount -t hugetlbfs nodev /dev/hugepages; }
    if [ "$(awk '/HugePages_Free/ {print $2}' /proc/meminfo)" -lt 1024 ]; then
        echo 1280 > /proc/sys/vm/nr_hugepages
    fi
fi
cc_file=/proc/sys/net/ipv4/tcp_congestion_control
old_cc=
if [ -w "$cc_file" ]; then
    old_cc=$(cat "$cc_file")
    echo cubic > "$cc_file" || old_cc=
    trap '[ -n "$old_cc" ] && echo "$old_cc" > "$cc_file"' EXIT
fi

rm -rf "$out"
target/release/nvmf bench run "$spec" --out "$out" --nvmfd target/release/nvmfd

if [ "$splice" = 1 ]; then
    python3 - "$out/bench.md" "$spec" <<'PY'
import sys
md, spec = open(sys.argv[1]).read(), sys.argv[2]
begin, end = "<!-- nvmf bench: begin -->", "<!-- nvmf bench: end -->"
text = open("BENCHMARKS.md").read()
if begin not in text or end not in text:
    sys.exit("BENCHMARKS.md has no nvmf bench markers")
# The generated report's headings move one level down under BENCHMARKS.md's section.
body = "\n".join(("#" + l) if l.startswith("#") else l for l in md.splitlines())
new = text[: text.index(begin) + len(begin)] + "\n\n" + body.strip() + "\n\n" + text[text.index(end):]
open("BENCHMARKS.md", "w").write(new)
print(f"BENCHMARKS.md: nvmf bench section replaced from {sys.argv[1]} (spec {spec})")
PY
fi
