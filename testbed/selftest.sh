#!/usr/bin/env bash
# testbed/selftest.sh - checks the testbed and the interop guest scenarios against a known-good
# target: the Linux kernel's own NVMe/TCP target (nvmet) in a second guest.
#
#   testbed/selftest.sh [PORT]     (default port 14420; FIO_MB=8 by default)
#
# Runs tests/interop/{identify,fio-verify,keepalive}.sh in an initiator guest against a
# `target-start` guest (two RAM namespaces, allow list = the fixed test host NQN).
# Two guests run at once here; nothing else should be booting guests meanwhile.
set -uo pipefail
cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.."
TB=testbed/nvmfd-testbed
PORT=${1:-14420}
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
