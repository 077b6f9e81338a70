# Interop scenario: NVMe reservations with nvme-cli's resv-* commands (host A, this guest)
# against a second host (host B: nvmf-host in the test process, answering checkpoints),
# through every action and all six types; Persist Through Power Loss across an nvmfd restart.
#
# env: PORT NQN        target port, subsystem with namespace 1 (a PTPL file configured)
#      HOSTNQN HOSTID  host A's identity
. /job/lib.sh
H=(--hostnqn="$HOSTNQN" --hostid="$HOSTID")
dmesg_mark

step "connect"
connect "$NQN" "${H[@]}" --reconnect-delay=1 --ctrl-loss-tmo=60
D=$(ns_dev "$NQN" 1) || fail "no block device for namespace 1"
ok "$CTRL, $D"

# resv-report --eds as one line of JSON without blanks, in $R
report() {
  QUIET_RUN=1 run nvme resv-report "$D" -n 1 --eds -o json
  R=$(tr -d ' \n\t' <<<"$LAST_OUT")
  echo "  report: $R"
}
has() { for w in "$@"; do grep -q -- "$w" <<<"$R" || fail "resv-report lacks $w: $R"; done; }
# a command that must fail with Reservation Conflict
conflict() {
  local out rc
  echo "+ $* (must conflict)"
  out=$("$@" 2>&1); rc=$?
  printf '%s\n' "$out" | sed 's/^/  | /'
  [ "$rc" != 0 ] || fail "'$*' succeeded under a reservation that forbids it"
  grep -qi "reservation.conflict\|RESERVATION_CONFLICT" <<<"$out" || fail "'$*' failed, but not with Reservation Conflict"
}
write_ok() { run dd if=/dev/urandom of="$D" bs=4096 count=1 seek="$1" oflag=direct conv=notrunc status=none; }
write_fails() {
  echo "+ dd write at block $1 (must fail)"
  if dd if=/dev/urandom of="$D" bs=4096 count=1 seek="$1" oflag=direct conv=notrunc status=none 2>/dev/null; then
    fail "a block-layer write succeeded under a reservation that forbids it"
  fi
}
read_ok() { run dd if="$D" of=/dev/null bs=4096 count=1 skip="$1" iflag=direct status=none; }

step "register (PTPL on)"
run nvme resv-register "$D" -n 1 -k 161 -r 0 -p 3
report; has '"regctl":1' '"ptpls":1' '"rkey":161'
ok "registered with key 161"

step "host B holds Write Exclusive"
checkpoint b-holds-we
report; has '"rtype":1' '"regctl":2'
read_ok 0
write_fails 2
conflict nvme write "$D" -n 1 -s 16 -c 0 -z 512 -d /dev/zero
conflict nvme resv-acquire "$D" -n 1 -c 161 -t 1 -a 0
ok "reads served, writes refused with Reservation Conflict"

step "preempt and abort host B"
run nvme resv-acquire "$D" -n 1 -c 161 -p 177 -t 2 -a 2
report; has '"rtype":2' '"regctl":1'
write_ok 2
checkpoint b-preempted
ok "A holds Exclusive Access, B unregistered and notified"

step "every type: acquire, check, release"
conflict nvme resv-release "$D" -n 1 -c 999 -t 2 -a 0
run nvme resv-release "$D" -n 1 -c 161 -t 2 -a 0
report; has '"rtype":0'
for t in 1 2 3 4 5 6; do
  run nvme resv-acquire "$D" -n 1 -c 161 -t "$t" -a 0
  report; has "\"rtype\":$t"
  write_ok 3
  if nvme resv-release "$D" -n 1 -c 161 -t $(( t % 6 + 1 )) -a 0 >/dev/null 2>&1; then
    fail "release with the wrong type $(( t % 6 + 1 )) of a type $t reservation succeeded"
  fi
  run nvme resv-release "$D" -n 1 -c 161 -t "$t" -a 0
  report; has '"rtype":0'
done
ok "types 1-6"

step "replace, unregister, clear"
conflict nvme resv-register "$D" -n 1 -c 999 -k 162 -r 2
run nvme resv-register "$D" -n 1 -c 161 -k 162 -r 2
report; has '"rkey":162'
run nvme resv-register "$D" -n 1 -c 162 -r 1
report; has '"regctl":0'
run nvme resv-register "$D" -n 1 -k 163 -r 0
run nvme resv-acquire "$D" -n 1 -c 163 -t 1 -a 0
run nvme resv-release "$D" -n 1 -c 163 -a 1
report; has '"regctl":0' '"rtype":0'
ok "replace, unregister and clear"

step "PTPL: a reservation held through an nvmfd restart"
run nvme resv-register "$D" -n 1 -k 170 -r 0 -p 3
run nvme resv-acquire "$D" -n 1 -c 170 -t 1 -a 0
checkpoint restart
# the controller reconnects (reconnect delay 1 s)
CTRL=$(ctrl_of "$NQN") || fail "controller did not come back after the restart"
report; has '"rtype":1' '"regctl":1' '"ptpls":1' '"rkey":170'
write_ok 4
checkpoint b-after-restart
run nvme resv-release "$D" -n 1 -c 170 -a 1
ok "held through the restart"

step "disconnect"
disconnect "$NQN"
ok "done"
