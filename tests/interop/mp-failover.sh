# Interop scenario: one path of a two-path multipath subsystem fails under fio crc32c verify
# and comes back (tests 3 and 4 of issue 9).  The host driver makes the path fail at the
# checkpoint fail-path (kill -9 of one gateway, or a forwarder cut) and restores it at
# restore-path (gateway restarted, forwarder restored).  fio must end with 0 errors and 0
# verify failures; the returning path must go live again and carry I/O again.
#
# env: PORTS="P_SURVIVOR P_FAILING" NQN HOSTNQN HOSTID, CHECKPOINTS=1
PORT=${PORTS%% *}
. /job/lib.sh
. /job/mp-lib.sh
read -r P_OK P_FAIL <<< "$PORTS"

step "connect both paths ($PORTS) to $NQN"
mp_connect
mp_wait_live 2 || { mp_show; fail "not 2 live paths"; }
mp_show
D=$(ns_dev "$NQN" 1) || fail "no multipath head device for namespace 1"
mp_iopolicy round-robin
ok "2 live paths, head device $D"

step "fio verify loop on $D; both paths carry I/O"
io_start "$D"
a0=$(mp_path_ios "$P_OK"); b0=$(mp_path_ios "$P_FAIL")
sleep 4
a1=$(mp_path_ios "$P_OK"); b1=$(mp_path_ios "$P_FAIL")
io_alive || { io_stop; fail "fio loop ended early"; }
[ "$a1" -gt "$a0" ] && [ "$b1" -gt "$b0" ] || fail "round-robin: I/Os on $P_OK $a0->$a1, on $P_FAIL $b0->$b1"
ok "I/Os on $P_OK: $((a1 - a0)), on $P_FAIL: $((b1 - b0))"

step "path $P_FAIL fails under I/O"
checkpoint fail-path "$P_FAIL"
sleep 6
io_alive || { io_stop; fail "fio loop ended while a path was down"; }
mp_show
c1=$(mp_path_ios "$P_OK"); sleep 2; c2=$(mp_path_ios "$P_OK")
[ "$c2" -gt "$c1" ] || fail "no I/O on the surviving path $P_OK ($c1 -> $c2)"
ok "I/O continues on $P_OK"

step "path $P_FAIL comes back and carries I/O again"
checkpoint restore-path "$P_FAIL"
mp_wait_live 2 40 || { mp_show; fail "path $P_FAIL not live again within 40 s"; }
mp_show
b2=$(mp_path_ios "$P_FAIL"); sleep 4; b3=$(mp_path_ios "$P_FAIL")
io_alive || { io_stop; fail "fio loop ended early"; }
[ "$b3" -gt "$b2" ] || fail "no I/O on the returned path $P_FAIL ($b2 -> $b3)"
ok "I/Os on $P_FAIL after its return: $((b3 - b2))"

step "stop fio; every run verified"
io_stop

step "disconnect"
run nvme disconnect -n "$NQN"
wait_no_ctrl "$NQN" || fail "controllers of $NQN still present"
ok "disconnected"
echo "ALL STEPS PASSED"
