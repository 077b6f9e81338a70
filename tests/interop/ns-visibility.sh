# Interop scenario: per-host namespace visibility (no_auto_visible, nvmf_ns_add_host /
# nvmf_ns_remove_host; docs/VISIBILITY.md) with the Linux kernel host.
# Namespace 1 is visible to this host ($HOSTNQN), namespace 2 only to another host ($OTHERNQN).
# (a) connected as $HOSTNQN, nvme list-ns shows only namespace 1 and no block device of
#     namespace 2 exists;
# (b) the host driver runs nvmf_ns_add_host 2 $HOSTNQN: namespace 2 appears (Namespace
#     Attribute Changed AEN + Changed Namespace List) on the same controller, no reconnect;
#     write + verify on it;
# (c) nvmf_ns_remove_host 2 $HOSTNQN: the kernel removes its block device, list-ns shows
#     namespace 1 only, the controller stays live and namespace 1 still works;
# (d) a second controller as $OTHERNQN (its own host ID) lists namespace 2 only.
#
# env: PORT NQN HOSTNQN HOSTID OTHERNQN OTHERID, CHECKPOINTS=1
. /job/lib.sh

# the live controller of subsystem $1 connected as host NQN $2
ctrl_as() {
  local i c
  for i in $(seq 100); do
    for c in /sys/class/nvme/nvme*; do
      [ -e "$c/subsysnqn" ] && [ "$(cat "$c/subsysnqn")" = "$1" ] &&
        [ "$(cat "$c/hostnqn")" = "$2" ] && [ "$(cat "$c/state")" = live ] &&
        { echo "${c##*/}"; return 0; }
    done
    sleep 0.1
  done
  return 1
}

# the active NSIDs of controller $1 (nvme list-ns), one line, decimal
active_of() {
  nvme list-ns "/dev/$1" | sed -n 's/.*:0x\([0-9a-f]*\).*/\1/p' | while read -r x; do printf '%d ' "0x$x"; done
}

dmesg_mark
step "connect $NQN as $HOSTNQN"
run nvme connect -t tcp -a "$ADDR" -s "$PORT" -n "$NQN" --hostnqn="$HOSTNQN" --hostid="$HOSTID"
C1=$(ctrl_as "$NQN" "$HOSTNQN") || fail "no live controller as $HOSTNQN"
CNTLID=$(cat "/sys/class/nvme/$C1/cntlid")
D1=$(ns_dev "$NQN" 1) || fail "no block device for namespace 1"
A=$(active_of "$C1")
info "nvme list-ns /dev/$C1: $A"
[ "$A" = "1 " ] || fail "active namespaces of $C1: '$A', expected only 1"
for b in /sys/block/nvme*; do
  [ "$(cat "$b/nsid" 2>/dev/null)" = 2 ] && fail "a block device of namespace 2 exists: ${b##*/}"
done
run nvme list
ok "$C1 (cntlid $CNTLID) sees namespace 1 only ($D1)"

step "host makes namespace 2 visible to $HOSTNQN; the kernel shows it without reconnecting"
checkpoint add-host "nvmf_ns_add_host $NQN 2 $HOSTNQN"
D2=$(ns_dev "$NQN" 2) || D2=$(ns_dev "$NQN" 2) || fail "namespace 2 did not appear within 20 s"
[ "$(cat "/sys/class/nvme/$C1/cntlid")" = "$CNTLID" ] || fail "the controller changed (the host reconnected)"
[ "$(cat "/sys/class/nvme/$C1/state")" = live ] || fail "controller $C1 not live"
A=$(active_of "$C1")
[ "$A" = "1 2 " ] || fail "active namespaces of $C1: '$A', expected 1 2"
fio_verify ns2 "$D2" 4096 --rw=randwrite --bs=4k --iodepth=8 --size=4m
ok "namespace 2 = $D2 on the same controller, written and verified"

step "host hides namespace 2 from $HOSTNQN again; the kernel removes it"
checkpoint remove-host "nvmf_ns_remove_host $NQN 2 $HOSTNQN"
for i in $(seq 200); do [ -b "$D2" ] || break; sleep 0.1; done
[ -b "$D2" ] && fail "$D2 still present 20 s after nvmf_ns_remove_host"
[ "$(cat "/sys/class/nvme/$C1/state")" = live ] || fail "controller $C1 is $(cat "/sys/class/nvme/$C1/state")"
A=$(active_of "$C1")
[ "$A" = "1 " ] || fail "active namespaces of $C1: '$A', expected only 1"
fio_verify ns1 "$D1" 1024 --rw=randwrite --bs=4k --iodepth=8 --size=1m
ok "$D2 removed, $C1 live with namespace 1 only"

step "a second controller as $OTHERNQN sees namespace 2 only"
# Through the kernel's fabrics device: nvme-cli 2.4 (libnvme) answers "already connected" for a
# second host NQN to the same subsystem and address, even with --duplicate-connect.
OPTS="transport=tcp,traddr=$ADDR,trsvcid=$PORT,nqn=$NQN,hostnqn=$OTHERNQN,hostid=$OTHERID"
echo "+ echo $OPTS > /dev/nvme-fabrics"
echo "$OPTS" > /dev/nvme-fabrics || fail "connect as $OTHERNQN through /dev/nvme-fabrics"
C2=$(ctrl_as "$NQN" "$OTHERNQN") || fail "no live controller as $OTHERNQN"
A=$(active_of "$C2")
info "nvme list-ns /dev/$C2: $A"
[ "$A" = "2 " ] || fail "active namespaces of $C2: '$A', expected only 2"
A=$(active_of "$C1")
[ "$A" = "1 " ] || fail "active namespaces of $C1 changed: '$A'"
run nvme list
ok "$C2 sees namespace 2 only, $C1 namespace 1 only"

step "disconnect"
disconnect "$NQN"
ok "disconnected"
checkpoint final "active_controllers=0 expected"
echo "ALL STEPS PASSED"
