# Short kernel-host check of a running target (used by scripts/run.sh):
# discover, connect, nvme list, fio 4k randrw + 128k seq write/read with crc32c verify, disconnect.
#
# env: PORT NQN   FIO_MB (8)
. /job/lib.sh
FIO_MB=${FIO_MB:-8}
dmesg_mark

step "discover 10.0.2.2:$PORT"
run nvme discover -t tcp -a "$ADDR" -s "$PORT"
grep -q "subnqn: *$NQN\$" <<<"$LAST_OUT" || fail "discovery log does not list $NQN"
ok "discovery log lists $NQN"

step "connect"
connect "$NQN"
D=$(ns_dev "$NQN" 1) || fail "no block device for namespace 1"
QUIET_RUN=1 run nvme list
grep "^$D " <<<"$LAST_OUT" | sed 's/^/  | /'
ok "controller $CTRL, namespace $D ($(( $(cat "/sys/block/${D#/dev/}/size") / 2048 )) MiB)"

step "fio, ${FIO_MB} MiB per workload, crc32c verify"
fio_suite check "$D" "$FIO_MB"
ok "fio verified"

step "disconnect"
disconnect "$NQN"
dmesg_clean "during the check"
ok "disconnected"
echo "ALL STEPS PASSED"
