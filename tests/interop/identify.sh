# Interop scenario: discovery, connect, nvme list / id-ctrl / id-ns / ns-descs, host allow list.
#
# env: PORT            target port (guest reaches it as 10.0.2.2:PORT)
#      NQN             subsystem with two namespaces, any host allowed
#      SERIAL MODEL    expected identify strings of NQN
#      NS1_BLOCKS NS2_BLOCKS BLOCK_SIZE   expected namespace sizes
#      HOSTNQN HOSTID  the host identity used for every allowed connect
#      ACL_NQN         (optional) subsystem allowing only HOSTNQN
#      OTHER_HOSTNQN OTHER_HOSTID  a host identity not on ACL_NQN's list
. /job/lib.sh
ACL_NQN=${ACL_NQN:-}
H=(--hostnqn="$HOSTNQN" --hostid="$HOSTID")
dmesg_mark

step "discover"
run nvme discover -t tcp -a "$ADDR" -s "$PORT" "${H[@]}"
grep -q "subnqn: *$NQN\$" <<<"$LAST_OUT" || fail "discovery log does not list $NQN"
if [ -n "$ACL_NQN" ]; then
  grep -q "subnqn: *$ACL_NQN\$" <<<"$LAST_OUT" || fail "discovery log does not list $ACL_NQN for its allowed host"
fi
ok "discovery log lists the subsystem(s)"

step "connect $NQN"
connect "$NQN" "${H[@]}"
D1=$(ns_dev "$NQN" 1) || fail "no block device for namespace 1"
D2=$(ns_dev "$NQN" 2) || fail "no block device for namespace 2"
ok "controller $CTRL, namespaces $D1 $D2"

step "nvme list"
run nvme list
for d in "$D1" "$D2"; do
  line=$(grep "^$d " <<<"$LAST_OUT") || fail "nvme list has no line for $d"
  grep -qF -- "$SERIAL" <<<"$line" || fail "nvme list: serial '$SERIAL' missing for $d: $line"
  grep -qF -- "$MODEL" <<<"$line" || fail "nvme list: model '$MODEL' missing for $d: $line"
done
for pair in "$D1:$NS1_BLOCKS" "$D2:$NS2_BLOCKS"; do
  d=${pair%%:*}; want=$(( ${pair#*:} * BLOCK_SIZE ))
  got=$(( $(cat "/sys/block/${d#/dev/}/size") * 512 ))
  [ "$got" = "$want" ] || fail "$d is $got bytes, expected $want"
  lbs=$(cat "/sys/block/${d#/dev/}/queue/logical_block_size")
  [ "$lbs" = "$BLOCK_SIZE" ] || fail "$d logical block size $lbs, expected $BLOCK_SIZE"
done
ok "model, serial and sizes as configured"

step "nvme id-ctrl"
run nvme id-ctrl "/dev/$CTRL"
field() { sed -n "s/^$1 *: *//p" <<<"$LAST_OUT" | head -n 1 | sed 's/ *$//'; }
[ "$(field sn)" = "$SERIAL" ] || fail "id-ctrl sn is '$(field sn)', expected '$SERIAL'"
[ "$(field mn)" = "$MODEL" ] || fail "id-ctrl mn is '$(field mn)', expected '$MODEL'"
[ "$(field subnqn)" = "$NQN" ] || fail "id-ctrl subnqn is '$(field subnqn)', expected '$NQN'"
[ "$(field cntlid)" != "" ] || fail "id-ctrl has no cntlid"
[ "$(( $(field cntlid) ))" = "$(cat "/sys/class/nvme/$CTRL/cntlid")" ] ||
  fail "id-ctrl cntlid $(field cntlid) differs from the Connect cntlid $(cat "/sys/class/nvme/$CTRL/cntlid")"
[ "$(( $(field kas) ))" -gt 0 ] || fail "id-ctrl kas is 0 (keep-alive support is mandatory on fabrics)"
ok "id-ctrl: sn, mn, subnqn, cntlid, kas"

step "nvme id-ns / ns-descs"
ids=()
for pair in "$D1:$NS1_BLOCKS" "$D2:$NS2_BLOCKS"; do
  d=${pair%%:*}
  run nvme id-ns "$d"
  nsze=$(sed -n 's/^nsze *: *//p' <<<"$LAST_OUT")
  [ "$((nsze))" = "${pair#*:}" ] || fail "$d id-ns nsze $nsze, expected ${pair#*:}"
  QUIET_RUN=1 run nvme id-ns "$d" --output-format=json
  info "$d id-ns: $(grep -E '"(nguid|eui64)"' <<<"$LAST_OUT" | tr -d ' \n')"
  run nvme ns-descs "$d"
  descs=$(grep -iE '^(eui64|nguid|uuid) *:' <<<"$LAST_OUT" | tr -d ' ' | tr 'A-F' 'a-f')
  [ -n "$descs" ] || fail "ns-descs of $d lists no identifier"
  grep -qE ':(0|-)+$' <<<"$descs" && fail "ns-descs of $d has an all-zero identifier: $descs"
  ids+=("$descs")
done
for t in eui64 nguid uuid; do
  a=$(grep "^$t:" <<<"${ids[0]}" || true); b=$(grep "^$t:" <<<"${ids[1]}" || true)
  [ -n "$a" ] && [ "$a" = "$b" ] && fail "namespaces 1 and 2 share $a"
done
grep -qE '^(nguid|uuid):' <<<"${ids[0]}" || fail "namespace 1 has neither NGUID nor UUID"
w1=$(cat "/sys/block/${D1#/dev/}/wwid"); w2=$(cat "/sys/block/${D2#/dev/}/wwid")
info "wwid ns1=$w1 ns2=$w2"
[ "$w1" != "$w2" ] || fail "both namespaces have wwid $w1"
ok "identifiers present, non-zero and distinct"

step "disconnect $NQN"
disconnect "$NQN"
ok "disconnected"
dmesg_clean "during discover/connect/identify"

if [ -n "$ACL_NQN" ]; then
  step "host allow list of $ACL_NQN"
  run nvme discover -t tcp -a "$ADDR" -s "$PORT" --hostnqn="$OTHER_HOSTNQN" --hostid="$OTHER_HOSTID"
  if grep -q "subnqn: *$ACL_NQN\$" <<<"$LAST_OUT"; then
    info "discovery log shows $ACL_NQN to a host that is not allowed (the kernel target hides it)"
  fi
  echo "+ nvme connect -n $ACL_NQN --hostnqn=$OTHER_HOSTNQN (must be refused)"
  if out=$(nvme connect -t tcp -a "$ADDR" -s "$PORT" -n "$ACL_NQN" \
             --hostnqn="$OTHER_HOSTNQN" --hostid="$OTHER_HOSTID" 2>&1); then
    echo "$out" | sed 's/^/  | /'
    fail "connect as $OTHER_HOSTNQN to $ACL_NQN succeeded; it is not on the allow list"
  fi
  echo "$out" | sed 's/^/  | /'
  sleep 0.5
  for c in /sys/class/nvme/nvme*; do
    [ -e "$c/subsysnqn" ] && [ "$(cat "$c/subsysnqn")" = "$ACL_NQN" ] && fail "a controller of $ACL_NQN exists after the refused connect"
  done
  echo "  guest dmesg about it:"; dmesg | tail -n "+$((DMESG_MARK + 1))" | tail -n 4 | sed 's/^/  | /'
  ok "host not on the allow list refused"
  dmesg_mark
  connect "$ACL_NQN" "${H[@]}"
  D=$(ns_dev "$ACL_NQN" 1) || fail "no block device for $ACL_NQN namespace 1"
  run dd if="$D" of=/dev/null bs=4k count=16 iflag=direct
  disconnect "$ACL_NQN"
  dmesg_clean "during the allowed connect"
  ok "allowed host connects and reads"
fi
echo "ALL STEPS PASSED"
