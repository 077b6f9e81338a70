# Interop scenario: faults of an nvmfd gateway group (docs/GATEWAY-GROUPS.md) under the kernel
# host's native multipath and fio crc32c verify (issue 25, tests 2, 3 and 6).  Three members
# a b c, namespaces 1..3 (ANA group i on RBD image i, homed on member i).
#   1. a frozen (SIGSTOP) under fio: namespace 1 moves to a survivor; a resumed: whatever it
#      still held is refused by the OSDs (blocklisted), it exits (status 3); fio keeps
#      verifying (a stale write landing over newer data would be a verify failure).  a
#      restarted gets namespace 1 back.
#   2. b (in its own network namespace) cut from the Ceph cluster (its link to it goes down) but
#      reachable: its paths go inaccessible within its lease, I/O continues on the others,
#      a survivor takes namespace 2; healed, b exits as fenced; restarted, it gets it back.
#   3. this host takes Write Exclusive on namespace 3 through its multipath head; a second
#      host (nvmf-host in the test process) is refused by the owner and sees the others
#      inaccessible; c killed: the survivor that takes namespace 3 still refuses the second
#      host, and this host still holds the reservation.
#
# env: PORTS="PA PB PC" NQN HOSTNQN HOSTID, CHECKPOINTS=1
PORT=${PORTS%% *}
. /job/lib.sh
. /job/mp-lib.sh
read -r PA PB PC <<< "$PORTS"

since() { awk -v a="$1" -v b="$(uptime_s)" 'BEGIN { printf "%.2f", b - a }'; }

step "connect the three members ($PORTS)"
mp_connect
mp_wait_live 3 || { mp_show; fail "not 3 live paths"; }
D1=$(ns_dev "$NQN" 1) && D2=$(ns_dev "$NQN" 2) && D3=$(ns_dev "$NQN" 3) || fail "namespaces 1..3 not all there"
mp_wait_owner 1 "$PA" 20 && mp_wait_owner 2 "$PB" 20 && mp_wait_owner 3 "$PC" 20 || { mp_show_ana 3; fail "ANA states"; }
mp_show_ana 3
ok "3 live paths; namespace i optimized through member i only"

step "fio verify on the three namespaces"
io_start "$D1 $D2 $D3"
sleep 3
io_alive || { io_stop; fail "fio loop ended early"; }
ok "running"

step "1. member a frozen (SIGSTOP) with I/O in flight: namespace 1 moves"
t0=$(uptime_s)
checkpoint freeze-a
mp_wait_owner 1 "$PB $PC" 90 || { mp_show_ana 3; io_stop; fail "namespace 1 not optimized on a survivor within 90 s"; }
echo "FROZEN_TAKEOVER_S=$(since "$t0")"
mp_show_ana 3
sleep 3
io_alive || { io_stop; fail "fio loop ended while a was frozen"; }
ok "namespace 1 served by a survivor"

step "a resumed: fenced, it exits; fio still verifies"
checkpoint resume-a
sleep 4
io_alive || { io_stop; fail "fio loop ended after a resumed (a stale write?)"; }
checkpoint restart-a
mp_wait_live 3 90 || { mp_show; io_stop; fail "a's path not live again"; }
mp_wait_owner 1 "$PA" 60 || { mp_show_ana 3; io_stop; fail "namespace 1 not back on a"; }
ok "a restarted owns namespace 1 again"

step "2. member b cut from the cluster: it fences itself within its lease"
t0=$(uptime_s)
checkpoint cut-b
for i in $(seq 150); do [ "$(mp_ana_of "$PB" 2)" = optimized ] || break; sleep 0.1; done
[ "$(mp_ana_of "$PB" 2)" = optimized ] && { mp_show_ana 3; io_stop; fail "b's path still optimized 15 s after the cut"; }
echo "CUT_FENCED_S=$(since "$t0") ($(mp_ana_of "$PB" 2) through b)"
mp_wait_owner 2 "$PA $PC" 60 || { mp_show_ana 3; io_stop; fail "namespace 2 not taken over"; }
echo "CUT_TAKEOVER_S=$(since "$t0")"
mp_show_ana 3
sleep 3
io_alive || { io_stop; fail "fio loop ended while b was cut"; }
checkpoint heal-b
mp_wait_live 3 90 || { mp_show; io_stop; fail "b's path not live again"; }
mp_wait_owner 2 "$PB" 60 || { mp_show_ana 3; io_stop; fail "namespace 2 not back on b"; }
ok "b fenced itself, was taken over, healed, restarted, owns namespace 2 again"

step "stop fio; every run verified"
io_stop

step "3. Write Exclusive through the multipath head of namespace 3"
run nvme resv-register "$D3" -n 3 -k 161 -r 0
run nvme resv-acquire "$D3" -n 3 -c 161 -t 1 -a 0
checkpoint y-conflicts
run dd if=/dev/urandom of="$D3" bs=4096 count=1 seek=7 oflag=direct conv=notrunc status=none
ok "held; the second host is refused"

step "c killed: the reservation holds through the survivor"
checkpoint kill-c
mp_wait_owner 3 "$PA $PB" 60 || { mp_show_ana 3; fail "namespace 3 not taken over"; }
QUIET_RUN=1 run nvme resv-report "$D3" -n 3 --eds -o json
R=$(tr -d ' \n\t' <<<"$LAST_OUT"); echo "  report: $R"
grep -q '"rtype":1' <<<"$R" || fail "no Write Exclusive after the takeover: $R"
run dd if=/dev/urandom of="$D3" bs=4096 count=1 seek=8 oflag=direct conv=notrunc status=none
checkpoint y-conflicts
run nvme resv-release "$D3" -n 3 -c 161 -t 1 -a 0
checkpoint y-writes
ok "Write Exclusive held through the survivor, released"

step "disconnect"
run nvme disconnect -n "$NQN"
wait_no_ctrl "$NQN" || fail "controllers of $NQN still present"
ok "disconnected"
echo "ALL STEPS PASSED"
