# scripts/service-test.sh's kernel host: the Linux 6.1 NVMe/TCP host of a testbed guest
# against the packaged nvmfd.service running under systemd in a container on this machine
# (it shares the machine's network, so the guest reaches its listener as 10.0.2.2:PORT).
# env: PORT NQN (one namespace)
. /job/lib.sh

step "connect to the packaged nvmfd.service"
connect "$NQN"
D=$(ns_dev "$NQN" 1) || fail "namespace 1 not there"
ok "controller $CTRL, namespace 1 is $D"

step "fio crc32c verify through the kernel host"
fio_suite svc "$D" 16
ok "verified"

step "disconnect"
disconnect "$NQN"
echo "ALL STEPS PASSED"
