#!/usr/bin/env bash
# scripts/run.sh - THE run command: build nvmfd (release), start it, check it with the Linux
# kernel's NVMe/TCP host, keep serving.
#
#   scripts/run.sh [--check-only] [--no-check] [--no-bench] [-- NVMFD_ARGS...]
#
# 1. cargo build --release -p nvmfd (and the `nvmf` initiator CLI of nvmf-host)
# 2. start target/release/nvmfd (default: the embedded config - a 1 GiB RAM namespace,
#    subsystem nqn.2024-01.io.nvmfd:default, on 127.0.0.1:4420, discovery on the same port)
# 3. self-check: a QEMU guest (testbed/nvmfd-testbed) running Debian's kernel does
#    nvme discover + connect + fio 4k randrw and 128k seq write/read with crc32c verification
#    (tests/interop/selfcheck.sh), then disconnects; the result is printed.
#    Then a short benchmark with the user-space initiator on the host: `nvmf perf` 4k randread
#    QD32 and 128k sequential write QD16, 5 s each (--no-bench skips it).
# 4. keep nvmfd running in the foreground until Ctrl-C, or, with --check-only, stop it and
#    exit with the check's status.
#
# --no-check skips step 3.  NVMFD_ARGS (after --) are passed to nvmfd, e.g. `-- -c my.json`;
# the self-check then uses NVMFD_CHECK_NQN / NVMFD_CHECK_PORT (default: the embedded config's).
set -euo pipefail
cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.."
export PATH="$HOME/.cargo/bin:$PATH:/usr/sbin:/sbin"

check=1 check_only=0 bench=1
nvmfd_args=()
while [ $# -gt 0 ]; do
  case $1 in
    --check-only) check_only=1; shift ;;
    --no-check) check=0; shift ;;
    --no-bench) bench=0; shift ;;
    --) shift; nvmfd_args=("$@"); break ;;
    -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "run.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
NQN=${NVMFD_CHECK_NQN:-nqn.2024-01.io.nvmfd:default}
PORT=${NVMFD_CHECK_PORT:-4420}
say() { echo "run.sh: $*" >&2; }

# nvmfd links the system OpenSSL (TLS, crate nvmf-tls): headers and pkg-config to build
build_deps=()
command -v pkg-config >/dev/null 2>&1 || build_deps+=(pkg-config)
[ -e /usr/include/openssl/ssl.h ] || build_deps+=(libssl-dev)
if [ ${#build_deps[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    say "missing build packages: ${build_deps[*]} (run as root, or apt-get install them)"; exit 1
  fi
  say "installing: ${build_deps[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${build_deps[@]}"
fi

say "building nvmfd and nvmf (release)"
cargo build --release -p nvmfd
BIN=target/release/nvmfd
if [ "$bench" = 1 ] && ! cargo build --release -p nvmf-host --bin nvmf; then
  say "warning: could not build the nvmf initiator CLI; no benchmark"; bench=0
fi

if [ "$check" = 1 ]; then
  # the guest tools; quick when already prepared
  if [ "$(id -u)" = 0 ]; then testbed/nvmfd-testbed prepare --install-deps >/dev/null
  else testbed/nvmfd-testbed prepare >/dev/null; fi
fi

if (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; then
  say "something already listens on 127.0.0.1:$PORT; stop it first"
  exit 1
fi

LOG=$(mktemp "${TMPDIR:-/tmp}/nvmfd-run.XXXXXX.log")
# a private RPC socket unless the caller names one (SPDK or another nvmfd may own the default)
rpc_args=()
case " ${nvmfd_args[*]-} " in *" -r "*|*" --rpc-socket"*) ;; *) rpc_args=(-r "${LOG%.log}.sock") ;; esac
"$BIN" "${rpc_args[@]}" "${nvmfd_args[@]}" > >(tee -a "$LOG") 2>&1 &
NVMFD_PID=$!
stop_nvmfd() {
  trap - INT TERM EXIT
  if kill -0 "$NVMFD_PID" 2>/dev/null; then
    kill -TERM "$NVMFD_PID" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$NVMFD_PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$NVMFD_PID" 2>/dev/null || true
  fi
  wait "$NVMFD_PID" 2>/dev/null || true
}
trap 'stop_nvmfd; exit 130' INT TERM
trap 'stop_nvmfd' EXIT

for _ in $(seq 300); do
  grep -q "listening on .* (tcp)" "$LOG" && break
  kill -0 "$NVMFD_PID" 2>/dev/null || { say "nvmfd exited during start-up (log: $LOG)"; exit 1; }
  sleep 0.1
done
grep -q "listening on .* (tcp)" "$LOG" || { say "nvmfd did not report 'listening on' within 30 s (log: $LOG)"; exit 1; }
[ ${#rpc_args[@]} -eq 0 ] || say "RPC socket: ${rpc_args[1]}  (e.g. target/release/nvmf rpc -s ${rpc_args[1]} nvmf_get_subsystems)"

rc=0
if [ "$check" = 1 ]; then
  say "self-check: kernel NVMe/TCP host in a QEMU guest -> 127.0.0.1:$PORT ($NQN)"
  out=$(mktemp -d "${TMPDIR:-/tmp}/nvmfd-check.XXXXXX")
  testbed/nvmfd-testbed run --timeout 300 --out "$out" --host-port "$PORT" \
      --put tests/interop/lib.sh --env "PORT=$PORT" --env "NQN=$NQN" \
      tests/interop/selfcheck.sh > "$out/report" 2>&1 || rc=$?
  sed 's/^/  guest | /' "$out/report" >&2
  if [ "$rc" = 0 ]; then say "SELF-CHECK PASSED"; else say "SELF-CHECK FAILED (status $rc; job dir $out)"; fi
fi

if [ "$bench" = 1 ]; then
  TRID="trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:$PORT subnqn:$NQN"
  for w in "randread 4096 32" "write 131072 16"; do
    set -- $w
    say "benchmark: nvmf perf -w $1 -o $2 -q $3 -t 5"
    if ! target/release/nvmf perf -r "$TRID" -w "$1" -o "$2" -q "$3" -t 5 --no-progress 2>&1 | sed 's/^/  perf | /' >&2; then
      say "benchmark $1 failed"; [ "$rc" != 0 ] || rc=1
    fi
  done
fi

if [ "$check_only" = 1 ]; then
  exit "$rc"
fi
say "nvmfd (pid $NVMFD_PID) serves $NQN on 127.0.0.1:$PORT; log: $LOG; Ctrl-C stops it"
wait "$NVMFD_PID" || true
