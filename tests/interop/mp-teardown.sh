# Interop scenario: subsystem teardown and re-creation cycles under fio crc32c verify (test
# 4b of issue 9).  At checkpoint teardown-N the host driver deletes the subsystem over
# JSON-RPC and re-creates it (subsystem, namespace with the same identifiers, listeners) on
# one gateway; the kernel host must ride it out through its other path or by reconnecting:
# fio ends with 0 errors and 0 verify failures, every path is live again after each cycle.
#
# env: PORTS (one or more host ports, one path each) NQN HOSTNQN HOSTID CYCLES (3),
#      CHECKPOINTS=1
PORT=${PORTS%% *}
. /job/lib.sh
. /job/mp-lib.sh
NPATHS=$(echo $PORTS | wc -w)

step "connect $NPATHS path(s) ($PORTS) to $NQN"
mp_connect
mp_wait_live "$NPATHS" || { mp_show; fail "not $NPATHS live paths"; }
mp_show
D=$(ns_dev "$NQN" 1) || fail "no multipath head device for namespace 1"
[ "$NPATHS" -gt 1 ] && mp_iopolicy round-robin
ok "$NPATHS live path(s), head device $D"

dmesg_mark
io_start "$D"
sleep 3
io_alive || { io_stop; fail "fio loop ended early"; }
for i in $(seq "${CYCLES:-3}"); do
  step "cycle $i: delete and re-create the subsystem under I/O"
  checkpoint "teardown-$i"
  mp_wait_live "$NPATHS" 60 || { mp_show; fail "cycle $i: not $NPATHS live paths within 60 s"; }
  [ -b "$D" ] || fail "cycle $i: $D is gone"
  sleep 2
  io_alive || { io_stop; fail "cycle $i: fio loop ended"; }
  ok "cycle $i: all paths live again, fio running"
done

step "stop fio; every run verified"
io_stop
info "kernel log of the cycles:"
dmesg | tail -n "+$((DMESG_MARK + 1))" | grep -iE 'nvme' | tail -n 30 | sed 's/^/  | /'
dmesg | tail -n "+$((DMESG_MARK + 1))" | grep -iE 'I/O error|critical|Buffer I/O' &&
  fail "the kernel reported I/O errors"

step "disconnect"
run nvme disconnect -n "$NQN"
wait_no_ctrl "$NQN" || fail "controllers of $NQN still present"
ok "disconnected"
echo "ALL STEPS PASSED"
