# Interop scenario: DH-HMAC-CHAP in-band authentication with the kernel host (6.12:
# Debian 12's 6.1 kernel is built without CONFIG_NVME_AUTH).
#
# env: PORT NQN HOSTNQN HOSTID KEY CKEY WRONG KEY2 FIO_MB
# The subsystem allows only HOSTNQN, with host key KEY and controller key CKEY. The host
# driver changes the target's digest/DH group policy and the host's keys at checkpoints.
. /job/lib.sh
FIO_MB=${FIO_MB:-4}
H=(--hostnqn="$HOSTNQN" --hostid="$HOSTID" --nr-io-queues=1)

brief_fio() {  # dev
  fio_verify "auth-seq-128k" "$1" $((FIO_MB * 1024)) --rw=write --bs=128k --iodepth=4 --size="${FIO_MB}m"
}

refused() {  # what [nvme connect args...]
  local what=$1 out rc; shift
  echo "+ nvme connect ... $* (must be refused)"
  out=$(nvme connect -t tcp -a "$ADDR" -s "$PORT" -n "$NQN" "$@" 2>&1); rc=$?
  [ -n "$out" ] && printf '%s\n' "$out" | sed 's/^/  | /'
  [ "$rc" != 0 ] || fail "$what: nvme connect succeeded"
  wait_no_ctrl "$NQN" || fail "$what: a controller is left"
}

checkpoint "dh-null" "SHA-256, null DH group"
step "no secret: refused (the target requires authentication)"
refused "no secret" "${H[@]}"
ok "refused"

step "wrong secret: refused"
refused "wrong secret" "${H[@]}" --dhchap-secret="$WRONG"
ok "refused"
checkpoint "after-wrong" "the refusal is logged with the host NQN"

for mode in uni bi; do
  args=(--dhchap-secret="$KEY")
  [ "$mode" = bi ] && args+=(--dhchap-ctrl-secret="$CKEY")
  dmesg_mark
  step "connect, SHA-256, null DH, $mode-directional"
  connect "$NQN" "${H[@]}" "${args[@]}"
  D=$(ns_dev "$NQN" 1) || fail "no block device for namespace 1"
  ok "controller $CTRL, namespace $D"
  step "fio ($mode)"
  brief_fio "$D"
  ok "verified"
  disconnect "$NQN"
  dmesg_clean "during the $mode run"
  checkpoint "after-$mode" "no controllers expected"
done

for d in sha384 sha512; do
  checkpoint "digest-$d" "$d only, null DH group"
  step "connect, $d, null DH, bidirectional"
  connect "$NQN" "${H[@]}" --dhchap-secret="$KEY" --dhchap-ctrl-secret="$CKEY"
  D=$(ns_dev "$NQN" 1) || fail "no block device for namespace 1"
  run dd if="$D" of=/dev/null bs=128k count=32 iflag=direct
  disconnect "$NQN"
  ok "authenticated with $d"
  checkpoint "after-$d" "no controllers expected"
done
checkpoint "dh-null-again" "back to SHA-256, null DH group"

step "wrong controller secret: the host refuses the controller"
refused "wrong controller secret" "${H[@]}" --dhchap-secret="$KEY" --dhchap-ctrl-secret="$KEY2"
ok "refused"

checkpoint "dh-ffdhe" "SHA-256, ffdhe2048"
dmesg_mark
step "connect, SHA-256, ffdhe2048, bidirectional"
connect "$NQN" "${H[@]}" --dhchap-secret="$KEY" --dhchap-ctrl-secret="$CKEY"
D=$(ns_dev "$NQN" 1) || fail "no block device for namespace 1"
ok "controller $CTRL, namespace $D"
step "fio (ffdhe2048)"
brief_fio "$D"
ok "verified"

checkpoint "rotate" "host key rotated to KEY2 over RPC"
step "re-authenticate with the rotated key (sysfs dhchap_secret)"
echo "$KEY2" > "/sys/class/nvme/$CTRL/dhchap_secret" || fail "cannot write dhchap_secret"
sleep 3
[ "$(cat "/sys/class/nvme/$CTRL/state")" = live ] || fail "controller not live after re-authentication"
run dd if="$D" of=/dev/null bs=128k count=64 iflag=direct
ok "live after re-authentication"
checkpoint "reauth" "re-authenticated with the new key"
disconnect "$NQN"
dmesg_clean "during the ffdhe run"
checkpoint "after-ffdhe" "no controllers expected"

step "old secret after rotation: refused"
refused "old secret" "${H[@]}" --dhchap-secret="$KEY"
ok "refused"
echo "ALL STEPS PASSED"
