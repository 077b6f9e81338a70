# Interop scenario: fio with crc32c verification, without and with NVMe/TCP digests.
#
# env: PORT NQN HOSTNQN HOSTID
#      FIO_MB   MiB covered by each workload (16)
. /job/lib.sh
FIO_MB=${FIO_MB:-16}
H=(--hostnqn="$HOSTNQN" --hostid="$HOSTID")

for mode in plain digest; do
  args=()
  [ "$mode" = digest ] && args=(--hdr-digest --data-digest)
  dmesg_mark
  step "connect $NQN ($mode)"
  connect "$NQN" "${H[@]}" "${args[@]}"
  D=$(ns_dev "$NQN" 1) || fail "no block device for namespace 1"
  ok "controller $CTRL, namespace $D"

  step "fio ($mode): 4k randrw 75/25 and 128k sequential write+read, ${FIO_MB} MiB each, crc32c verify"
  fio_suite "$mode" "$D" "$FIO_MB"
  ok "fio verified ($mode)"

  step "disconnect ($mode)"
  disconnect "$NQN"
  dmesg_clean "during the $mode fio run"
  ok "disconnected"
  checkpoint "after-$mode" "no controllers expected"
done
echo "ALL STEPS PASSED"
