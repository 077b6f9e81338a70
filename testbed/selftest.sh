#!/usr/bin/env bash
# testbed/selftest.sh - checks the testbed and the interop guest scenarios against a known-good
# target: the Linux kernel's own NVMe target (nvmet) in a second guest.
#
#   testbed/selftest.sh [tcp] [PORT]   (default port 14420; FIO_MB=8 by default)
#   testbed/selftest.sh rdma [PORT]    soft-RoCE; PORT is the guests' link port (default 14421)
#
# tcp: runs tests/interop/{identify,fio-verify,keepalive}.sh in an initiator guest against a
# `target-start` guest (two RAM namespaces, allow list = the fixed test host NQN).
# rdma: two guests on a socket link with rxe0 on both ends; tests/interop/rdma-kernel.sh in the
# host guest (rxe0 + libibverbs, rping, a --put-bin program, nvme discover/connect -t rdma, fio
# crc32c verify) against `target-start --transport rdma`.
# Two guests run at once here; nothing else should be booting guests meanwhile.
set -uo pipefail
cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.."
TB=testbed/nvmfd-testbed
MODE=tcp
case ${1:-} in tcp|rdma) MODE=$1; shift ;; esac
PORT=${1:-14420}
[ "$MODE" = rdma ] && PORT=${1:-14421}
NQN=nqn.2024-01.io.nvmfd:selftest
HOSTID=6f1b1f3c-0c52-4c6e-9d1e-6e7666d00001
OTHERID=6f1b1f3c-0c52-4c6e-9d1e-6e7666d0dead
STATE=$(mktemp -d "${TMPDIR:-/tmp}/nvmfd-selftest.XXXXXX")
trap '"$TB" target-stop --state "$STATE/target" >/dev/null 2>&1; rm -rf "$STATE"' EXIT
trap 'exit 130' INT TERM

t() { date +%s.%N; }
dt() { awk -v a="$1" -v b="$(t)" 'BEGIN { printf "%.1f", b - a }'; }
results=() failed=0

T0=$(t)
"$TB" prepare >/dev/null || exit 1
results+=("prepare: $(dt "$T0") s")

if [ "$MODE" = rdma ]; then
  t1=$(t)
  "$TB" target-start --transport rdma --state "$STATE/target" --lifetime 900 --nqn "$NQN" --size 32 \
    --link "listen=127.0.0.1:$PORT" --link-ip 10.77.0.1/24 || exit 1
  results+=("target-start --transport rdma: $(dt "$t1") s")
  t2=$(t)
  # pgrep: its libproc2 is not in the guest image, so --put-bin must bring it
  "$TB" run --timeout 300 --link "connect=127.0.0.1:$PORT" --link-ip 10.77.0.2/24 --rxe \
    --put tests/interop/lib.sh --put-bin "$(command -v pgrep)" --env PUT_BIN=pgrep \
    --env PORT=4420 --env TARGET_IP=10.77.0.1 --env "NQN=$NQN" --env "FIO_MB=${FIO_MB:-8}" \
    --env "HOSTNQN=nqn.2014-08.org.nvmexpress:uuid:$HOSTID" --env "HOSTID=$HOSTID" \
    tests/interop/rdma-kernel.sh > "$STATE/rdma.log" 2>&1; rc=$?
  grep -E '^(== STEP|ok:|FAIL:|info:)' "$STATE/rdma.log" | sed 's/^/    /'
  if [ "$rc" = 0 ]; then results+=("rdma-kernel.sh: ok, $(dt "$t2") s")
  else results+=("rdma-kernel.sh: FAILED (status $rc), $(dt "$t2") s"); failed=1; sed 's/^/    /' "$STATE/rdma.log"; fi
  echo "---- soft-RoCE selftest against the kernel target (total $(dt "$T0") s)"
  printf '  %s\n' "${results[@]}"
  exit "$failed"
fi

t1=$(t)
"$TB" target-start --port "$PORT" --state "$STATE/target" --lifetime 900 --nqn "$NQN" \
  --namespaces 2 --size 32 --serial SELFTEST01 --model "nvmfd selftest" \
  --allow-host "nqn.2014-08.org.nvmexpress:uuid:$HOSTID" || exit 1
results+=("target-start: $(dt "$t1") s")

common=(--timeout 300 --host-port "$PORT" --put tests/interop/lib.sh --env "PORT=$PORT" --env "NQN=$NQN"
        --env "HOSTNQN=nqn.2014-08.org.nvmexpress:uuid:$HOSTID" --env "HOSTID=$HOSTID")
scenario() {  # script extra-args...
  local s=$1 t2 rc; shift
  t2=$(t)
  "$TB" run "${common[@]}" "$@" "tests/interop/$s" > "$STATE/$s.log" 2>&1; rc=$?
  if [ "$rc" = 0 ]; then results+=("$s: ok, $(dt "$t2") s")
  else results+=("$s: FAILED (status $rc), $(dt "$t2") s"); failed=1; sed 's/^/    /' "$STATE/$s.log"; fi
}
scenario identify.sh --env SERIAL=SELFTEST01 --env "MODEL=nvmfd selftest" --env NS1_BLOCKS=65536 \
  --env NS2_BLOCKS=65536 --env BLOCK_SIZE=512 --env "ACL_NQN=$NQN" \
  --env "OTHER_HOSTNQN=nqn.2014-08.org.nvmexpress:uuid:$OTHERID" --env "OTHER_HOSTID=$OTHERID"
scenario fio-verify.sh --env "FIO_MB=${FIO_MB:-8}"
scenario keepalive.sh

echo "---- selftest against the kernel target (total $(dt "$T0") s)"
printf '  %s\n' "${results[@]}"
exit "$failed"
