# Interop scenario over soft-RoCE: this workspace's user-space initiator (`/job/nvmf`, shipped
# with --put-bin) over NVMe/RDMA in this guest against the kernel NVMe/RDMA target (nvmet-rdma,
# one brd namespace) in another guest, across the testbed's qemu socket link (eth1, rxe0 on
# both ends). Every command is bounded by `timeout`.
#
# env: PORT (the target's port on the link, 4420)  TARGET_IP (its eth1 address)  NQN  HOSTNQN
#      SECONDS_EACH (seconds of each perf run, 3)
. /job/lib.sh
TARGET_IP=${TARGET_IP:?TARGET_IP not set}
SECS=${SECONDS_EACH:-3}
NVMF=/job/nvmf
TRID="trtype:RDMA adrfam:IPv4 traddr:$TARGET_IP trsvcid:$PORT subnqn:$NQN"

step "soft-RoCE device rxe0, seen by libibverbs"
run rdma link show rxe0/1
grep -q 'state ACTIVE' <<<"$LAST_OUT" || fail "rxe0 port 1 is not ACTIVE"
ok "rxe0 ACTIVE"

step "nvmf discover -t rdma -a $TARGET_IP -s $PORT"
# the first address resolution over a fresh link may need a retry (ARP); nvmf retries itself
run timeout 60 "$NVMF" discover -t rdma -a "$TARGET_IP" -s "$PORT" --hostnqn "$HOSTNQN"
grep -q "subnqn: *$NQN" <<<"$LAST_OUT" || fail "the discovery log does not list $NQN"
grep -q 'trtype: *rdma' <<<"$LAST_OUT" || fail "the discovery log entry is not trtype rdma"
ok "discovery log lists $NQN over rdma"

step "nvmf identify over rdma"
run timeout 60 "$NVMF" identify -r "$TRID" --hostnqn "$HOSTNQN"
# brd namespace of 32 MiB: 65536 blocks of 512 bytes (or 8192 of 4096)
grep -Eq 'namespace 1: (65536 blocks of 512|8192 blocks of 4096) bytes' <<<"$LAST_OUT" \
  || fail "identify does not show the 32 MiB namespace"
ok "namespace 1 is 32 MiB"

perf() {  # name, perf args...
  local name=$1 attempt out rc; shift
  # exit status 1 on any I/O error, lost I/O or mismatch. Up to two retries, said loudly, 5 s
  # apart, only when the whole link went silent: the kernel target dropped it (both queues
  # silent, then the connection closed by the target), seen once in a CI-like run under load
  # with nvmet-rdma on 6.1's soft-RoCE; or nothing crossed it at all, not even the admin
  # queue's Keep Alive (the host's keep-alive failed while I/Os never completed; the target,
  # nvmfd, logged the same silence from its side as a keep-alive timeout), seen once against
  # nvmfd in a fresh-clone run (issue 24); or, right after such a drop, the link still silent
  # for the next connect (no answer to the RDMA connect), seen once in a fresh-clone run
  # (2026-11-29). A wrong answer or a mismatch fails at once; a failure the third time fails.
  for attempt in 1 2 3; do
    echo "+ timeout $((SECS + 60)) $NVMF perf -r $TRID --hostnqn $HOSTNQN -t $SECS --verify $*"
    out=$(timeout $((SECS + 60)) "$NVMF" perf -r "$TRID" --hostnqn "$HOSTNQN" -t "$SECS" --verify "$@" 2>&1)
    rc=$?
    printf '%s\n' "$out" | sed 's/^/  | /'
    if [ "$rc" != 0 ] && [ "$attempt" != 3 ] &&
      ! grep -q 'mismatched - FAIL\|[1-9][0-9]* mismatched' <<<"$out"; then
      if grep -q 'connection closed by the target on every path' <<<"$out"; then
        echo "RETRY: $name: the kernel target closed the connection (soft-RoCE under load); once more in 5 s"
        sleep 5; continue
      fi
      if grep -q 'keep alive failed' <<<"$out" && grep -q 'never completed' <<<"$out"; then
        echo "RETRY: $name: the soft-RoCE link went silent (not even Keep Alive crossed it); once more in 5 s"
        sleep 5; continue
      fi
      if [ "$attempt" != 1 ] && grep -q 'no answer to the RDMA connect' <<<"$out"; then
        echo "RETRY: $name: the soft-RoCE link is still silent after the drop; once more in 5 s"
        sleep 5; continue
      fi
    fi
    break
  done
  [ "$rc" = 0 ] || fail "$name: nvmf perf exited with status $rc"
  LAST_OUT=$out
  grep -Eq 'verify: [1-9][0-9]* blocks checked, 0 mismatched - OK' <<<"$LAST_OUT" \
    || fail "$name: no clean verify line"
  grep -q '^ERROR' <<<"$LAST_OUT" && fail "$name: errors reported"
  return 0
}

step "nvmf perf --verify 4 KiB randrw 50/50, qd 16, ${SECS} s (writes in-capsule)"
perf randrw-4k -w randrw -M 50 -o 4096 -q 16
ok "4 KiB randrw verified"

step "nvmf perf --verify 128 KiB sequential writes and reads (keyed SGL), ${SECS} s"
perf rw-128k -w rw -M 50 -o 131072 -q 8
ok "128 KiB writes and reads verified"

step "an unknown subsystem NQN: a clear Connect error, no hang"
BAD="trtype:RDMA adrfam:IPv4 traddr:$TARGET_IP trsvcid:$PORT subnqn:nqn.2024-01.io.nvmfd:nope"
if out=$(timeout 40 "$NVMF" identify -r "$BAD" --hostnqn "$HOSTNQN" 2>&1); then
  fail "identify of an unknown subsystem succeeded: $out"
fi
rc=$?
printf '%s\n' "$out" | sed 's/^/  | /'
[ "$rc" != 124 ] || fail "identify of an unknown subsystem hung (killed by timeout)"
grep -qi 'connect' <<<"$out" || fail "the error does not name the Connect: $out"
ok "rejected: $(tail -1 <<<"$out")"
echo "ALL STEPS PASSED"
