# Interop scenario: readable device names for nvmfd's namespaces on the Linux kernel host.
# nvmfd puts each namespace's bdev name in Identify Namespace's vendor-specific area;
# `nvmf udev-name` (shipped as /job/nvmf) reads it through the disk, and nvmf's udev rule
# (packaging/udev/70-nvmfd.rules, given base64-encoded in RULES_B64) turns it into
# /dev/disk/by-nvmfd/SUBSYSTEM-NQN/NAME. The guest runs no udevd: the rule is run by
# `udevadm test` (this machine's udevadm, systemd 252, shipped as /job/udevadm), which
# executes its IMPORT{program} and prints the links it would make.
#
# env: PORT NQN (two namespaces: 1 = bdev Malloc0, 2 = bdev vm-101-disk-0), RULES_B64
. /job/lib.sh
NVMF=/job/nvmf

step "connect (native multipath head devices)"
connect "$NQN"
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

step "disconnect"
disconnect "$NQN"
echo "ALL STEPS PASSED"
