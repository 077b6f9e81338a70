# The target vanishes mid-I/O, seen from this workspace's initiator over soft-RoCE: `/job/nvmf
# perf` (shipped with --put-bin) runs 4 KiB randrw against the target guest; once its queue pairs
# are up and I/O flows this script writes /job/perf-running, and the test SIGKILLs the target
# guest's qemu (no disconnect, nothing more on the link) and then writes /job/killed. From then
# perf must exit within LIMIT_S seconds, with a non-zero status, an error that names the
# target's address, and no panic. perf runs with --timeout 5 (the I/O and admin command timeout)
# and --keep-alive-tmo 4: with I/Os in flight and no completion for 5 + 4 s it fails; LIMIT_S
# adds the margin a TCG guest needs.
#
# env: PORT  TARGET_IP (the target guest's link address)  NQN  HOSTNQN  LIMIT_S (20)
. /job/lib.sh
TARGET_IP=${TARGET_IP:?TARGET_IP not set}
LIMIT_S=${LIMIT_S:-20}
TRID="trtype:RDMA adrfam:IPv4 traddr:$TARGET_IP trsvcid:$PORT subnqn:$NQN"

step "rxe0 ACTIVE; the target answers (nvmf discover)"
run rdma link show rxe0/1
grep -q 'state ACTIVE' <<<"$LAST_OUT" || fail "rxe0 port 1 is not ACTIVE"
# the first address resolution over a fresh link may need a retry (ARP); nvmf retries itself
run timeout 60 /job/nvmf discover -t rdma -a "$TARGET_IP" -s "$PORT" --hostnqn "$HOSTNQN"
ok "target reachable"

step "nvmf perf 4 KiB randrw qd 16 against $TARGET_IP, running"
/job/nvmf perf -r "$TRID" --hostnqn "$HOSTNQN" -t 120 -w randrw -M 50 -o 4096 -q 16 \
  --timeout 5 --keep-alive-tmo 4 > /tmp/perf.out 2>&1 &
pid=$!
# the admin queue's and the I/O queue's QPs up (ready to send), then a moment of I/O
n=0
for _ in $(seq 300); do   # 30 s at most
  kill -0 "$pid" 2>/dev/null || { sed 's/^/  | /' /tmp/perf.out; fail "perf ended before the target was killed"; }
  n=$(rdma resource show qp 2>/dev/null | grep 'type RC' | grep -c 'state RTS')
  [ "$n" -ge 2 ] && break
  sleep 0.1
done
[ "$n" -ge 2 ] || fail "perf's queue pairs did not come up within 30 s ($n in RTS)"
sleep 2
kill -0 "$pid" 2>/dev/null || { sed 's/^/  | /' /tmp/perf.out; fail "perf ended before the target was killed"; }
touch /job/perf-running
ok "perf running ($n queue pairs ready to send)"

step "the target guest is killed: perf must fail within ${LIMIT_S} s"
for _ in $(seq 1800); do  # 180 s at most
  [ -e /job/killed ] && break
  kill -0 "$pid" 2>/dev/null || { sed 's/^/  | /' /tmp/perf.out; fail "perf ended before the target was killed"; }
  sleep 0.1
done
[ -e /job/killed ] || fail "the test never said the target was killed"
t0=$(uptime_s)
for _ in $(seq $((LIMIT_S * 10))); do
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.1
done
if kill -0 "$pid" 2>/dev/null; then
  kill -KILL "$pid"
  sed 's/^/  | /' /tmp/perf.out
  fail "perf still running ${LIMIT_S} s after the target vanished (hang)"
fi
wait "$pid"; rc=$?
took=$(awk -v a="$t0" -v b="$(uptime_s)" 'BEGIN { printf "%.1f", b - a }')
sed 's/^/  | /' /tmp/perf.out
[ "$rc" != 0 ] || fail "perf exited 0 although its target vanished"
[ "$rc" -lt 128 ] || fail "perf died of a signal (status $rc)"
grep -q 'panicked' /tmp/perf.out && fail "perf panicked"
grep -q "$TARGET_IP" /tmp/perf.out || fail "perf's error does not name the target $TARGET_IP"
echo "perf failed ${took} s after the kill was seen (status $rc)"
ok "perf failed cleanly (status $rc, ${took} s)"
echo "ALL STEPS PASSED"
