# Interop scenario (6.12 TLS guest): the Linux host (nvme-cli 2.13 + tlshd) against nvmfd's TLS
# listener.  One I/O queue per connection; every step bounded in time.
#  - nvme discover (clear-text discovery listener DPORT) shows the secure listener as TLS 1.3 / required;
#  - a clear-text connect to the secure listener (PORT) is refused;
#  - a wrong configured PSK is refused (its version-1 identity, then its version-0 identity alone);
#  - the right PSK: nvme connect --tls, fio verify over TLS, disconnect;
#  - a second host with a SHA-384 PSK connects and reads 1 MiB (the host side checks the suite:
#    TLS_CHACHA20_POLY1305_SHA256, see docs/TLS.md "the Linux host and SHA-384 keys").
# Host checkpoints check nvmfd's log after each step.
# env: PORT DPORT NQN HOSTNQN HOSTID PSK WRONG_PSK HOST2NQN HOST2ID PSK2 FIO_MB
. /job/lib.sh
. /job/tls-lib.sh
tls_session
FIO_MB=${FIO_MB:-4}
tls_init

step "nvme discover (clear-text discovery listener on $DPORT)"
out=$(timeout 30 "$T/nvme" discover -t tcp -a "$ADDR" -s "$DPORT" --hostnqn="$HOSTNQN" --hostid="$HOSTID" 2>&1)
rc=$?
printf '%s\n' "$out" | sed 's/^/  | /'
[ "$rc" = 0 ] || fail "nvme discover exited with status $rc"
rec=$(printf '%s\n' "$out" | awk -v p="$PORT" -v n="$NQN" '/^=====Discovery Log Entry/ { if (r ~ ("trsvcid: *" p) && r ~ n) print r; r = "" } { r = r "\n" $0 } END { if (r ~ ("trsvcid: *" p) && r ~ n) print r }')
[ -n "$rec" ] || fail "no discovery log entry for $NQN on port $PORT"
printf '%s\n' "$rec" | grep -Eq 'treq: *required' || fail "the secure listener's entry does not say treq: required"
printf '%s\n' "$rec" | grep -Eiq 'sectype: *tls' || fail "the secure listener's entry does not name TLS as its security type"
ok "entry for $NQN:$PORT: $(printf '%s\n' "$rec" | grep -E 'treq|sectype' | tr -s ' ' | tr '\n' ';')"

step "clear-text connect to the secure listener"
if tls_connect "$NQN"; then fail "a clear-text connect to the TLS listener succeeded"; fi
ok "refused"
checkpoint after-clear "nvmfd must log the clear-text ICReq refusal"

step "wrong PSK (version-1 identity)"
tls_clear
QUIET_RUN=1 tls_insert "$WRONG_PSK" "$NQN" 0
QUIET_RUN=1 tls_insert "$WRONG_PSK" "$NQN" 1
if tls_connect "$NQN" --tls; then fail "nvme connect --tls with a wrong PSK succeeded"; fi
ok "refused"
checkpoint after-wrong "nvmfd must log a refused handshake"

step "wrong PSK (version-0 identity only)"
tls_clear
QUIET_RUN=1 tls_insert "$WRONG_PSK" "$NQN" 0
if tls_connect "$NQN" --tls; then fail "nvme connect --tls with a wrong version-0 PSK succeeded"; fi
ok "refused"
checkpoint after-wrong-v0 "nvmfd must log a refused handshake"

step "TLS connect with the configured PSK"
tls_clear
QUIET_RUN=1 tls_insert "$PSK" "$NQN" 0
QUIET_RUN=1 tls_insert "$PSK" "$NQN" 1
dmesg_mark
tls_connect "$NQN" --tls || fail "nvme connect --tls with the configured PSK failed"
CTRL=$(ctrl_of "$NQN") || fail "no live controller for $NQN after nvme connect --tls"
D=$(ns_dev "$NQN" 1) || fail "no block device for namespace 1"
ok "controller $CTRL ($(cat /sys/class/nvme/$CTRL/tls_key 2>/dev/null || echo 'no tls_key attribute')), namespace $D"
checkpoint connected "nvmfd must log the TLS session"

step "fio over TLS: 4k randrw 75/25 and 128k sequential write+read, ${FIO_MB} MiB each, crc32c verify"
fio_suite tls "$D" "$FIO_MB"
ok "fio verified over TLS"

step "disconnect"
timeout 30 "$T/nvme" disconnect -n "$NQN" | sed 's/^/  | /'
wait_no_ctrl "$NQN" || fail "controller of $NQN still present after disconnect"
dmesg_clean "during the TLS session"
ok "disconnected"
checkpoint after-tls "no controllers expected"

step "second host, SHA-384 PSK"
tls_clear
HOSTNQN=$HOST2NQN QUIET_RUN=1 tls_insert "$PSK2" "$NQN" 1
HOSTNQN=$HOST2NQN HOSTID=$HOST2ID tls_connect "$NQN" --tls || fail "nvme connect --tls with the SHA-384 PSK failed"
CTRL=$(ctrl_of "$NQN") || fail "no live controller for $NQN (SHA-384 host)"
D=$(ns_dev "$NQN" 1) || fail "no block device for namespace 1 (SHA-384 host)"
run dd if="$D" of=/dev/null bs=64k count=16 iflag=direct
ok "controller $CTRL, read 1 MiB"
checkpoint connected-384 "nvmfd must log a TLS_CHACHA20_POLY1305_SHA256 session"
timeout 30 "$T/nvme" disconnect -n "$NQN" | sed 's/^/  | /'
wait_no_ctrl "$NQN" || fail "controller of $NQN still present after disconnect"
ok "disconnected"
checkpoint final "no controllers expected"
tls_log
echo "ALL STEPS PASSED"
