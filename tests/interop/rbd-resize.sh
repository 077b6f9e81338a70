# Interop scenario: an RBD namespace grows under a connected kernel host, twice: through
# nvmfd's bdev_rbd_resize RPC (checkpoint grow-rpc) and with `rbd resize` from outside
# nvmfd (checkpoint grow-cli, seen through the image's size watch). Each time the host must
# see the new size (block device and Identify Namespace NSZE) without reconnecting, within
# 30 s; then fio crc32c verify runs in the space that was added (its first 8 MiB).
#
# env: PORT NQN HOSTNQN HOSTID
#      SIZES_MB "INITIAL RPC CLI": the image's size before, after grow-rpc, after grow-cli
. /job/lib.sh
read -r SIZE0 SIZE1 SIZE2 <<< "${SIZES_MB:?}"
H=(--hostnqn="$HOSTNQN" --hostid="$HOSTID")

dev_mb() { echo $(( $(cat "/sys/block/${D#/dev/}/size") / 2048 )); }
# NSZE (blocks) x the formatted LBA size, in MiB, from nvme id-ns
idns_mb() {
  local out nsze lbads
  out=$(nvme id-ns "$D" 2>/dev/null) || { echo -1; return; }
  nsze=$(printf '%s\n' "$out" | sed -n 's/^nsze *: *//p')
  lbads=$(printf '%s\n' "$out" | sed -n 's/^lbaf *[0-9]* *:.*lbads:\([0-9]*\).*(in use).*/\1/p')
  echo $(( nsze * (1 << ${lbads:-9}) >> 20 ))
}

# wait up to 30 s for the block device and Identify Namespace to say $1 MiB
wait_size() {
  local i
  for i in $(seq 300); do
    [ "$(dev_mb)" = "$1" ] && [ "$(idns_mb)" = "$1" ] && return 0
    sleep 0.1
  done
  fail "after 30 s: $D is $(dev_mb) MiB, Identify Namespace says $(idns_mb) MiB, want $1 MiB"
}

dmesg_mark
step "connect $NQN"
connect "$NQN" "${H[@]}"
D=$(ns_dev "$NQN" 1) || fail "no block device for namespace 1"
wait_size "$SIZE0"
ok "controller $CTRL, namespace $D, $SIZE0 MiB"

n=0
for how in rpc cli; do
  n=$((n + 1)); old=$(dev_mb)
  case $n in 1) new=$SIZE1 ;; *) new=$SIZE2 ;; esac
  step "grow to $new MiB ($how) while connected"
  checkpoint "grow-$how" "$new"
  wait_size "$new"
  dmesg | tail -n 5 | grep -i capacity | sed 's/^/  | /'
  [ "$CTRL" = "$(ctrl_of "$NQN")" ] || fail "the controller changed: the host reconnected"
  ok "$D is $new MiB (block device and NSZE), same controller $CTRL"

  step "fio crc32c verify in the added space (8 MiB at $old MiB, the old end)"
  fio_verify "grown-$how" "$D" 1 --rw=randrw --rwmixread=50 --bs=4k --iodepth=8 \
    --offset="${old}m" --size=8m
  ok "verified"
done

step "disconnect"
disconnect "$NQN"
ok "disconnected"
echo "ALL STEPS PASSED"
