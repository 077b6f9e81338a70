#!/usr/bin/env bash
# scripts/test.sh - THE test command: unit + loopback + kernel-host interop tests.
#
# On a fresh Debian 12 machine (as root) it installs what it needs (only what is missing),
# builds the fio engine (scripts/build-fio-engine.sh), prepares the QEMU testbed
# (testbed/nvmfd-testbed) and runs
#   NVMFD_INTEROP=1 cargo test --workspace -- --test-threads=N
# Exits non-zero on any failure.  Arguments replace `--workspace` as the package selection
# of `cargo test`, e.g. `scripts/test.sh -p nvmf-interop`.
#
# Then (whole-workspace runs as root) the Debian packages: built from the debug build and
# checked under a real systemd in a container and on a clean Debian 12 (scripts/package.sh,
# service-test.sh, package-test.sh). Then (whole-workspace runs only) a short real fuzz
# session of each cargo-fuzz target
# (scripts/fuzz-smoke.sh: installs nightly + cargo-fuzz when missing; fails on a crash).
# env: NVMFD_TEST_THREADS (default 1: the interop tests boot guests; 2 cores)
#      NVMFD_SKIP_INTEROP=1  run cargo test without the interop switch (quick local loop)
#      NVMFD_SKIP_LOOP=1     skip nvmf-core's loop-device test (it needs root; fails without)
#      NVMFD_SKIP_CEPH=1     neither install Ceph nor run the tests that need a Ceph cluster
#      NVMFD_FUZZ_SECONDS  seconds per fuzz target (default 30; 0 skips the fuzz sessions)
#      NVMFD_SKIP_PACKAGES=1 no package / systemd service tests (they need root and Debian's
#                          mirror: debootstrap, apt in a chroot)
#      NVMFD_SPDK_DIR      SPDK tree with a build for crates/nvmfd/tests/spdk_host.rs and
#                          crates/nvmf-host/tests/bench_spdk.rs (default /work/spdk/spdk); those
#                          tests are #[ignore]d: run them with `cargo test ... -- --ignored`
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
  [python3]=python3 [dpkg-source]=dpkg-dev [openssl]=openssl
  [rdma]=iproute2 [ibv_devices]=ibverbs-utils [rping]=rdmacm-utils
  [prometheus]=prometheus [promtool]=prometheus [udevadm]=udev
  [systemd-nspawn]=systemd-container [debootstrap]=debootstrap [lintian]=lintian
)
missing=()
for cmd in "${!NEED[@]}"; do
  command -v "$cmd" >/dev/null 2>&1 || missing+=("${NEED[$cmd]}")
done
# linking needs libc's headers and start files, which gcc only recommends
[ -e /usr/include/stdio.h ] || missing+=(build-essential)
# nvmf-tls links the system OpenSSL (openssl-sys): headers and pkg-config at build time
command -v pkg-config >/dev/null 2>&1 || missing+=(pkg-config)
[ -e /usr/include/openssl/ssl.h ] || missing+=(libssl-dev)
# soft-RoCE guests (issue 13): libibverbs' rxe provider (the utils above bring libibverbs1/librdmacm1)
compgen -G '/usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav*.so' >/dev/null || missing+=(ibverbs-providers)
# the guest needs the static busybox, not just any busybox
if [ -x /bin/busybox ] && ldd /bin/busybox >/dev/null 2>&1; then missing+=(busybox-static); fi
# Ceph (issue 10): the one-node test cluster (testbed/ceph-cluster) and the librbd/librados
# that nvmfd loads at run time for rbd bdevs
ceph_pkgs=()
if [ "${NVMFD_SKIP_CEPH:-0}" != 1 ]; then
  declare -A CEPH_NEED=([ceph-mon]=ceph-mon [ceph-mgr]=ceph-mgr [ceph-osd]=ceph-osd
    [rbd]=ceph-common [ceph-authtool]=ceph-common [monmaptool]=ceph-common [uuidgen]=uuid-runtime)
  for cmd in "${!CEPH_NEED[@]}"; do
    command -v "$cmd" >/dev/null 2>&1 || ceph_pkgs+=("${CEPH_NEED[$cmd]}")
  done
  libs=$(ldconfig -p 2>/dev/null || true)   # (grep -q on a pipe: SIGPIPE under pipefail)
  grep -q 'librbd\.so\.1 ' <<<"$libs" || ceph_pkgs+=(librbd1)
  grep -q 'librados\.so\.2 ' <<<"$libs" || ceph_pkgs+=(librados2)
  missing+=("${ceph_pkgs[@]}")
fi
if [ ${#missing[@]} -gt 0 ]; then
  mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
  [ "$(id -u)" = 0 ] || { note "missing packages: ${missing[*]} (run as root, or apt-get install them)"; exit 1; }
  note "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # no package's maintainer script may start a service here (Ceph's would): a policy-rc.d
  # that refuses every start, removed again unless the machine had one
  own_policy=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d; own_policy=1
  fi
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}" ca-certificates || inst_rc=$?
  [ "$own_policy" = 0 ] || rm -f /usr/sbin/policy-rc.d
  [ "${inst_rc:-0}" = 0 ] || exit "$inst_rc"
  # the monitoring test (crates/nvmfd/tests/monitoring.rs) runs a Prometheus of its own:
  # leave Debian's service disabled
  case " ${missing[*]} " in
    *" prometheus "*) systemctl disable prometheus.service >/dev/null 2>&1 || true ;;
  esac
  if [ ${#ceph_pkgs[@]} -gt 0 ]; then
    # Debian's ceph packages enable their systemd targets: the tests start their own
    # daemons, so leave none enabled (no /etc/ceph changes either)
    systemctl disable ceph.target ceph-mon.target ceph-mgr.target ceph-osd.target \
      ceph-crash.service >/dev/null 2>&1 || true
  fi
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
# the fio engine (crates/nvmf-fio) against the installed fio's Debian source, for its tests
scripts/build-fio-engine.sh
interop=1
[ "${NVMFD_SKIP_INTEROP:-0}" = 1 ] && interop=0
if [ "$interop" = 1 ]; then
  if [ "$(id -u)" = 0 ]; then testbed/nvmfd-testbed prepare --install-deps
  else testbed/nvmfd-testbed prepare; fi
  # the multipath teardown tests (crates/nvmf-interop/tests/multipath.rs) also run on
  # Debian's bookworm-backports 6.12 kernel (fetched through a private apt config)
  NVMFD_TESTBED_KERNEL=6.12 testbed/nvmfd-testbed prepare
  # the TLS tests (crates/nvmf-interop/tests/tls.rs, testbed/selftest-tls.sh) boot 6.12 with
  # Debian 13's nvme-cli/keyutils/tlshd (testbed/trixie-tls-userland, private apt config) and
  # the kTLS/AES-GCM modules; the module list is nvmf_interop::TLS_GUEST_MODULES (one image)
  NVMFD_TESTBED_TLS=1 NVMFD_TESTBED_KERNEL=6.12 \
    NVMFD_TESTBED_EXTRA_MODULES="tls nvmet-tcp gcm aesni-intel ghash-generic aes-generic chacha20poly1305 chacha-x86_64 poly1305-x86_64" \
    testbed/nvmfd-testbed prepare
fi

# ---- tests ---------------------------------------------------------------------
threads=${NVMFD_TEST_THREADS:-1}
whole=0
[ $# -gt 0 ] || { whole=1; set -- --workspace; }
rc=0
# --no-fail-fast: one failing test binary must not hide the others' results.  The output
# is also kept (bounded: the suite prints ~0.5 MB) so that the end of the run can name
# what failed: a CI log is often read from its tail only.
test_log=$(mktemp /tmp/nvmfd-test-log.XXXXXX)
trap 'rm -f "$test_log"' EXIT
set +e
if [ "$interop" = 1 ]; then
  NVMFD_INTEROP=1 cargo test --no-fail-fast "$@" -- --test-threads="$threads" 2>&1 | tee "$test_log"
else
  cargo test --no-fail-fast "$@" -- --test-threads="$threads" 2>&1 | tee "$test_log"
fi
rc=${PIPESTATUS[0]}
set -e

# ---- the Debian packages, and the service under a real systemd --------------------
# (whole-workspace runs as root with the interop switch, whose testbed the service test's
# kernel host uses): packages of the debug build (stripped) made with cargo-deb, the packaged
# unit booted with systemd-nspawn in a debootstrap'ed Debian 12 (scripts/service-test.sh),
# then lintian, install, upgrade and purge (scripts/package-test.sh); docs/OPERATIONS.md.
pkg_rc=0
if [ "$whole" = 1 ] && [ "$interop" = 1 ] && [ "$(id -u)" = 0 ] &&
   [ "${NVMFD_SKIP_PACKAGES:-0}" != 1 ]; then
  t_pkg=$(date +%s)
  { scripts/package.sh --profile dev &&
    scripts/service-test.sh --no-build --profile dev &&
    scripts/package-test.sh --no-build --profile dev; } || pkg_rc=$?
  [ "$pkg_rc" = 0 ] || rc=1
  note "package and service tests took $(( $(date +%s) - t_pkg )) s (status $pkg_rc)"
fi

# ---- short fuzz sessions -------------------------------------------------------
fuzz_secs=${NVMFD_FUZZ_SECONDS:-30}
if [ "$whole" = 1 ] && [ "$fuzz_secs" != 0 ]; then
  t_fuzz=$(date +%s)
  scripts/fuzz-smoke.sh "$fuzz_secs" || rc=1
  note "fuzz sessions took $(( $(date +%s) - t_fuzz )) s"
fi
# ---- what failed, again, at the end ------------------------------------------------
[ "$pkg_rc" = 0 ] || note "FAILED: the package or service tests (scripts/package-test.sh, scripts/service-test.sh; their output above)"
if [ "$rc" != 0 ] && grep -q "test result: FAILED\|^error" "$test_log"; then
  note "cargo test failed; the failing tests, each with the end of its output:"
  python3 - "$test_log" >&2 <<'PY' || true
import re, sys
text = open(sys.argv[1], errors="replace").read()
lines = text.splitlines()
# Each test binary's part of the log starts at cargo's "Running <src> (<binary>)".
parts = []  # (source, first line, last line)
for i, line in enumerate(lines):
    m = re.match(r"\s+Running (\S+) \((\S+)\)", line)
    if m:
        if parts:
            parts[-1][2] = i
        parts.append([m.group(1), i, len(lines)])
failed = []
for source, a, b in parts:
    names = []
    for j in range(a, b):
        # "test NAME ... FAILED", also when a child's output (a guest's console) came
        # between "test NAME ... " and "FAILED": then the name comes from libtest's
        # closing "failures:" list instead
        m = re.search(r"test (\S+) \.\.\. FAILED", lines[j])
        if m:
            names.append(m.group(1))
        if lines[j] == "failures:" and j + 1 < b and lines[j + 1].startswith("    "):
            k = j + 1
            while k < b and lines[k].startswith("    "):
                names.append(lines[k].strip())
                k += 1
    for n in dict.fromkeys(names):
        failed.append((source, n, a, b))
    # a binary that died (signal, abort) names no test: cargo's "Caused by" says how
    for j in range(a, b):
        if lines[j].startswith("error: test failed") and not names:
            failed.append((source, None, a, b))
            break
for source, name, a, b in failed:
    print(f"  FAILED {source} :: {name or '(the test binary itself: see below)'}")
for source, name, a, b in failed:
    part = "\n".join(lines[a:b])
    body = None
    if name:
        m = re.search(r"---- " + re.escape(name) + r" stdout ----\n(.*?)(?=\n---- |\nfailures:\n)", part, re.S)
        if m:
            body = m.group(1).rstrip().splitlines()
    if body is None:
        body = lines[a:b]
    print(f"---- {source} :: {name or '(binary)'} (last {min(len(body), 40)} of {len(body)} lines)")
    print("\n".join(body[-40:]))
for j, l in enumerate(lines):
    if re.match(r"error(\[E\d+\])?: ", l):
        print("  " + l)
        for k in range(j + 1, min(j + 4, len(lines) - 1)):
            if lines[k].startswith("Caused by"):
                print("    " + lines[k + 1].strip()[:300])
if not failed and not any(re.match(r"error(\[E\d+\])?: ", l) for l in lines):
    print("  (no failing test named: see the log above)")
PY
fi
note "finished in $(( $(date +%s) - t_start )) s, exit status $rc"
exit "$rc"
