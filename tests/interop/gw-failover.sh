# Interop scenario: an nvmfd gateway group (docs/GATEWAY-GROUPS.md) of three members on one
# Ceph cluster, one subsystem with namespaces 1..6 (ANA group i = namespace i, on RBD image
# i); member a is the home of groups 1 and 4, b of 2 and 5, c of 3 and 6.  The kernel host
# connects one path per member with native multipath and runs fio crc32c verify on the six
# namespaces throughout.  Each namespace must be optimized on its home's path only
# (inaccessible elsewhere); member a is killed with SIGKILL (checkpoint kill-a): after its
# lease, namespaces 1 and 4 become optimized on b's or c's path (the survivors fenced a
# first); a is restarted (checkpoint restart-a): both go back to a's path (planned
# failback).  Then namespace 7 is added over JSON-RPC on member b alone (checkpoint add-ns7):
# the host sees it through all three members (the group's shared configuration) and
# verifies I/O on it.  Then b and c are killed together (checkpoint kill-bc): a takes every
# group; then the Ceph monitor is killed and restarted (checkpoint restart-mon): nothing
# moves, nothing fails.  Then every member is restarted at once (checkpoint restart-all),
# and then the rolling upgrade (checkpoints upgrade-a, -b, -c): each member in turn stopped
# with SIGTERM (it hands its groups over), started again, its groups back.  fio must end
# with 0 errors and 0 verify failures, and no I/O of the rolling upgrade may take 5 s.
#
# env: PORTS="PA PB PC" NQN HOSTNQN HOSTID, CHECKPOINTS=1
PORT=${PORTS%% *}
. /job/lib.sh
. /job/mp-lib.sh
read -r PA PB PC <<< "$PORTS"

# I/Os completed on namespace $2 through the path of host port $1
ns_path_ios() {
  local a r
  _mp_ctrl "$1" && _mp_path "$MP_C" "$2" || { echo 0; return; }
  read -r a _ _ _ r _ < "$MP_B/stat"
  echo $((a + r))
}

# the port through which namespace $1 is optimized now
owner_port() {
  local p
  for p in $PORTS; do _mp_ana "$p" "$1"; [ "$MP_ANA" = optimized ] && { echo "$p"; return; }; done
  echo none
}

step "connect the three members ($PORTS) to $NQN"
mp_connect
mp_wait_live 3 || { mp_show; fail "not 3 live paths"; }
DEVS=""
for n in 1 2 3 4 5 6; do
  d=$(ns_dev "$NQN" "$n") || fail "namespace $n not there"
  DEVS="$DEVS $d"
done
ok "3 live paths; heads$DEVS"

step "each namespace optimized on its home only"
mp_wait_owner 1 "$PA" 10 && mp_wait_owner 2 "$PB" 10 && mp_wait_owner 3 "$PC" 10 &&
  mp_wait_owner 4 "$PA" 10 && mp_wait_owner 5 "$PB" 10 && mp_wait_owner 6 "$PC" 10 || { mp_show_ana 7; fail "ANA states"; }
mp_show_ana 7
ok "namespaces 1, 4 optimized through a, 2, 5 through b, 3, 6 through c; inaccessible elsewhere"

step "fio verify on the six namespaces; each flows through its owner"
io_start "${DEVS# }"
a0=$(ns_path_ios "$PA" 1); b0=$(ns_path_ios "$PB" 5); c0=$(ns_path_ios "$PC" 6)
sleep 4
a1=$(ns_path_ios "$PA" 1); b1=$(ns_path_ios "$PB" 5); c1=$(ns_path_ios "$PC" 6)
io_alive || { io_stop; fail "fio loop ended early"; }
[ "$a1" -gt "$a0" ] && [ "$b1" -gt "$b0" ] && [ "$c1" -gt "$c0" ] ||
  fail "I/O through the owners: a $a0->$a1, b $b0->$b1, c $c0->$c1"
ok "I/Os: namespace 1 via a $((a1 - a0)), 5 via b $((b1 - b0)), 6 via c $((c1 - c0))"

# The kill/failback cycle, GW_CYCLES times (1 in the suite; 20 for the distribution in
# BENCHMARKS.md).
CYCLES=${GW_CYCLES:-1}
for cyc in $(seq "$CYCLES"); do
  step "cycle $cyc/$CYCLES: member a killed (SIGKILL) under I/O: namespaces 1 and 4 move to the survivors"
  t0=$(uptime_s)
  checkpoint "kill-a.$cyc"
  mp_wait_owner 1 "$PB $PC" 40 && mp_wait_owner 4 "$PB $PC" 40 ||
    { mp_show_ana 7; io_stop; fail "namespaces 1 and 4 not optimized on a survivor within 40 s"; }
  echo "TAKEOVER_S[$cyc]=$(awk -v a="$t0" -v b="$(uptime_s)" 'BEGIN { printf "%.2f", b - a }')"
  mp_show_ana 7
  p1=$(owner_port 1)
  x0=$(ns_path_ios "$p1" 1); sleep 3; x1=$(ns_path_ios "$p1" 1)
  io_alive || { io_stop; fail "fio loop ended after the kill"; }
  [ "$x1" -gt "$x0" ] || fail "no I/O on namespace 1 through $p1 ($x0 -> $x1)"
  ok "namespace 1 flows through $p1 ($((x1 - x0)) I/Os in 3 s), namespace 4 through $(owner_port 4)"

  step "cycle $cyc/$CYCLES: member a restarted: namespaces 1 and 4 go back to a (failback)"
  t0=$(uptime_s)
  checkpoint "restart-a.$cyc"
  mp_wait_live 3 60 || { mp_show; io_stop; fail "a's path not live again within 60 s"; }
  mp_wait_owner 1 "$PA" 60 && mp_wait_owner 4 "$PA" 60 || { mp_show_ana 7; io_stop; fail "namespaces 1, 4 not back on a within 60 s"; }
  echo "FAILBACK_S[$cyc]=$(awk -v a="$t0" -v b="$(uptime_s)" 'BEGIN { printf "%.2f", b - a }')"
  mp_show_ana 7
  y0=$(ns_path_ios "$PA" 4); sleep 3; y1=$(ns_path_ios "$PA" 4)
  io_alive || { io_stop; fail "fio loop ended after the failback"; }
  [ "$y1" -gt "$y0" ] || fail "no I/O on namespace 4 through a after failback ($y0 -> $y1)"
  ok "namespace 4 flows through a again ($((y1 - y0)) I/Os in 3 s)"
done

step "namespace 7 added over JSON-RPC on member b only: served through all three members"
t0=$(uptime_s)
checkpoint add-ns7
for i in $(seq 200); do
  n=0
  for p in $PORTS; do _mp_ana "$p" 7; [ "$MP_ANA" = none ] || n=$((n + 1)); done
  [ "$n" = 3 ] && break
  sleep 0.1
done
[ "$n" = 3 ] || { mp_show_ana 7; ana7="$(for p in $PORTS; do printf '%s=%s ' "$p" "$(mp_ana_of "$p" 7)"; done)"; io_stop; fail "namespace 7 not on all three paths within 20 s: $ana7"; }
echo "NEWNS_S=$(awk -v a="$t0" -v b="$(uptime_s)" 'BEGIN { printf "%.2f", b - a }')"
mp_wait_owner 7 "$PORTS" 20 || { io_stop; fail "namespace 7 not optimized on exactly one member"; }
D7=$(ns_dev "$NQN" 7) || { io_stop; fail "no head device for namespace 7"; }
fio_verify newns "$D7" 1024 --rw=randrw --bs=4k --iodepth=8 --size=4m
ok "namespace 7 through all three members ($(for p in $PORTS; do printf '%s=%s ' "$p" "$(mp_ana_of "$p" 7)"; done)), verified"

step "members b and c killed together: a takes every group"
t0=$(uptime_s)
checkpoint kill-bc
for n in 1 2 3 4 5 6 7; do
  mp_wait_owner "$n" "$PA" 60 || { mp_show_ana 7; io_stop; fail "namespace $n not optimized on a within 60 s"; }
done
echo "TWO_KILLED_S=$(awk -v a="$t0" -v b="$(uptime_s)" 'BEGIN { printf "%.2f", b - a }')"
mp_show_ana 7
sleep 2
io_alive || { io_stop; fail "fio loop ended after b and c were killed"; }
ok "a serves all seven namespaces"

step "the Ceph monitor killed and restarted under I/O"
checkpoint restart-mon
sleep 5
io_alive || { io_stop; fail "fio loop ended across the monitor restart"; }
for n in 1 2 3 4 5 6 7; do
  mp_wait_owner "$n" "$PA" 5 || { mp_show_ana 7; io_stop; fail "namespace $n moved after the monitor restart"; }
done
ok "nothing moved"

step "every member restarted at once (their files do not have namespace 7)"
t0=$(uptime_s)
checkpoint restart-all
mp_wait_live 3 90 || { mp_show; io_stop; fail "not 3 live paths within 90 s of the restart"; }
mp_wait_owner 1 "$PA" 60 && mp_wait_owner 2 "$PB" 60 && mp_wait_owner 3 "$PC" 60 &&
  mp_wait_owner 4 "$PA" 60 && mp_wait_owner 5 "$PB" 60 && mp_wait_owner 6 "$PC" 60 &&
  mp_wait_owner 7 "$PORTS" 60 || { mp_show_ana 7; io_stop; fail "ANA groups not back on their homes"; }
echo "RESTART_ALL_S=$(awk -v a="$t0" -v b="$(uptime_s)" 'BEGIN { printf "%.2f", b - a }')"
mp_show_ana 7
for p in $PORTS; do
  [ "$(mp_ana_of "$p" 7)" = none ] && { mp_show_ana 7; io_stop; fail "namespace 7 not served through $p after the restart"; }
done
sleep 2
io_alive || { io_stop; fail "fio loop ended across the restart of every member"; }
fio_verify newns2 "$D7" 1024 --rw=randrw --bs=4k --iodepth=8 --size=4m
ok "all three back with the group's configuration: namespaces 1..6 on their homes, 7 on all paths (verified)"

step "stop fio; every run verified"
io_stop

# The rolling upgrade of docs/OPERATIONS.md: one member at a time is stopped the way
# `systemctl stop` does (SIGTERM: it makes its groups inaccessible, lets their writes drain
# and hands them to a survivor in the group record before it exits), started again (the
# new package; here the same build) and gets its home groups back by failback.  No I/O
# may fail and none may wait as long as a lease (5 s): nothing here waits for one.
step "rolling upgrade: each member in turn stopped (SIGTERM), started again, its groups back; fio verify on all seven throughout"
io_start "${DEVS# } $D7"
sleep 3
for m in a b c; do
  case $m in a) P=$PA; G="1 4" ;; b) P=$PB; G="2 5" ;; c) P=$PC; G="3 6" ;; esac
  t0=$(uptime_s)
  checkpoint "upgrade-$m"
  mp_wait_live 3 60 || { mp_show; io_stop; fail "$m's path not live again within 60 s"; }
  for g in $G; do
    mp_wait_owner "$g" "$P" 60 || { mp_show_ana 7; io_stop; fail "namespace $g not back on $m within 60 s"; }
  done
  echo "UPGRADE_S[$m]=$(awk -v a="$t0" -v b="$(uptime_s)" 'BEGIN { printf "%.2f", b - a }')"
  sleep 2
  io_alive || { io_stop; fail "fio loop ended during the upgrade of $m"; }
  ok "$m upgraded: its path live, namespaces $G back on it"
done
mp_show_ana 7
io_stop UPGRADE_
[ "$IO_WORST_MS" -lt 5000 ] || fail "an I/O waited $IO_WORST_MS ms during the rolling upgrade (not under the 5 s lease)"
ok "rolling upgrade of a, b and c: $IO_RUNS fio verify runs, 0 errors, longest I/O $IO_WORST_MS ms"

step "disconnect"
run nvme disconnect -n "$NQN"
wait_no_ctrl "$NQN" || fail "controllers of $NQN still present"
ok "disconnected"
echo "ALL STEPS PASSED"
