#!/bin/bash
# scripts/service-test.sh - the packaged nvmfd.service under a real systemd: a clean Debian 12
# (the debootstrap minbase that scripts/package-test.sh caches, plus systemd and dbus) with
# both packages installed by apt, booted in a container (systemd-nspawn --boot; the host's
# network, so the host side reaches its listener on 127.0.0.1), checked from outside:
#   1. the unit starts by itself at boot and is active only once nvmfd said READY=1
#      (Type=notify), with a STATUS= text;
#   2. it serves: `nvmf perf --verify` from the host against the subsystem in the packaged
#      configuration file, and the Linux kernel host of a testbed guest (nvme connect, fio
#      crc32c verify, disconnect; NVMFD_SERVICE_TEST_NO_GUEST=1 skips the guest);
#   3. journald: a refused Connect is found with `journalctl -u nvmfd HOSTNQN=...`;
#   4. `systemctl reload nvmfd` applies an edited /etc/nvmfd/nvmfd.json live (a second
#      namespace appears, same main PID) while `nvmf perf --verify` keeps running, 0 errors;
#   5. the watchdog: with a drop-in running the debug build with NVMFD_DEBUG_HANG_REACTOR=0
#      (reactor 0 stops answering, the rest of the process is fine) and WatchdogSec=4s,
#      systemd kills it for the missed watchdog and Restart=on-failure starts a new one;
#   6. `systemctl stop nvmfd` ends it cleanly (Result=success).
# Needs root, systemd-nspawn (Debian's systemd-container), nsenter, debootstrap and network
# access to Debian's mirror. scripts/test.sh runs it with --profile dev (and the testbed
# prepared for its kernel host); without, it checks the release packages.
# usage: scripts/service-test.sh [--no-build] [--profile dev]
#   --profile dev: the packages of the debug build (scripts/package.sh --profile dev), as
#   scripts/test.sh runs it
set -euo pipefail
cd "$(dirname "$0")/.."
root_dir=$(pwd)

say() { echo "service-test: $*"; }
fail() { echo "service-test: FAIL: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || fail "needs root (chroot, systemd-nspawn)"
need=()
command -v systemd-nspawn >/dev/null || need+=(systemd-container)
command -v debootstrap >/dev/null || need+=(debootstrap)
if [ ${#need[@]} -gt 0 ]; then
  say "installing ${need[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
build=1
profile=release
while [ $# -gt 0 ]; do
  case "$1" in
    --no-build) build=0; shift ;;
    --profile) profile=${2:?--profile needs dev or release}; shift 2 ;;
    *) fail "unknown argument $1 (usage: scripts/service-test.sh [--no-build] [--profile dev])" ;;
  esac
done
if [ "$build" = 1 ]; then
  scripts/package.sh --profile "$profile"
fi
# the debug build has the reactor-hang hook (step 5); the host side runs this tree's nvmf
cargo build -q -p nvmfd -p nvmf-host
deb_d=$(ls target/debian/nvmfd_*_amd64.deb 2>/dev/null | sort | tail -1)
deb_h=$(ls target/debian/nvmf_*_amd64.deb 2>/dev/null | sort | tail -1)
[ -n "$deb_d" ] && [ -n "$deb_h" ] || fail "no packages in target/debian: run scripts/package.sh (or drop --no-build)"
nvmf=$root_dir/target/debug/nvmf

. scripts/lib/bookworm-root.sh
work=$root_dir/target/servicetest
nspawn_pid=
leader=
cleanup() {
  if [ -n "$nspawn_pid" ] && kill -0 "$nspawn_pid" 2>/dev/null; then
    [ -z "$leader" ] || nsenter -t "$leader" -m -u -i -p -- systemctl poweroff >/dev/null 2>&1 || true
    for _ in $(seq 30); do kill -0 "$nspawn_pid" 2>/dev/null || break; sleep 1; done
    kill -TERM "$nspawn_pid" 2>/dev/null || true
    sleep 2
    kill -KILL "$nspawn_pid" 2>/dev/null || true
  fi
  root_umount
}
trap cleanup EXIT
root_unpack "$work"

# ---- install, in a chroot (no service starts there) ----------------------------------
root_chroot
mkdir -p "$sys/pkgs"
cp "$deb_d" "$deb_h" "$sys/pkgs/"
say "install systemd, dbus, $(basename "$deb_d"), $(basename "$deb_h")"
in_root apt-get update -qq >/dev/null
in_root apt-get install -y -qq --no-install-recommends systemd systemd-sysv dbus \
  "/pkgs/$(basename "$deb_d")" "/pkgs/$(basename "$deb_h")" >/dev/null
rm -f "$sys/usr/sbin/policy-rc.d"
root_umount

# What the unit serves: one RAM namespace on a free port of the host's loopback.
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
nqn=nqn.2016-06.io.nvmfd:service-test
write_config() { # $1: namespaces (1 or 2)
  local ns2=""
  if [ "$1" = 2 ]; then
    ns2=',{"method":"nvmf_subsystem_add_ns","params":{"nqn":"'$nqn'","namespace":{"nsid":2,"bdev_name":"M1"}}}'
  fi
  cat > "$sys/etc/nvmfd/nvmfd.json" <<EOF
{"nvmfd": {"format": 1},
 "subsystems": [
  {"subsystem": "bdev", "config": [
    {"method": "bdev_malloc_create", "params": {"name": "M0", "num_blocks": 131072, "block_size": 512}},
    {"method": "bdev_malloc_create", "params": {"name": "M1", "num_blocks": 32768, "block_size": 512}}]},
  {"subsystem": "nvmf", "config": [
    {"method": "nvmf_create_transport", "params": {"trtype": "TCP"}},
    {"method": "nvmf_create_subsystem", "params": {"nqn": "$nqn", "allow_any_host": true}},
    {"method": "nvmf_subsystem_add_ns", "params": {"nqn": "$nqn", "namespace": {"nsid": 1, "bdev_name": "M0"}}}$ns2,
    {"method": "nvmf_subsystem_add_listener", "params": {"nqn": "$nqn",
      "listen_address": {"trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1", "trsvcid": "$port"}}}]}]}
EOF
}
write_config 1
echo 'NVMFD_OPTS="-m 0"' > "$sys/etc/default/nvmfd"
install -m 755 target/debug/nvmfd "$sys/usr/local/sbin/nvmfd-debug"

# ---- boot ------------------------------------------------------------------------------
say "boot the container (systemd-nspawn --boot)"
systemd-nspawn --register=no --keep-unit --quiet -D "$sys" --boot --machine nvmfd-svc-test \
  > "$work/console.log" 2>&1 < /dev/null &
nspawn_pid=$!
# the container's PID 1: systemd-nspawn's child named systemd
for _ in $(seq 100); do
  for c in $(ps -o pid= --ppid "$nspawn_pid" 2>/dev/null || true); do
    if [ "$(cat /proc/"$c"/comm 2>/dev/null)" = systemd ]; then leader=$c; fi
  done
  [ -z "$leader" ] || break
  sleep 0.2
done
[ -n "$leader" ] || { cat "$work/console.log"; fail "the container's systemd did not start"; }
ct() { nsenter -t "$leader" -m -u -i -p -- /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin "$@"; }
show() { ct systemctl show nvmfd -p "$1" --value; }
state=
for _ in $(seq 120); do
  state=$(ct systemctl is-active nvmfd 2>/dev/null || true)
  case "$state" in active|failed) break ;; esac
  sleep 0.5
done
if [ "$state" != active ]; then
  ct journalctl -u nvmfd --no-pager | tail -40 || true
  fail "nvmfd.service is $state after boot"
fi
[ "$(show Type)" = notify ] || fail "the unit is not Type=notify"
status_text=$(show StatusText)
[ -n "$status_text" ] || fail "no STATUS= text"
pid0=$(show MainPID)
say "1. nvmfd.service active at boot (MainPID $pid0, status \"$status_text\")"

trid="trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:$port subnqn:$nqn"
perf() { "$nvmf" perf -r "$trid" --no-progress --verify -q 8 -o 4096 -w randrw -M 50 "$@"; }
out=$(perf -t 2 2>&1) || { echo "$out"; fail "nvmf perf --verify against the service failed"; }
say "2. served: nvmf perf --verify 4 KiB randrw, 2 s, passed ($(echo "$out" | grep -c . ) lines of report)"

# the Linux kernel host: a testbed guest (testbed/nvmfd-testbed, prepared by scripts/test.sh)
if [ "${NVMFD_SERVICE_TEST_NO_GUEST:-0}" != 1 ]; then
  gout=$work/guest
  NVMFD_TESTBED_QUIET=1 timeout 400 testbed/nvmfd-testbed run --timeout 300 --out "$gout" \
    --host-port "$port" --env "PORT=$port" --env "NQN=$nqn" \
    --put tests/interop/lib.sh tests/interop/service-host.sh > "$work/guest.log" 2>&1 || true
  grep -q "ALL STEPS PASSED" "$gout/stdout" 2>/dev/null ||
    { cat "$work/guest.log"; cat "$gout/stdout" 2>/dev/null; fail "the kernel host in a guest was not served (log above)"; }
  say "2b. served a Linux 6.1 kernel host (testbed guest): connect, fio crc32c verify 4k randrw + 128k seq, disconnect"
fi

host=nqn.2014-08.org.nvmexpress:uuid:5e7f1ce0-0000-4000-8000-00000000a11e
"$nvmf" identify -r "trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:$port subnqn:nqn.2016-06.io.nvmfd:nothing-here hostnqn:$host" \
  >/dev/null 2>&1 && fail "identify of an unknown subsystem succeeded"
found=0
for _ in $(seq 20); do
  n=$(ct journalctl -u nvmfd "HOSTNQN=$host" --no-pager -q -o cat | wc -l)
  [ "$n" -gt 0 ] && { found=1; break; }
  sleep 0.5
done
[ "$found" = 1 ] || { ct journalctl -u nvmfd -o verbose --no-pager | tail -40; fail "journalctl HOSTNQN=$host found nothing"; }
say "3. journal: $(ct journalctl -u nvmfd "HOSTNQN=$host" --no-pager -q -o cat | head -1)"

perf -t 8 > "$work/perf-reload.log" 2>&1 &
perf_pid=$!
sleep 2
write_config 2
ct systemctl reload nvmfd || fail "systemctl reload failed"
nsids=$(ct nvmf rpc -s /run/nvmfd/nvmfd.sock nvmf_get_subsystems | grep -c '"nsid"' || true)
[ "$nsids" -ge 2 ] || { ct nvmf rpc -s /run/nvmfd/nvmfd.sock nvmf_get_subsystems; fail "the reload did not add namespace 2"; }
[ "$(show MainPID)" = "$pid0" ] || fail "the reload restarted nvmfd"
wait "$perf_pid" || { cat "$work/perf-reload.log"; fail "nvmf perf --verify failed across the reload"; }
say "4. reload: namespace 2 added live, MainPID unchanged, perf --verify across it passed"

mkdir -p "$sys/etc/systemd/system/nvmfd.service.d"
exec_start=$(sed -n 's/^ExecStart=//p' "$sys/lib/systemd/system/nvmfd.service" | sed 's|/usr/sbin/nvmfd|/usr/local/sbin/nvmfd-debug|')
cat > "$sys/etc/systemd/system/nvmfd.service.d/hang.conf" <<EOF
[Service]
ExecStart=
ExecStart=$exec_start
Environment=NVMFD_DEBUG_HANG_REACTOR=0
WatchdogSec=4s
TimeoutAbortSec=5s
TimeoutStopSec=5s
EOF
ct systemctl daemon-reload
ct systemctl restart nvmfd
pid1=$(show MainPID)
restarts0=$(show NRestarts)
t0=$(date +%s)
restarted=0
for _ in $(seq 120); do
  pid=$(show MainPID)
  if [ "$pid" != "$pid1" ] && [ "$pid" != 0 ] && [ "$(show NRestarts)" -gt "$restarts0" ]; then
    restarted=1; break
  fi
  sleep 0.5
done
[ "$restarted" = 1 ] || { ct journalctl -u nvmfd --no-pager | tail -30; fail "no restart after the reactor hung"; }
log=$(ct journalctl -u nvmfd --no-pager -q)
grep -q "Watchdog timeout" <<<"$log" || fail "the journal does not say the watchdog fired"
grep -q "did not answer the watchdog's ping" <<<"$log" || fail "nvmfd did not log the silent reactor"
say "5. watchdog: reactor 0 hung, systemd restarted nvmfd $(( $(date +%s) - t0 )) s later (PID $pid1 -> $pid)"
rm -f "$sys/etc/systemd/system/nvmfd.service.d/hang.conf"
ct systemctl daemon-reload
ct systemctl restart nvmfd
[ "$(ct systemctl is-active nvmfd)" = active ] || fail "nvmfd not active again without the drop-in"

ct systemctl stop nvmfd
[ "$(show Result)" = success ] || fail "stop: Result=$(show Result)"
[ "$(ct systemctl is-active nvmfd || true)" = inactive ] || fail "still active after stop"
say "6. stopped cleanly (Result=success)"
say "PASS"
