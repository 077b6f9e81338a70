# Interop scenario: an idle connection outlives the keep-alive timeout, disconnect frees the
# controller, and a new connection reads back the data written before.
#
# env: PORT NQN HOSTNQN HOSTID
#      IDLE_S   idle time with --keep-alive-tmo=5 (12)
#      CHECKPOINTS=1 when a host driver answers /job/cp-*.req (nvmfd log checks)
. /job/lib.sh
IDLE_S=${IDLE_S:-12}
H=(--hostnqn="$HOSTNQN" --hostid="$HOSTID")
PAT_MB=4           # pattern written before the disconnect, at offset 0
PAT_BS=65536

dmesg_mark
step "connect $NQN with --keep-alive-tmo=5"
connect "$NQN" "${H[@]}" --keep-alive-tmo=5
D=$(ns_dev "$NQN" 1) || fail "no block device for namespace 1"
CNTLID=$(cat "/sys/class/nvme/$CTRL/cntlid")
WWID=$(cat "/sys/block/${D#/dev/}/wwid")
ok "controller $CTRL cntlid $CNTLID, namespace $D, wwid $WWID"

step "write a ${PAT_MB} MiB random pattern"
run dd if=/dev/urandom of=/tmp/pattern bs=$PAT_BS count=$((PAT_MB * 1048576 / PAT_BS))
run dd if=/tmp/pattern of="$D" bs=$PAT_BS oflag=direct conv=fsync
SUM=$(sha256sum < /tmp/pattern | cut -d' ' -f1)
GOT=$(dd if="$D" bs=$PAT_BS count=$((PAT_MB * 1048576 / PAT_BS)) iflag=direct 2>/dev/null | sha256sum | cut -d' ' -f1)
[ "$GOT" = "$SUM" ] || fail "read-back right after the write differs: $GOT != $SUM"
ok "pattern sha256 $SUM"

step "idle ${IDLE_S} s (keep-alive timeout 5 s)"
checkpoint idle-start
sleep "$IDLE_S"
checkpoint idle-end "no controller created or destroyed while idle"
[ -e "/sys/class/nvme/$CTRL" ] || fail "controller $CTRL disappeared while idle"
st=$(cat "/sys/class/nvme/$CTRL/state")
[ "$st" = live ] || fail "controller $CTRL is '$st' after the idle period"
[ "$(cat "/sys/class/nvme/$CTRL/cntlid")" = "$CNTLID" ] || fail "cntlid changed while idle (the host reconnected)"
dmesg_clean "during the idle period"
ok "controller still live, same cntlid, no kernel complaints"

step "I/O after the idle period"
fio_verify after-idle "$D" 2048 --rw=randwrite --bs=4k --iodepth=8 --offset=$((PAT_MB))m --size=2m
ok "2 MiB random write + verify"

step "disconnect"
disconnect "$NQN"
dmesg_clean "during I/O and disconnect"
ok "disconnected"
checkpoint after-disconnect "active_controllers=0 expected"

step "reconnect and read the pattern back"
dmesg_mark
connect "$NQN" "${H[@]}"
D=$(ns_dev "$NQN" 1) || fail "no block device for namespace 1 after reconnect"
[ "$(cat "/sys/block/${D#/dev/}/wwid")" = "$WWID" ] || fail "namespace wwid changed across reconnect: $(cat "/sys/block/${D#/dev/}/wwid") != $WWID"
GOT=$(dd if="$D" bs=$PAT_BS count=$((PAT_MB * 1048576 / PAT_BS)) iflag=direct 2>/dev/null | sha256sum | cut -d' ' -f1)
[ "$GOT" = "$SUM" ] || fail "data after reconnect differs: sha256 $GOT, written $SUM"
ok "same wwid, same data ($GOT)"

step "final disconnect"
disconnect "$NQN"
dmesg_clean "after reconnect"
ok "disconnected"
checkpoint final "active_controllers=0 expected"
echo "ALL STEPS PASSED"
