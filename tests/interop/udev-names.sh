# Interop scenario: readable device names for nvmfd's namespaces on the Linux kernel host.
# nvmfd puts each namespace's bdev name in Identify Namespace's vendor-specific area;
# `nvmf udev-name` (shipped as /job/nvmf) reads it through the disk, and nvmf's udev rule
# (packaging/udev/70-nvmfd.rules, given base64-encoded in RULES_B64) turns it into
# /dev/disk/by-nvmfd/SUBSYSTEM-NQN/NAME. The guest runs no udevd: the rule is run by
# `udevadm test` (this machine's udevadm, systemd 252, shipped as /job/udevadm), which
# executes its IMPORT{program} and prints the links it would make. The connect is
# `nvmf connect --persist`; a "reboot" (disconnect, then nvme-cli's boot-time `nvme
# connect-all`, what nvmf-autoconnect.service runs; the testbed cannot reboot a guest)
# brings the namespace back under the same name with its data.
#
# env: PORT NQN (two namespaces: 1 = bdev Malloc0, 2 = bdev vm-101-disk-0), RULES_B64
. /job/lib.sh
NVMF=/job/nvmf
rm -f /etc/nvme/config.json /etc/nvme/discovery.conf

# nvmfd's discovery log names 127.0.0.1:PORT; the boot-time `nvme connect-all` connects to
# the addresses in it, so a forwarder on the guest's 127.0.0.1 (as in host-persist.sh)
ip link set lo up
/job/socat "TCP-LISTEN:$PORT,bind=127.0.0.1,fork,reuseaddr" "TCP:$ADDR:$PORT" &
ADDR=127.0.0.1
for i in $(seq 100); do (exec 3<>"/dev/tcp/$ADDR/$PORT") 2>/dev/null && break; sleep 0.1; done

step "nvmf connect --persist (native multipath head devices)"
run "$NVMF" connect -t tcp -a "$ADDR" -s "$PORT" -n "$NQN" --persist
CTRL=$(ctrl_of "$NQN") || fail "no live controller for $NQN"
D1=$(ns_dev "$NQN" 1) || fail "namespace 1 not there"
D2=$(ns_dev "$NQN" 2) || fail "namespace 2 not there"
ok "namespaces 1 and 2 are $D1 and $D2"

step "nvmf udev-name reads the names through the disks"
for pair in "$D1 1 Malloc0" "$D2 2 vm-101-disk-0"; do
  read -r dev nsid name <<<"$pair"
  out=$("$NVMF" udev-name --dev "$dev" 2>&1) || { echo "$out"; fail "nvmf udev-name --dev $dev failed"; }
  printf '%s\n' "$out" | sed 's/^/  | /'
  grep -qx "NVMFD_SUBSYSTEM=$NQN" <<<"$out" || fail "$dev: no NVMFD_SUBSYSTEM=$NQN"
  grep -qx "NVMFD_NAME=$name" <<<"$out" || fail "$dev: no NVMFD_NAME=$name"
  grep -qx "NVMFD_NSID=$nsid" <<<"$out" || fail "$dev: no NVMFD_NSID=$nsid"
done
ok "Malloc0 and vm-101-disk-0 with the subsystem NQN"

step "the udev rule makes /dev/disk/by-nvmfd/SUBSYSTEM/NAME (udevadm test)"
mkdir -p /etc/udev/rules.d /run/udev
echo "$RULES_B64" | base64 -d | sed "s|/usr/bin/nvmf |$NVMF |" > /etc/udev/rules.d/70-nvmfd.rules
grep -q "$NVMF udev-name" /etc/udev/rules.d/70-nvmfd.rules || fail "the rule does not run $NVMF"
for pair in "$D1 Malloc0" "$D2 vm-101-disk-0"; do
  read -r dev name <<<"$pair"
  out=$(/job/udevadm test --action=add "/sys/class/block/${dev##*/}" 2>&1)
  links=$(printf '%s\n' "$out" | grep '^DEVLINKS=')
  echo "  | ${dev##*/}: $links"
  printf '%s\n' "$out" | grep -q '^NVMFD_NAME=' || { printf '%s\n' "$out" | tail -30; fail "${dev##*/}: the rule imported nothing"; }
  grep -q "/dev/disk/by-nvmfd/$NQN/$name" <<<"$links" ||
    { printf '%s\n' "$out" | tail -30; fail "${dev##*/}: no /dev/disk/by-nvmfd/$NQN/$name link"; }
done
ok "both links"

step "data on vm-101-disk-0, then a \"reboot\": disconnect and the boot-time nvme connect-all"
dd if=/dev/urandom of=/tmp/pattern bs=1M count=4 2>/dev/null
dd if=/tmp/pattern of="$D2" bs=1M count=4 oflag=direct 2>/dev/null || fail "writing $D2"
want=$(md5sum < /tmp/pattern)
disconnect "$NQN"
run nvme connect-all
CTRL=$(ctrl_of "$NQN") || fail "nvme connect-all did not restore $NQN from config.json"
D2=$(ns_dev "$NQN" 2) || fail "namespace 2 not back"
out=$(/job/udevadm test --action=add "/sys/class/block/${D2##*/}" 2>&1)
links=$(printf '%s\n' "$out" | grep '^DEVLINKS=')
echo "  | ${D2##*/}: $links"
grep -q "/dev/disk/by-nvmfd/$NQN/vm-101-disk-0" <<<"$links" || fail "not the same name after the reconnect"
got=$(dd if="$D2" bs=1M count=4 iflag=direct 2>/dev/null | md5sum)
[ "$got" = "$want" ] || fail "the data read back differs"
ok "back as ${D2##*/}, the same /dev/disk/by-nvmfd name, 4 MiB read back intact"

step "disconnect"
disconnect "$NQN"
echo "ALL STEPS PASSED"
