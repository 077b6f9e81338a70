# Interop scenario: two nvmfd gateways serve one RBD image as two separate subsystems (no
# multipath: the guest picks the gateway). What one gateway wrote, the other reads at once,
# in both directions and after the reader had the old data (a gateway with a read cache
# would return it): the view two active/active gateways give is coherent.
#
# env: PORTS="PA PB" NQNS="NQN_A NQN_B" HOSTNQN HOSTID, ROUNDS (3)
PORT=${PORTS%% *}
. /job/lib.sh
read -r PA PB <<< "$PORTS"
read -r NA NB <<< "$NQNS"
H=(--hostnqn="$HOSTNQN" --hostid="$HOSTID")
ROUNDS=${ROUNDS:-3}

step "connect gateway a ($PA, $NA) and gateway b ($PB, $NB)"
run nvme connect -t tcp -a "$ADDR" -s "$PA" -n "$NA" "${H[@]}"
run nvme connect -t tcp -a "$ADDR" -s "$PB" -n "$NB" "${H[@]}"
DA=$(ns_dev "$NA" 1) || fail "no block device for $NA"
DB=$(ns_dev "$NB" 1) || fail "no block device for $NB"
ok "a: $DA, b: $DB"

# sha256 of 1 MiB at MiB $2 of device $1, read with O_DIRECT (no page cache)
sum_at() { dd if="$1" bs=1M skip="$2" count=1 iflag=direct 2>/dev/null | sha256sum | cut -d' ' -f1; }
# write 1 MiB of fresh random data at MiB $2 of device $1 (O_DIRECT); prints its sha256
write_at() {
  dd if=/dev/urandom of=/tmp/blk bs=1M count=1 2>/dev/null
  dd if=/tmp/blk of="$1" bs=1M seek="$2" count=1 oflag=direct conv=fsync 2>/dev/null || return 1
  sha256sum < /tmp/blk | cut -d' ' -f1
}

for r in $(seq "$ROUNDS"); do
  at=$((r * 2))
  step "round $r at $at MiB: write on a, read on b and a; rewrite on b, read on a and b"
  w1=$(write_at "$DA" "$at") || fail "write on a failed"
  [ "$(sum_at "$DB" "$at")" = "$w1" ] || fail "b does not read what a wrote"
  [ "$(sum_at "$DA" "$at")" = "$w1" ] || fail "a does not read what it wrote"
  w2=$(write_at "$DB" "$at") || fail "write on b failed"
  [ "$(sum_at "$DA" "$at")" = "$w2" ] || fail "a returns stale data after b rewrote the block"
  [ "$(sum_at "$DB" "$at")" = "$w2" ] || fail "b does not read what it wrote"
  w3=$(write_at "$DA" "$at") || fail "write on a failed"
  [ "$(sum_at "$DB" "$at")" = "$w3" ] || fail "b returns stale data after a rewrote the block"
  ok "both gateways agree"
done

step "disconnect"
run nvme disconnect -n "$NA"
run nvme disconnect -n "$NB"
wait_no_ctrl "$NA" && wait_no_ctrl "$NB" || fail "controllers still present"
ok "disconnected"
echo "ALL STEPS PASSED"
