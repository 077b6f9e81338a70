# Interop scenario: ANA multipath with the Linux host's native NVMe multipath.
# One nvmfd, one subsystem with ANA reporting, two listeners (PORT, PORT2); the guest connects
# both paths with the same host NQN/ID.
#
# MODE=states   (test 1) the paths show the ANA states the target set (sysfs ana_state,
#               nvme list-subsys, nvme ana-log); the host driver makes path B optimized over
#               RPC: the kernel follows through the ANA Change event without reconnecting;
#               with iopolicy round-robin fio crc32c verify moves I/O over both paths (the
#               guest's per-path block counters and the target's per-listener counters).
# MODE=failover (test 2) fio crc32c verify through the multipath device while the host driver
#               makes path A inaccessible, removes its listener, then adds it back: fio ends
#               with 0 errors, the kernel uses path A again once it is back; the longest pause
#               between two I/O completions is reported as "pause_ms".
#
# env: PORT PORT2 NQN HOSTNQN HOSTID MODE, CHECKPOINTS=1
. /job/lib.sh
PORT2=${PORT2:?PORT2 not set}
MODE=${MODE:?MODE not set}
H=(--hostnqn="$HOSTNQN" --hostid="$HOSTID")

# controller (nvmeX) of subsystem $NQN reached through port $1, any state
path_ctrl() {
  local c
  for c in /sys/class/nvme/nvme*; do
    [ "$(cat "$c/subsysnqn" 2>/dev/null)" = "$NQN" ] || continue
    case ",$(cat "$c/address" 2>/dev/null)," in *",trsvcid=$1,"*) echo "${c##*/}"; return 0 ;; esac
  done
  return 1
}
# hidden per-path disk (nvmeScCnN) of namespace 1 under controller $1
# (the host scans namespaces after the controller turns live: wait up to 10 s for the disk)
path_disk() {
  local d i
  for i in $(seq 100); do
    for d in /sys/class/nvme/"$1"/nvme*c*n1; do [ -e "$d" ] && { echo "${d##*/}"; return 0; }; done
    sleep 0.1
  done
  return 1
}
ana_of() { cat "/sys/block/$1/ana_state" 2>/dev/null || echo none; }
# reads + writes completed on a per-path disk
ios_of() { awk '{ print $1 + $5 }' "/sys/block/$1/stat" 2>/dev/null || echo 0; }
# wait up to $3 s until path disk $1 shows ANA state $2
wait_ana() {
  local i
  for i in $(seq $(($3 * 10))); do [ "$(ana_of "$1")" = "$2" ] && return 0; sleep 0.1; done
  return 1
}
# wait up to $2 s until controller $1 is live
wait_live() {
  local i
  for i in $(seq $(($2 * 10))); do [ "$(cat "/sys/class/nvme/$1/state" 2>/dev/null)" = live ] && return 0; sleep 0.1; done
  return 1
}

dmesg_mark
step "connect both paths of $NQN (ports $PORT, $PORT2)"
run nvme connect -t tcp -a "$ADDR" -s "$PORT" -n "$NQN" "${H[@]}" --reconnect-delay=1 --ctrl-loss-tmo=120
run nvme connect -t tcp -a "$ADDR" -s "$PORT2" -n "$NQN" "${H[@]}" --reconnect-delay=1 --ctrl-loss-tmo=120
CA=$(path_ctrl "$PORT") && wait_live "$CA" 10 || fail "no live controller through port $PORT"
CB=$(path_ctrl "$PORT2") && wait_live "$CB" 10 || fail "no live controller through port $PORT2"
PA=$(path_disk "$CA") || fail "no path disk under $CA"
PB=$(path_disk "$CB") || fail "no path disk under $CB"
DEV=$(ns_dev "$NQN" 1) || fail "no multipath block device for namespace 1"
SUBSYS=$(for s in /sys/class/nvme-subsystem/*; do [ "$(cat "$s/subsysnqn")" = "$NQN" ] && basename "$s"; done)
[ -n "$SUBSYS" ] || fail "no nvme-subsystem entry for $NQN"
CNT_A=$(cat "/sys/class/nvme/$CA/cntlid"); CNT_B=$(cat "/sys/class/nvme/$CB/cntlid")
[ "$CNT_A" != "$CNT_B" ] || fail "both paths got controller ID $CNT_A"
ok "path A $CA ($PA, cntlid $CNT_A), path B $CB ($PB, cntlid $CNT_B), multipath device $DEV, $SUBSYS"
run nvme list-subsys

if [ "$MODE" = states ]; then
  step "ANA states as the target set them: A optimized, B non-optimized"
  wait_ana "$PA" optimized 5 || fail "path A is $(ana_of "$PA"), expected optimized"
  wait_ana "$PB" non-optimized 5 || fail "path B is $(ana_of "$PB"), expected non-optimized"
  [ "$(cat "/sys/block/$PA/ana_grpid")" = 1 ] || fail "ANA group of namespace 1 is $(cat "/sys/block/$PA/ana_grpid"), expected 1"
  run nvme list-subsys "$DEV"
  echo "$LAST_OUT" | grep -qE "trsvcid=$PORT([^0-9]|\$).* live optimized" || fail "list-subsys does not show path A live optimized"
  echo "$LAST_OUT" | grep -qE "trsvcid=$PORT2([^0-9]|\$).* live non-optimized" || fail "list-subsys does not show path B live non-optimized"
  run nvme ana-log "/dev/$CB"
  echo "$LAST_OUT" | grep -iqE 'non.?optimized' || fail "nvme ana-log through B does not say non-optimized"
  run nvme ana-log "/dev/$CA"
  echo "$LAST_OUT" | grep -iqE '(^|[^-])optimized' || fail "nvme ana-log through A does not say optimized"
  ok "sysfs, list-subsys and ana-log agree"

  step "the target makes path B optimized: the kernel follows without reconnecting"
  checkpoint b-optimized "nvmf_subsystem_listener_set_ana_state -n optimized on port $PORT2"
  wait_ana "$PB" optimized 10 || fail "path B still $(ana_of "$PB") 10 s after the ANA change"
  [ "$(cat "/sys/class/nvme/$CB/cntlid")" = "$CNT_B" ] || fail "path B reconnected (cntlid changed)"
  ok "path B optimized by the ANA Change event, same controller"

  step "iopolicy round-robin spreads fio crc32c verify over both paths"
  echo round-robin > "/sys/class/nvme-subsystem/$SUBSYS/iopolicy" || fail "cannot set iopolicy"
  A0=$(ios_of "$PA"); B0=$(ios_of "$PB")
  checkpoint counters-before "per-listener counters before fio"
  fio_verify rr "$DEV" 8192 --rw=randwrite --bs=4k --iodepth=8 --size=8m
  A1=$(ios_of "$PA"); B1=$(ios_of "$PB")
  info "I/Os through A: $((A1 - A0)), through B: $((B1 - B0))"
  [ $((A1 - A0)) -gt 500 ] && [ $((B1 - B0)) -gt 500 ] || fail "round-robin did not use both paths"
  checkpoint counters-after "per-listener counters rose on both listeners"
  ok "both paths carried I/O (host view), target checked its own counters"
else
  step "fio crc32c verify over both paths while path A goes inaccessible, is removed, comes back"
  echo round-robin > "/sys/class/nvme-subsystem/$SUBSYS/iopolicy" || fail "cannot set iopolicy"
  rm -f /tmp/lat_*.log /tmp/fio-fo.out
  fio --name=failover --filename="$DEV" --direct=1 --ioengine=libaio --rw=randwrite --bs=4k \
      --iodepth=8 --size=16m --rate_iops=500 --verify=crc32c --do_verify=1 --verify_fatal=1 \
      --write_lat_log=/tmp/lat --log_avg_msec=0 --output-format=terse --terse-version=3 \
      --output=/tmp/fio-fo.out >/dev/null 2>&1 &
  FP=$!
  sleep 2
  A0=$(ios_of "$PA")
  [ "$A0" -gt 0 ] || fail "path A carried no I/O before the change"
  checkpoint a-inaccessible "path A inaccessible"
  wait_ana "$PA" inaccessible 10 || fail "path A is $(ana_of "$PA") 10 s after it went inaccessible"
  sleep 0.5; A1=$(ios_of "$PA"); B1=$(ios_of "$PB"); sleep 1.5
  [ "$(ios_of "$PA")" -le $((A1 + 1)) ] || fail "I/O still goes to the inaccessible path A"
  [ "$(ios_of "$PB")" -gt "$B1" ] || fail "no I/O on path B while A is inaccessible"
  info "A inaccessible: I/O only on B"
  checkpoint a-removed "listener of path A removed"
  sleep 2
  info "path A is $(cat "/sys/class/nvme/$CA/state") after the removal"
  checkpoint a-back "listener of path A added back (optimized)"
  wait_live "$CA" 20 || fail "path A not live 20 s after its listener came back"
  wait_ana "$PA" optimized 10 || fail "path A is $(ana_of "$PA") after it came back"
  A2=$(ios_of "$PA"); sleep 1.5
  kill -0 "$FP" 2>/dev/null || info "fio already finished"
  ok "path A live and optimized again"
  for i in $(seq 900); do kill -0 "$FP" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$FP" 2>/dev/null && { kill -9 "$FP"; fail "fio still running 90 s later (hang)"; }
  wait "$FP"; FRC=$?
  line=$(grep '^3;' /tmp/fio-fo.out | tail -n 1)
  grep -v '^3;' /tmp/fio-fo.out | sed 's/^/  | /'
  [ "$FRC" = 0 ] || fail "fio exited with status $FRC"
  err=$(echo "$line" | cut -d';' -f5); rkb=$(echo "$line" | cut -d';' -f6); wkb=$(echo "$line" | cut -d';' -f47)
  info "fio: error=$err read_kb=$rkb write_kb=$wkb"
  [ "$err" = 0 ] || fail "fio reported error $err"
  [ "$wkb" -ge 16384 ] && [ "$rkb" -ge "$wkb" ] || fail "fio did not write and verify all 16 MiB"
  # longest gap between two consecutive I/O completions (ms), from fio's per-I/O latency log
  PAUSE=$(cat /tmp/lat_lat.*.log 2>/dev/null | cut -d, -f1 | sort -n |
          awk 'NR > 1 && $1 - p > m { m = $1 - p } { p = $1 } END { print m + 0 }')
  echo "pause_ms=$PAUSE"
  ok "fio: 0 errors, 0 verify failures, longest I/O pause ${PAUSE} ms"

  step "the kernel uses path A again"
  A3=$(ios_of "$PA")
  if [ "$A3" -le "$A2" ]; then
    fio_verify again "$DEV" 2048 --rw=randwrite --bs=4k --iodepth=8 --size=2m
    A3=$(ios_of "$PA")
  fi
  [ "$A3" -gt "$A2" ] || fail "no I/O through path A after it came back"
  checkpoint survivor-counters "per-listener counters"
  ok "path A carried $((A3 - A2)) I/Os after its return"
fi

step "disconnect"
run nvme disconnect -n "$NQN"
wait_no_ctrl "$NQN" || fail "controllers of $NQN still present 10 s after nvme disconnect"
ok "disconnected"
checkpoint final "active_controllers=0 expected"
echo "ALL STEPS PASSED"
