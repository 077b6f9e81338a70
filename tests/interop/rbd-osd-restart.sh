# Interop scenario: the Ceph cluster's only OSD stops under light I/O and comes back. A fio
# crc32c verify loop runs on the RBD namespace; at checkpoint osd-stop the host stops the OSD
# (clean stop: the monitor marks it down at once) and I/O must stall (no completion) without
# an error; at osd-start the OSD starts again with its bluestore data and I/O must resume
# within 30 s. fio must end with 0 errors and 0 verify failures (no acknowledged write lost);
# the longest I/O (PAUSE_MS=) is the stall.
#
# env: PORTS (one port) NQN HOSTNQN HOSTID, STALL_S (seconds the outage is watched, 3)
PORT=${PORTS%% *}
. /job/lib.sh
. /job/mp-lib.sh
STALL_S=${STALL_S:-3}

ios() { mp_path_ios "$PORT"; }

dmesg_mark
step "connect $NQN"
mp_connect
mp_wait_live 1 || { mp_show; fail "no live controller"; }
D=$(ns_dev "$NQN" 1) || fail "no block device for namespace 1"
ok "namespace $D"

step "fio verify loop on $D"
IO_MB=${IO_MB:-4}
io_start "$D"
a0=$(ios); sleep 3; a1=$(ios)
io_alive || { io_stop; fail "fio loop ended early"; }
[ "$a1" -gt "$a0" ] || fail "no I/O completed ($a0 -> $a1)"
ok "$((a1 - a0)) I/Os in 3 s"

step "the OSD stops: I/O stalls, nothing fails"
checkpoint osd-stop
s0=$(ios); sleep "$STALL_S"; s1=$(ios)
io_alive || { io_stop; fail "the fio loop ended while the OSD was down (an I/O failed?)"; }
[ "$s1" = "$s0" ] || fail "$((s1 - s0)) I/Os completed in ${STALL_S} s with the cluster's only OSD down"
ok "no I/O completed in ${STALL_S} s, fio still running"

step "the OSD starts again: I/O resumes"
checkpoint osd-start
r0=$(ios); resumed=""
for i in $(seq 300); do
  [ "$(ios)" -gt "$r0" ] && { resumed=$i; break; }
  sleep 0.1
done
[ -n "$resumed" ] || fail "no I/O completed within 30 s of the OSD's return"
info "first completion $((resumed / 10)).$((resumed % 10)) s after the OSD was up"
sleep 3
io_alive || { io_stop; fail "fio loop ended early"; }
ok "I/O flows again"

step "stop fio; every run verified"
io_stop
dmesg_clean "around the OSD restart"

step "disconnect"
run nvme disconnect -n "$NQN"
wait_no_ctrl "$NQN" || fail "controllers of $NQN still present"
ok "disconnected"
echo "ALL STEPS PASSED"
