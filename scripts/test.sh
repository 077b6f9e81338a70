#!/usr/bin/env bash
# scripts/test.sh - THE test command: unit + loopback + kernel-host interop tests.
#
# On a fresh Debian 12 machine (as root) it installs what it needs (only what is missing),
# prepares the QEMU testbed (testbed/nvmfd-testbed) and runs
#   NVMFD_INTEROP=1 cargo test --workspace -- --test-threads=N
# Exits non-zero on any failure.  Arguments replace `--workspace` as the package selection
# of `cargo test`, e.g. `scripts/test.sh -p nvmf-interop`.
#
# Then (whole-workspace runs only) a short real fuzz session of each cargo-fuzz target
# (scripts/fuzz-smoke.sh: installs nightly + cargo-fuzz when missing; fails on a crash).
# env: NVMFD_TEST_THREADS (default 1: the interop tests boot guests; 2 cores)
#      NVMFD_SKIP_INTEROP=1  run cargo test without the interop switch (quick local loop)
#      NVMFD_SKIP_LOOP=1     skip nvmf-core's loop-device test (it needs root; fails without)
#      NVMFD_FUZZ_SECONDS  seconds per fuzz target (default 30; 0 skips the fuzz sessions)
#      NVMFD_SPDK_DIR      SPDK tree with a build for crates/nvmfd/tests/spdk_host.rs (default
#                          /work/spdk/spdk; those tests print a skip line without one)
set -euo pipefail
cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.."
export PATH="$HOME/.cargo/bin:$PATH:/usr/sbin:/sbin"

t_start=$(date +%s)
note() { echo "test.sh: $*" >&2; }

# ---- host packages (Debian 12) ------------------------------------------------
# command -> package
declare -A NEED=(
  [qemu-system-x86_64]=qemu-system-x86 [busybox]=busybox-static [modprobe]=kmod [cpio]=cpio
  [xz]=xz-utils [nvme]=nvme-cli [fio]=fio [ip]=iproute2 [socat]=socat [timeout]=coreutils
  [flock]=util-linux [setsid]=util-linux [dpkg-deb]=dpkg [cc]=build-essential
  [python3]=python3
)
missing=()
for cmd in "${!NEED[@]}"; do
  command -v "$cmd" >/dev/null 2>&1 || missing+=("${NEED[$cmd]}")
done
# linking needs libc's headers and start files, which gcc only recommends
[ -e /usr/include/stdio.h ] || missing+=(build-essential)
# the guest needs the static busybox, not just any busybox
if [ -x /bin/busybox ] && ldd /bin/busybox >/dev/null 2>&1; then missing+=(busybox-static); fi
if [ ${#missing[@]} -gt 0 ]; then
  mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
  [ "$(id -u)" = 0 ] || { note "missing packages: ${missing[*]} (run as root, or apt-get install them)"; exit 1; }
  note "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}" ca-certificates
fi

# ---- Rust toolchain ------------------------------------------------------------
# (Debian 12's own rustc is too old for this workspace: rust-version 1.87)
if ! command -v cargo >/dev/null 2>&1; then
  note "cargo not found: install a Rust toolchain >= 1.87 (rustup) into ~/.cargo/bin"
  exit 1
fi
note "$(cargo --version), $(rustc --version)"

# ---- build, testbed ------------------------------------------------------------
cargo build --workspace
interop=1
[ "${NVMFD_SKIP_INTEROP:-0}" = 1 ] && interop=0
if [ "$interop" = 1 ]; then
  if [ "$(id -u)" = 0 ]; then testbed/nvmfd-testbed prepare --install-deps
  else testbed/nvmfd-testbed prepare; fi
  # the multipath teardown tests (crates/nvmf-interop/tests/multipath.rs) also run on
  # Debian's bookworm-backports 6.12 kernel (fetched through a private apt config)
  NVMFD_TESTBED_KERNEL=6.12 testbed/nvmfd-testbed prepare
fi

# ---- tests ---------------------------------------------------------------------
threads=${NVMFD_TEST_THREADS:-1}
whole=0
[ $# -gt 0 ] || { whole=1; set -- --workspace; }
rc=0
if [ "$interop" = 1 ]; then
  NVMFD_INTEROP=1 cargo test "$@" -- --test-threads="$threads" || rc=$?
else
  cargo test "$@" -- --test-threads="$threads" || rc=$?
fi

# ---- short fuzz sessions -------------------------------------------------------
fuzz_secs=${NVMFD_FUZZ_SECONDS:-30}
if [ "$whole" = 1 ] && [ "$fuzz_secs" != 0 ]; then
  t_fuzz=$(date +%s)
  scripts/fuzz-smoke.sh "$fuzz_secs" || rc=1
  note "fuzz sessions took $(( $(date +%s) - t_fuzz )) s"
fi
note "finished in $(( $(date +%s) - t_start )) s, exit status $rc"
exit "$rc"
