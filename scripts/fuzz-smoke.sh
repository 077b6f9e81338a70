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
# usage: scripts/fuzz-smoke.sh [SECONDS]        env: NVMFD_FUZZ_JOBS (default 1)
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

# dir target max_len extra-corpus-dirs...
run() {
  local dir=$1 target=$2 max_len=$3; shift 3
  local t0; t0=$(date +%s)
  ( cd "$dir"
    mkdir -p "corpus/$target" "$@"
    cargo +nightly fuzz build "$target"
    cargo +nightly fuzz run "$target" "corpus/$target" "$@" -- \
      -max_total_time="$secs" -max_len="$max_len" -timeout=10 -rss_limit_mb=2048 \
      -print_final_stats=1 ) || { note "$target: FAILED (see $dir/artifacts/$target/)"; return 1; }
  note "$target: ok ($(( $(date +%s) - t0 )) s including the build)"
}

rc=0
run crates/nvmf-wire/fuzz decode 4096 seeds/decode || rc=1
run crates/nvmf-wire/fuzz rdma 256 seeds/rdma || rc=1
run crates/nvmf-fuzz/fuzz connection 4096 seeds/connection cmin/connection regressions/connection || rc=1
run crates/nvmf-fuzz/fuzz rdma 2048 seeds/rdma cmin/rdma regressions/rdma || rc=1
run crates/nvmf-fuzz/fuzz auth 1024 || rc=1
exit "$rc"
