# Interop scenario: an RBD namespace (nvmfd serving a Ceph image) under the kernel host:
# discovery, connect, fio crc32c verify (4k randrw 75/25 and 128k sequential), then a known
# pattern written with dd and the whole namespace's SHA-256, which the host driver compares
# with the image exported by `rbd export` (checkpoint compare): nvmfd stored exactly the
# bytes the host wrote.
#
# env: PORT NQN HOSTNQN HOSTID
#      SIZE_MB       the image's size (MiB)
#      FIO_MB        MiB covered by each fio workload, from offset 0 (16)
#      PATTERN_AT_MB where the dd pattern goes (MiB), PATTERN_MB its length (4)
. /job/lib.sh
FIO_MB=${FIO_MB:-16}
PATTERN_MB=${PATTERN_MB:-4}
PATTERN_AT_MB=${PATTERN_AT_MB:?}
H=(--hostnqn="$HOSTNQN" --hostid="$HOSTID")

step "discover 10.0.2.2:$PORT"
run nvme discover -t tcp -a "$ADDR" -s "$PORT" "${H[@]}"
printf '%s\n' "$LAST_OUT" | grep -q "subnqn: *$NQN" || fail "discovery log has no entry for $NQN"
ok "$NQN in the discovery log"

dmesg_mark
step "connect $NQN"
connect "$NQN" "${H[@]}"
D=$(ns_dev "$NQN" 1) || fail "no block device for namespace 1"
bytes=$(blockdev --getsize64 "$D")
[ "$bytes" = $((SIZE_MB << 20)) ] || fail "$D has $bytes bytes, the image $SIZE_MB MiB"
ok "controller $CTRL, namespace $D, $SIZE_MB MiB"

step "fio: 4k randrw 75/25 and 128k sequential write+read, ${FIO_MB} MiB each, crc32c verify"
fio_suite rbd "$D" "$FIO_MB"
ok "fio verified"

step "dd a ${PATTERN_MB} MiB random pattern at ${PATTERN_AT_MB} MiB; read it back"
run dd if=/dev/urandom of=/job/pattern.bin bs=1M count="$PATTERN_MB"
run dd if=/job/pattern.bin of="$D" bs=1M seek="$PATTERN_AT_MB" oflag=direct conv=fsync
want=$(sha256sum < /job/pattern.bin | cut -d' ' -f1)
got=$(dd if="$D" bs=1M skip="$PATTERN_AT_MB" count="$PATTERN_MB" iflag=direct 2>/dev/null | sha256sum | cut -d' ' -f1)
[ "$got" = "$want" ] || fail "pattern read back: sha256 $got, written $want"
ok "pattern sha256 $want"

step "SHA-256 of the whole namespace; the host compares it with rbd export"
sum=$(dd if="$D" bs=1M iflag=direct 2>/dev/null | sha256sum | cut -d' ' -f1)
info "namespace sha256 $sum"
checkpoint compare "$sum"
ok "rbd export matches"

step "disconnect"
disconnect "$NQN"
dmesg_clean "while the RBD namespace was in use"
ok "disconnected"
echo "ALL STEPS PASSED"
