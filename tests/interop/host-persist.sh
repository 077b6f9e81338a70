# Interop scenario: nvmf's kernel-host commands (`nvmf connect`, `connect-all`, `doctor`; the
# `nvmf` binary is shipped into the guest as /job/nvmf) and nvme-cli's boot-time
# `nvme connect-all` (no arguments, what nvmf-autoconnect.service runs) restoring what
# `--persist` recorded: config.json for a single connect, discovery.conf for connect-all.
#
# env: PORT   target port (the guest reaches it as 10.0.2.2:PORT, and through socat as
#             127.0.0.1:PORT, the address nvmfd's discovery log gives)
#      NQN    subsystem with one namespace, any host allowed
# The host identity is the guest's own /etc/nvme/hostnqn and hostid (written by the testbed).
. /job/lib.sh
NVMF=/job/nvmf
CONF=/etc/nvme
HOSTNQN=$(cat $CONF/hostnqn)
rm -f $CONF/config.json $CONF/discovery.conf

# nvmfd's discovery log names its listener 127.0.0.1:PORT, the host's own address, which the
# guest reaches as 10.0.2.2:PORT. `nvme connect-all` connects to the addresses in the log, so a
# forwarder (socat, shipped like nvmf) on the guest's 127.0.0.1:PORT makes them work here, and
# everything below uses 127.0.0.1, as a host on the target's own network would.
ip link set lo up
/job/socat "TCP-LISTEN:$PORT,bind=127.0.0.1,fork,reuseaddr" "TCP:$ADDR:$PORT" &
ADDR=127.0.0.1
for i in $(seq 100); do (exec 3<>"/dev/tcp/$ADDR/$PORT") 2>/dev/null && break; sleep 0.1; done

step "a refused connect is a clear error"
out=$("$NVMF" connect -t tcp -a "$ADDR" -s "$PORT" -n nqn.2016-06.io.nvmfd:no-such-subsystem 2>&1); rc=$?
printf '%s\n' "$out" | sed 's/^/  | /'
[ "$rc" = 1 ] || fail "connecting to an unknown subsystem exited with $rc, expected 1"
grep -q "connect (nqn=" <<<"$out" || fail "the error does not show the option string"
ok "exit 1 with the kernel's error"

step "nvmf connect --persist (the kernel host through /dev/nvme-fabrics)"
run "$NVMF" connect -t tcp -a "$ADDR" -s "$PORT" -n "$NQN" --ctrl-loss-tmo -1 --keep-alive-tmo 7 --persist
name=$(sed -n 's/^\(nvme[0-9]*\): connected to .*/\1/p' <<<"$LAST_OUT")
[ -n "$name" ] || fail "nvmf connect printed no 'nvmeN: connected' line"
CTRL=$(ctrl_of "$NQN") || fail "no live controller for $NQN after nvmf connect"
[ "$CTRL" = "$name" ] || fail "nvmf connect printed $name, sysfs has $CTRL"
D=$(ns_dev "$NQN" 1) || fail "no block device for namespace 1"
[ "$(cat /sys/class/nvme/$CTRL/ctrl_loss_tmo)" = off ] ||
  fail "ctrl_loss_tmo is $(cat /sys/class/nvme/$CTRL/ctrl_loss_tmo), --ctrl-loss-tmo -1 asked for off"
[ ! -e /sys/class/nvme/$CTRL/kato ] || [ "$(cat /sys/class/nvme/$CTRL/kato)" = 7 ] ||
  fail "kato is $(cat /sys/class/nvme/$CTRL/kato), --keep-alive-tmo 7 asked for 7"
[ "$(cat /sys/class/nvme/$CTRL/hostnqn)" = "$HOSTNQN" ] || fail "the controller's hostnqn is not $CONF/hostnqn's"
ok "$CTRL, $D; ctrl_loss_tmo off, kato 7, host NQN from $CONF/hostnqn"
# from here on the kernel must log no trouble (the refused connect above and its notice
# "ctrl_loss_tmo < 0 will reconnect forever" are expected)
dmesg_mark

step "config.json"
echo "  | $(tr -d '\n' < $CONF/config.json)"
for want in "\"hostnqn\": \"$HOSTNQN\"" "\"nqn\": \"$NQN\"" "\"traddr\": \"$ADDR\"" "\"trsvcid\": \"$PORT\"" "\"ctrl_loss_tmo\": -1"; do
  grep -qF -- "$want" $CONF/config.json || fail "config.json lacks $want"
done
cp $CONF/config.json /tmp/config.json.1
run "$NVMF" connect -t tcp -a "$ADDR" -s "$PORT" -n "$NQN" --ctrl-loss-tmo -1 --keep-alive-tmo 7 --persist
grep -q "already connected" <<<"$LAST_OUT" || fail "a second nvmf connect did not say 'already connected'"
cmp -s $CONF/config.json /tmp/config.json.1 || fail "a second nvmf connect --persist changed config.json"
[ "$(ls /sys/class/nvme | wc -l)" = 1 ] || fail "a second controller appeared: $(ls /sys/class/nvme)"
ok "recorded once; a second connect changes nothing"

step "nvmf doctor on the connected guest"
out=$("$NVMF" doctor 2>&1); rc=$?
printf '%s\n' "$out" | sed 's/^/  | /'
[ "$rc" = 0 ] || fail "nvmf doctor exited with $rc (an error-level finding)"
for want in "^OK    module      nvme_fabrics" "^OK    module      nvme_tcp" "^OK    hostid" \
            "^(OK   |INFO ) timeouts    $CTRL " "^OK    mtu " "^INFO  numa "; do
  grep -qE -- "$want" <<<"$out" || fail "nvmf doctor has no line matching '$want'"
done
ok "doctor: no error; modules, host ID, timeouts, MTU and NUMA lines as expected"

step "disconnect, then nvme connect-all (no arguments) restores it from config.json"
disconnect "$NQN"
run nvme connect-all
CTRL=$(ctrl_of "$NQN") || fail "nvme connect-all did not connect $NQN from config.json"
D=$(ns_dev "$NQN" 1) || fail "no block device for namespace 1 after nvme connect-all"
ok "$CTRL, $D back"
disconnect "$NQN"
rm -f $CONF/config.json

step "nvmf connect-all --persist, then nvme connect-all restores it from discovery.conf"
run "$NVMF" connect-all -t tcp -a "$ADDR" -s "$PORT" --persist
CTRL=$(ctrl_of "$NQN") || fail "nvmf connect-all did not connect $NQN"
line=$(grep -v '^#' $CONF/discovery.conf)
echo "  | discovery.conf: $line"
[ "$line" = "--transport=tcp --traddr=$ADDR --trsvcid=$PORT" ] || fail "unexpected discovery.conf line: $line"
run "$NVMF" connect-all -t tcp -a "$ADDR" -s "$PORT" --persist
grep -q "persist: already in" <<<"$LAST_OUT" || fail "a second connect-all --persist recorded again"
[ "$(grep -vc '^#' $CONF/discovery.conf)" = 1 ] || fail "discovery.conf has more than one line"
disconnect "$NQN"
run nvme connect-all
CTRL=$(ctrl_of "$NQN") || fail "nvme connect-all did not connect $NQN from discovery.conf"
D=$(ns_dev "$NQN" 1) || fail "no block device for namespace 1 after nvme connect-all"
ok "$CTRL, $D back"
disconnect "$NQN"
dmesg_clean "over the whole scenario"
echo "PASS"
