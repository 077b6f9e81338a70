# Interop scenario: live namespace changes while the kernel host is connected.
# (a) the host driver adds namespace 2 over JSON-RPC: the kernel shows it (Namespace
#     Attribute Changed AEN + Changed Namespace List) without reconnecting; write + verify.
# (b) fio randrw runs on namespace 1 when the host driver removes it: fio ends (errors are
#     expected) within a bound, the kernel removes the block device, nvme list works, the
#     controller stays live; disconnect frees it.
#
# env: PORT NQN HOSTNQN HOSTID, CHECKPOINTS=1 (the host driver runs the RPCs at checkpoints)
. /job/lib.sh
H=(--hostnqn="$HOSTNQN" --hostid="$HOSTID")

dmesg_mark
step "connect $NQN"
connect "$NQN" "${H[@]}"
D1=$(ns_dev "$NQN" 1) || fail "no block device for namespace 1"
CNTLID=$(cat "/sys/class/nvme/$CTRL/cntlid")
ok "controller $CTRL cntlid $CNTLID, namespace 1 = $D1"

step "host adds namespace 2 over RPC; the kernel shows it without reconnecting"
checkpoint add-ns2 "nvmf_subsystem_add_ns -n 2"
D2=$(ns_dev "$NQN" 2) || D2=$(ns_dev "$NQN" 2) || fail "namespace 2 did not appear within 20 s"
[ "$(cat "/sys/class/nvme/$CTRL/cntlid")" = "$CNTLID" ] || fail "the controller changed (the host reconnected)"
[ "$(cat "/sys/class/nvme/$CTRL/state")" = live ] || fail "controller $CTRL not live"
ok "namespace 2 = $D2 on the same controller"

step "write and verify namespace 2"
fio_verify ns2 "$D2" 4096 --rw=randwrite --bs=4k --iodepth=8 --size=4m
ok "4 MiB random write + crc32c verify on $D2"

step "fio randrw on namespace 1; the host removes it meanwhile"
fio --name=rm-under-io --filename="$D1" --direct=1 --ioengine=libaio --rw=randrw --bs=4k \
    --iodepth=16 --size=32m --time_based --runtime=10 --output=/tmp/fio-rm.out >/dev/null 2>&1 &
FP=$!
sleep 3
kill -0 "$FP" 2>/dev/null || { cat /tmp/fio-rm.out; fail "fio ended before the removal"; }
checkpoint remove-ns1 "nvmf_subsystem_remove_ns 1 with fio running"
for i in $(seq 300); do kill -0 "$FP" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$FP" 2>/dev/null; then
  kill -9 "$FP"; fail "fio still running 30 s after the namespace was removed (hang)"
fi
wait "$FP"; FRC=$?
sed 's/^/  | /' /tmp/fio-rm.out | grep -iE 'err|io=|rm-under-io' | head -n 8
info "fio exit status $FRC (an error is expected)"
for i in $(seq 200); do [ -b "$D1" ] || break; sleep 0.1; done
[ -b "$D1" ] && fail "$D1 still present 20 s after the removal"
ok "fio ended (status $FRC), $D1 removed by the kernel"

step "controller still live, nvme list works, namespace 2 still works"
run nvme list
[ "$(cat "/sys/class/nvme/$CTRL/state")" = live ] || fail "controller $CTRL is $(cat "/sys/class/nvme/$CTRL/state")"
[ -b "$D2" ] || fail "$D2 went away too"
fio_verify ns2-after "$D2" 1024 --rw=randwrite --bs=4k --iodepth=8 --size=1m
checkpoint after-remove "daemon running, get_controllers shows the controller"
ok "still serving"

step "disconnect"
disconnect "$NQN"
ok "disconnected"
checkpoint final "active_controllers=0 expected"
echo "ALL STEPS PASSED"
