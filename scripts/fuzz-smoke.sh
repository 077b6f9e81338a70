#!/usr/bin/env bash
# scripts/fuzz-smoke.sh - a short real libFuzzer session of every cargo-fuzz target:
#   nvmf-wire `decode` (PDU decoder), nvmf-wire `rdma` (NVMe/RDMA connect private data and
#   keyed SGL parsers), nvmf-fuzz `connection` (whole NVMe/TCP connections
#   against an in-process target) and nvmf-fuzz `rdma` (NVMe/RDMA queues of an in-process
#   target, the harness playing host and device) and nvmf-fuzz `auth` (DH-HMAC-CHAP messages
#   through a queue whose host must authenticate), SECONDS each (default 30), starting from
#   the committed corpora.
# Fails on the first crash, failed invariant, timeout or OOM (the input is left in the
# target's fuzz/artifacts/ directory). Installs the nightly toolchain and cargo-fuzz when missing.
#
# usage: scripts/fuzz-smoke.sh [SECONDS]        env: NVMFD_FUZZ_JOBS (sessions at once; default 2,
#                                                   1 on a 1-core machine)
set -euo pipefail
cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.."
export PATH="$HOME/.cargo/bin:$PATH"
secs=${1:-30}
CARGO_FUZZ_VERSION=0.13.2
note() { echo "fuzz-smoke.sh: $*" >&2; }

if ! cargo +nightly --version >/dev/null 2>&1; then
  command -v rustup >/dev/null 2>&1 || { note "no nightly toolchain and no rustup to install one"; exit 1; }
  note "installing the nightly toolchain"
  rustup toolchain install nightly --profile minimal
fi
if [ "$(cargo fuzz --version 2>/dev/null)" != "cargo-fuzz $CARGO_FUZZ_VERSION" ]; then
  note "installing cargo-fuzz $CARGO_FUZZ_VERSION"
  cargo install cargo-fuzz --locked --version "$CARGO_FUZZ_VERSION"
fi

# Every target is built first (one build at a time: cargo uses every core), then the sessions
# run NVMFD_FUZZ_JOBS at a time (default: the number of cores, at most 2), each with its own
# log, printed whole when it ends: on a 2-core CI machine the five 30 s sessions take 90 s
# instead of 150 s, and each still fuzzes its full SECONDS.
jobs=${NVMFD_FUZZ_JOBS:-$(( $(nproc) < 2 ? 1 : 2 ))}
logs=$(mktemp -d /tmp/nvmfd-fuzz-smoke.XXXXXX)
trap 'rm -rf "$logs"' EXIT

# TARGETS: dir target max_len extra-corpus-dirs...
TARGETS=(
  "crates/nvmf-wire/fuzz decode 4096 seeds/decode"
  "crates/nvmf-wire/fuzz rdma 256 seeds/rdma"
  "crates/nvmf-fuzz/fuzz connection 4096 seeds/connection cmin/connection regressions/connection"
  "crates/nvmf-fuzz/fuzz rdma 2048 seeds/rdma cmin/rdma regressions/rdma"
  "crates/nvmf-fuzz/fuzz auth 1024"
)

build() {  # dir target
  local t0; t0=$(date +%s)
  ( cd "$1" && cargo +nightly fuzz build "$2" ) || { note "$2 ($1): build FAILED"; return 1; }
  note "$2 ($1): built in $(( $(date +%s) - t0 )) s"
}

session() {  # dir target max_len extra-corpus-dirs...
  local dir=$1 target=$2 max_len=$3; shift 3
  ( cd "$dir"
    mkdir -p "corpus/$target" "$@"
    cargo +nightly fuzz run "$target" "corpus/$target" "$@" -- \
      -max_total_time="$secs" -max_len="$max_len" -timeout=10 -rss_limit_mb=2048 \
      -print_final_stats=1 )
}

rc=0
for t in "${TARGETS[@]}"; do
  # shellcheck disable=SC2086
  build $t || rc=1
done
[ "$rc" = 0 ] || exit "$rc"
i=0
while [ "$i" -lt "${#TARGETS[@]}" ]; do
  pids=() names=()
  for t in "${TARGETS[@]:$i:$jobs}"; do
    read -r dir target _ <<< "$t"
    log="$logs/${dir//\//_}-$target.log"
    # shellcheck disable=SC2086
    { t0=$(date +%s); r=0; session $t > "$log" 2>&1 || r=$?
      echo "$r $(( $(date +%s) - t0 ))" > "$log.rc"; } &
    pids+=("$!") names+=("$dir $target $log")
  done
  wait "${pids[@]}" || true
  for n in "${names[@]}"; do
    read -r dir target log <<< "$n"
    cat "$log"
    read -r r took < "$log.rc" 2>/dev/null || { r=1 took=?; }
    if [ "$r" = 0 ]; then note "$target: ok ($took s)"
    else note "$target: FAILED (exit $r; see $dir/artifacts/$target/)"; rc=1; fi
  done
  i=$((i + jobs))
done
exit "$rc"
