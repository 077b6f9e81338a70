# Interop scenario over soft-RoCE: the kernel NVMe/RDMA host (nvme-rdma) in this guest against
# the kernel NVMe/RDMA target (nvmet-rdma) in another guest, across the testbed's qemu socket
# link (eth1, rxe0 on both ends). Also checks that user-space verbs and rdma_cm work here
# (ibv_devices, ibv_devinfo, rping over rxe0), which a user-space RDMA program needs.
#
# env: PORT (the target's port on the link, 4420)  TARGET_IP (its eth1 address)  NQN
#      HOSTNQN HOSTID  FIO_MB (MiB covered by the fio run, 8)
#      PUT_BIN (optional: a host program shipped with --put-bin; `/job/$PUT_BIN --help` must work)
. /job/lib.sh
FIO_MB=${FIO_MB:-8}
TARGET_IP=${TARGET_IP:?TARGET_IP not set}
MY_IP=${TESTBED_LINK_IP:?no --link-ip}
H=(--hostnqn="$HOSTNQN" --hostid="$HOSTID")

step "soft-RoCE device rxe0 on eth1 ($MY_IP)"
info "boot timings: $(tr '\n' ' ' < /job/timings)"
run rdma link show rxe0/1
grep -q 'state ACTIVE' <<<"$LAST_OUT" || fail "rxe0 port 1 is not ACTIVE"
run ibv_devices
grep -qw rxe0 <<<"$LAST_OUT" || fail "libibverbs does not list rxe0 (provider missing?)"
QUIET_RUN=1 run ibv_devinfo -d rxe0
grep -q 'PORT_ACTIVE' <<<"$LAST_OUT" || fail "ibv_devinfo: rxe0 port not PORT_ACTIVE"
ok "rxe0 ACTIVE, seen by libibverbs"

step "user-space rdma_cm + verbs: rping over rxe0 to $MY_IP"
rping -s -a "$MY_IP" -C 3 > /tmp/rping-server.log 2>&1 &
srv=$!
out=""
for i in $(seq 20); do   # the server needs a moment to listen
  out=$(timeout 15 rping -c -a "$MY_IP" -C 3 -v 2>&1) && break
  out=FAILED:$out; sleep 0.2
done
for i in $(seq 50); do kill -0 "$srv" 2>/dev/null || break; sleep 0.1; done
kill "$srv" 2>/dev/null
printf '%s\n' "$out" | sed 's/^/  | /'
[ "$(grep -c 'ping data: rdma-ping-' <<<"$out")" = 3 ] || fail "rping did not exchange 3 pings"
ok "rping: 3 pings over rdma_cm"

if [ -n "${PUT_BIN:-}" ]; then
  step "a host program shipped with --put-bin runs here"
  QUIET_RUN=1 run "/job/$PUT_BIN" --help
  ok "/job/$PUT_BIN --help"
fi

rdma_discover_connect
ok "controller $CTRL (rdma), namespace $D"

step "fio 4k randrw 75/25, ${FIO_MB} MiB, crc32c verify over rdma"
fio_verify rdma-randrw-4k "$D" 1 --rw=randrw --rwmixread=75 --bs=4k --iodepth=16 --size="${FIO_MB}m"
ok "fio verified"

rdma_disconnect
echo "ALL STEPS PASSED"
