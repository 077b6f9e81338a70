# Kernel TLS in the 6.12 TLS guest (its kernel has the tls module): nvmfd and nvmf both run here,
# over 127.0.0.1 inside the guest.
#  1. /job/ktls_check --require-kernel (nvmf-tls's example): kTLS on both sides, one side, a kernel
#     refusing transmit or receive keys, 1 MiB each way and close_notify; a KeyUpdate on a kTLS
#     session ends it by name.
#  2. /job/nvmfd with a secure listener (PORT) and a clear one (CPORT); `nvmf perf --verify` over
#     kernel TLS on both sides (nvmfd's log must say its records are the kernel's), with an
#     OpenSSL-record host (--ktls off), and the same against an nvmfd with --ktls off (UPORT).
#  3. The Linux host (nvme-cli + tlshd, kernel TLS) against nvmfd's kernel TLS: fio crc32c verify.
#  4. BENCH=1: TLS/clear IOPS of `nvmf perf` in this guest, OpenSSL records vs kernel TLS
#     (4 KiB randread QD32 and 128 KiB read QD8, BENCH_S seconds each).
# env: PORT CPORT UPORT NQN HOSTNQN HOSTID PSK FIO_MB BENCH BENCH_S
. /job/lib.sh
. /job/tls-lib.sh
tls_session
ADDR=127.0.0.1
FIO_MB=${FIO_MB:-4}
tls_init

step "kernel TLS checks on this kernel (ktls_check --require-kernel)"
out=$(timeout 120 /job/ktls_check --require-kernel 2>&1)
rc=$?
printf '%s\n' "$out" | sed 's/^/  | /'
[ "$rc" = 0 ] || fail "ktls_check exited with status $rc"
ok "every check passed with the kernel's TLS"

step "nvmfd with a secure listener ($PORT, --ktls auto), a clear one ($CPORT), and one with --ktls off ($UPORT)"
mkdir -p /tmp/k
printf '%s\n' "$PSK" > /tmp/k/key0
chmod 600 /tmp/k/key0
start_nvmfd() {  # name port secure(true|false) [nvmfd args...]
  local name=$1 port=$2 secure=$3; shift 3
  cat > "/tmp/k/$name.json" <<JSON
{"subsystems": [
 {"subsystem": "keyring", "config": [
  {"method": "keyring_file_add_key", "params": {"name": "key0", "path": "/tmp/k/key0"}}]},
 {"subsystem": "bdev", "config": [
  {"method": "bdev_malloc_create", "params": {"name": "Malloc0", "num_blocks": 131072, "block_size": 512}}]},
 {"subsystem": "nvmf", "config": [
  {"method": "nvmf_create_transport", "params": {"trtype": "TCP"}},
  {"method": "nvmf_create_subsystem", "params": {"nqn": "$NQN", "serial_number": "KTLS0001",
     "model_number": "nvmfd ktls", "allow_any_host": false}},
  {"method": "nvmf_subsystem_add_ns", "params": {"nqn": "$NQN", "namespace": {"bdev_name": "Malloc0", "nsid": 1}}},
  {"method": "nvmf_subsystem_add_host", "params": {"nqn": "$NQN", "host": "$HOSTNQN", "psk": "key0"}},
  {"method": "nvmf_subsystem_add_listener", "params": {"nqn": "$NQN", "secure_channel": $secure,
     "listen_address": {"trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1", "trsvcid": "$port"}}}]}]}
JSON
  RUST_LOG=info /job/nvmfd -c "/tmp/k/$name.json" -r "/tmp/k/$name.sock" "$@" > "/job/$name.log" 2>&1 &
  NVMFD_PIDS+=($!)
  local i
  for i in $(seq 1 100); do
    [ -S "/tmp/k/$name.sock" ] && grep -q "listening" "/job/$name.log" && return 0
    sleep 0.1
  done
  sed 's/^/  | /' "/job/$name.log"
  fail "nvmfd $name did not start"
}
NVMFD_PIDS=()
start_nvmfd nvmfd "$PORT" true
start_nvmfd clear "$CPORT" false
start_nvmfd user "$UPORT" true --ktls off
ok "three nvmfd running"

trid() { echo "trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:$1 subnqn:$NQN"; }
perf() {  # port [nvmf perf args...]
  local port=$1; shift
  timeout 60 /job/nvmf perf -r "$(trid "$port")" --hostnqn "$HOSTNQN" "$@" 2>&1
}

step "nvmf perf --verify over kernel TLS on both sides"
for args in "-w randrw -o 4096 -q 16" "-w randrw -o 131072 -q 4"; do
  # shellcheck disable=SC2086
  out=$(perf "$PORT" --tls-key /tmp/k/key0 $args -t 2 --verify) || { printf '%s\n' "$out" | sed 's/^/  | /'; fail "perf $args over kTLS failed"; }
  printf '%s\n' "$out" | tail -3 | sed 's/^/  | /'
done
grep -q "records by kernel TLS" /job/nvmfd.log || { sed 's/^/  | /' /job/nvmfd.log; fail "nvmfd's sessions are not kernel TLS"; }
if grep -q "kernel TLS not used" /job/nvmfd.log; then sed 's/^/  | /' /job/nvmfd.log; fail "nvmfd fell back to OpenSSL records"; fi
ok "verified; nvmfd: $(grep -o 'records by kernel TLS' /job/nvmfd.log | head -1)"

step "an OpenSSL-record host (--ktls off) against kernel-TLS nvmfd, and a kernel-TLS host against OpenSSL-record nvmfd"
out=$(perf "$PORT" --tls-key /tmp/k/key0 --ktls off -w randrw -o 16384 -q 8 -t 2 --verify) || { printf '%s\n' "$out" | sed 's/^/  | /'; fail "OpenSSL host vs kTLS nvmfd failed"; }
out=$(perf "$UPORT" --tls-key /tmp/k/key0 -w randrw -o 16384 -q 8 -t 2 --verify) || { printf '%s\n' "$out" | sed 's/^/  | /'; fail "kTLS host vs OpenSSL nvmfd failed"; }
grep -q "records by OpenSSL" /job/user.log || { sed 's/^/  | /' /job/user.log; fail "nvmfd --ktls off did not use OpenSSL records"; }
ok "both verified"

step "the Linux host (tlshd, kernel TLS) against nvmfd's kernel TLS"
tls_clear
QUIET_RUN=1 tls_insert "$PSK" "$NQN" 0
QUIET_RUN=1 tls_insert "$PSK" "$NQN" 1
dmesg_mark
tls_connect "$NQN" --tls || { tls_log; sed 's/^/  | /' /job/nvmfd.log | tail -20; fail "nvme connect --tls failed"; }
D=$(ns_dev "$NQN" 1) || fail "no block device for namespace 1"
fio_suite ktls "$D" "$FIO_MB"
timeout 30 "$T/nvme" disconnect -n "$NQN" | sed 's/^/  | /'
wait_no_ctrl "$NQN" || fail "controller still present after disconnect"
dmesg_clean "during the kernel TLS session"
n=$(grep -c "records by kernel TLS" /job/nvmfd.log)
ok "fio verified; nvmfd sessions with kernel TLS so far: $n"

if [ "${BENCH:-0}" = 1 ]; then
  S=${BENCH_S:-5}
  step "TLS/clear in this guest ($(nproc) vCPU), ${S} s per run"
  iops() { printf '%s\n' "$1" | awk '/^total:/ { print $2; exit }'; }
  for w in "randread 4096 32" "read 131072 8"; do
    set -- $w
    c=$(iops "$(perf "$CPORT" -w "$1" -o "$2" -q "$3" -t "$S")")
    u=$(iops "$(perf "$UPORT" --tls-key /tmp/k/key0 --ktls off -w "$1" -o "$2" -q "$3" -t "$S")")
    k=$(iops "$(perf "$PORT" --tls-key /tmp/k/key0 -w "$1" -o "$2" -q "$3" -t "$S")")
    echo "BENCH $1 $2 QD$3: clear $c IOPS, TLS OpenSSL records $u, TLS kernel $k" \
      "(OpenSSL/clear $(awk -v a="$u" -v b="$c" 'BEGIN { printf "%.2f", a / b }')," \
      "kernel/clear $(awk -v a="$k" -v b="$c" 'BEGIN { printf "%.2f", a / b }'))"
  done
  ok "measured"
fi

kill "${NVMFD_PIDS[@]}" 2>/dev/null
wait "${NVMFD_PIDS[@]}" 2>/dev/null
echo "ktls: all steps passed"
