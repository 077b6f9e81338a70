# Guest-side helpers for the interop scenarios (sourced as /job/lib.sh inside a testbed guest).
#
# Conventions: every step prints "== STEP ..." and "ok: ..." lines; the first failure prints
# "FAIL: <what>", the controller/subsystem state and the guest's new dmesg lines, then exits 1.
# The target is the host's 127.0.0.1:$PORT, reached as 10.0.2.2:$PORT.
# Host checkpoints (CHECKPOINTS=1): the guest writes /job/cp-NAME.req and waits for the host
# driver to answer in /job/cp-NAME.resp ("ok ..." or anything else = failure).

exec 2>&1
set -u
ADDR=10.0.2.2
PORT=${PORT:?PORT not set}
CHECKPOINTS=${CHECKPOINTS:-0}
DMESG_MARK=0

uptime_s() { cut -d' ' -f1 /proc/uptime; }
# sys_rd VAR FILE: the first line of FILE (a sysfs attribute) into VAR, "" when unreadable,
# without starting a process (under TCG a fork and exec costs milliseconds; the sysfs scans
# here and in mp-lib.sh run in loops)
sys_rd() {
  local -n _sys_rd_v=$1
  _sys_rd_v=
  { IFS= read -r _sys_rd_v < "$2"; } 2>/dev/null || true
}
STEP_T0=$(uptime_s)
step() { STEP_T0=$(uptime_s); echo "== STEP $*"; }
ok() { echo "ok: $* ($(awk -v a="$STEP_T0" -v b="$(uptime_s)" 'BEGIN { printf "%.1f s", b - a }'))"; }
info() { echo "info: $*"; }

fail() {
  echo "FAIL: $*"
  echo "---- nvme list-subsys ----"; nvme list-subsys 2>&1 | head -n 30
  echo "---- /sys/class/nvme ----"
  for c in /sys/class/nvme/nvme*; do
    [ -e "$c" ] && echo "${c##*/}: $(cat "$c/state" 2>/dev/null) cntlid=$(cat "$c/cntlid" 2>/dev/null) $(cat "$c/subsysnqn" 2>/dev/null)"
  done
  echo "---- guest dmesg since the last mark ----"; dmesg | tail -n "+$((DMESG_MARK + 1))" | tail -n 80
  exit 1
}

# run a command, echo it and its output; fail if it fails
run() {
  local out rc
  echo "+ $*"
  out=$("$@" 2>&1); rc=$?
  [ -n "$out" ] && [ "${QUIET_RUN:-0}" = 0 ] && printf '%s\n' "$out" | sed 's/^/  | /'
  [ "$rc" = 0 ] || [ "${QUIET_RUN:-0}" = 0 ] || printf '%s\n' "$out" | sed 's/^/  | /'
  [ "$rc" = 0 ] || fail "'$*' exited with status $rc"
  LAST_OUT=$out
}

dmesg_mark() { DMESG_MARK=$(dmesg | wc -l); }
# fail if the kernel logged trouble (resets, I/O errors, keep-alive failures) since the mark.
# Not trouble: the host cancelling its own Keep Alive while it removes a controller (`nvme
# disconnect`): after "nvmeN: Removing ctrl", 6.12 may log "nvmeN: long keepalive RTT
# (4294...)" (a request never started) and "failed nvme_keep_alive_end_io error=N" for it
# (until a new controller takes that name).
dmesg_clean() {
  local bad
  bad=$(dmesg | tail -n "+$((DMESG_MARK + 1))" |
        awk '/: new ctrl:/ { split($0, a, "nvme nvme"); split(a[2], b, ":"); delete gone["nvme" b[1]] }
             /: Removing ctrl/ { split($0, a, "nvme nvme"); split(a[2], b, ":"); gone["nvme" b[1]] = 1; print; next }
             /keep.?alive/ { if (match($0, /nvme nvme[0-9]+:/)) { c = substr($0, RSTART + 5, RLENGTH - 6); if (c in gone) next } }
             { print }' |
        grep -iE 'error recovery|I/O error|reconnect|keep.?alive|timeout|reset|failed|digest|invalid|mismatch|BUG|WARNING|Call Trace' || true)
  [ -z "$bad" ] || fail "kernel reported problems $1:"$'\n'"$bad"
}

# controller device (nvmeX) of subsystem $1, waiting up to 10 s for it to be live
ctrl_of() {
  local i c v
  for i in $(seq 100); do
    for c in /sys/class/nvme/nvme*; do
      sys_rd v "$c/subsysnqn"; [ "$v" = "$1" ] || continue
      sys_rd v "$c/state"; [ "$v" = live ] && { echo "${c##*/}"; return 0; }
    done
    sleep 0.1
  done
  return 1
}

# block device of namespace $2 of subsystem $1 (/dev/nvmeXnY), waiting up to 10 s
ns_dev() {
  local i b v
  for i in $(seq 100); do
    for b in /sys/block/nvme*; do
      [ -b "/dev/${b##*/}" ] || continue        # skip hidden per-path disks (nvmeXcYnZ)
      sys_rd v "$b/device/subsysnqn"; [ "$v" = "$1" ] || continue
      sys_rd v "$b/nsid"; [ "$v" = "$2" ] && { echo "/dev/${b##*/}"; return 0; }
    done
    sleep 0.1
  done
  return 1
}

# wait (up to 10 s) until no controller of subsystem $1 is left
wait_no_ctrl() {
  local i c v found
  for i in $(seq 100); do
    found=""
    for c in /sys/class/nvme/nvme*; do
      sys_rd v "$c/subsysnqn"; [ "$v" = "$1" ] && found=${c##*/}
    done
    [ -z "$found" ] && return 0
    sleep 0.1
  done
  return 1
}

connect() {  # nqn [extra nvme connect args...]
  local nqn=$1; shift
  run nvme connect -t tcp -a "$ADDR" -s "$PORT" -n "$nqn" "$@"
  CTRL=$(ctrl_of "$nqn") || fail "no live controller for $nqn after nvme connect"
}

disconnect() {  # nqn
  run nvme disconnect -n "$1"
  wait_no_ctrl "$1" || fail "controller of $1 still present 10 s after nvme disconnect"
}

# NVMe/RDMA with the kernel host (nvme-rdma): discover $NQN at $TARGET_IP:$PORT (listed with
# trtype rdma), connect to it; sets CTRL (transport rdma) and D (namespace 1's block device).
# H holds the host identity arguments; CONNECT_EXTRA more nvme connect options (word-split).
# Marks dmesg first (see rdma_disconnect).
rdma_discover_connect() {
  modprobe nvme-rdma || fail "modprobe nvme-rdma"
  dmesg_mark
  step "nvme discover -t rdma -a $TARGET_IP -s $PORT"
  run nvme discover -t rdma -a "$TARGET_IP" -s "$PORT" "${H[@]}"
  grep -q "subnqn: *$NQN" <<<"$LAST_OUT" || fail "the discovery log does not list $NQN"
  grep -q 'trtype: *rdma' <<<"$LAST_OUT" || fail "the discovery log entry is not trtype rdma"
  ok "discovery log lists $NQN over rdma"
  step "nvme connect -t rdma $NQN ${CONNECT_EXTRA:-}"
  # shellcheck disable=SC2086 # CONNECT_EXTRA: extra options, word-split on purpose
  run nvme connect -t rdma -a "$TARGET_IP" -s "$PORT" -n "$NQN" "${H[@]}" ${CONNECT_EXTRA:-}
  CTRL=$(ctrl_of "$NQN") || fail "no live controller for $NQN after nvme connect"
  [ "$(cat "/sys/class/nvme/$CTRL/transport")" = rdma ] || fail "$CTRL transport is not rdma"
  D=$(ns_dev "$NQN" 1) || fail "no block device for namespace 1"
}

# the end of an NVMe/RDMA kernel-host run: disconnect $NQN, nothing bad in dmesg since the mark
rdma_disconnect() {
  step "disconnect"
  disconnect "$NQN"
  dmesg_clean "during the rdma run"
  ok "disconnected"
}

# fio with crc32c verification of everything written; fails on a non-zero exit status,
# a non-zero error field, or less data moved than expected.
#   fio_verify NAME DEV EXPECT_WRITE_KB fio-args...
fio_verify() {
  local name=$1 dev=$2 want_wkb=$3 out rc line err rkb wkb riops wiops; shift 3
  echo "+ fio $name on $dev: $*"
  out=$(fio --name="$name" --filename="$dev" --direct=1 --ioengine=libaio \
            --verify=crc32c --do_verify=1 --verify_fatal=1 \
            --output-format=terse --terse-version=3 "$@" 2>&1); rc=$?
  line=$(printf '%s\n' "$out" | grep '^3;' | tail -n 1)
  printf '%s\n' "$out" | grep -v '^3;' | sed 's/^/  | /'
  [ "$rc" = 0 ] || fail "fio $name exited with status $rc"
  [ -n "$line" ] || fail "fio $name printed no terse result"
  err=$(echo "$line" | cut -d';' -f5); rkb=$(echo "$line" | cut -d';' -f6)
  riops=$(echo "$line" | cut -d';' -f8); wkb=$(echo "$line" | cut -d';' -f47)
  wiops=$(echo "$line" | cut -d';' -f49)
  echo "  fio $name: error=$err read_kb=$rkb write_kb=$wkb read_iops=$riops write_iops=$wiops"
  [ "$err" = 0 ] || fail "fio $name reported error $err"
  [ "$wkb" -ge "$want_wkb" ] || fail "fio $name wrote $wkb KiB, expected at least $want_wkb KiB"
  # every written byte is read back for verification
  [ "$rkb" -ge "$wkb" ] || fail "fio $name read $rkb KiB < written $wkb KiB: not everything was verified"
}

# the two fio workloads of the interop suite on DEV, each over SIZE_MB MiB from offset 0
fio_suite() {  # tag dev size_mb
  local tag=$1 dev=$2 mb=$3
  # 4k random 75/25 read/write: every written block is verified at the end
  fio_verify "$tag-randrw-4k" "$dev" 1 --rw=randrw --rwmixread=75 --bs=4k --iodepth=16 --size="${mb}m"
  # 128k sequential: write the whole range, then read it all back and verify
  fio_verify "$tag-seq-128k" "$dev" $((mb * 1024)) --rw=write --bs=128k --iodepth=8 --size="${mb}m"
}

checkpoint() {  # name [detail]  - ask the host driver to check something; fail unless it says ok
  local name=$1 i resp
  [ "$CHECKPOINTS" = 1 ] || { info "checkpoint $name skipped (no host driver)"; return 0; }
  # written whole, then renamed: the host polls the directory and must never read a
  # request that is still empty
  echo "${2:-}" > "/job/cp-$name.req.part" && mv "/job/cp-$name.req.part" "/job/cp-$name.req"
  for i in $(seq 600); do
    if [ -f "/job/cp-$name.resp" ]; then
      resp=$(cat "/job/cp-$name.resp")
      echo "host checkpoint $name: $resp"
      case $resp in ok*) return 0 ;; *) fail "host checkpoint $name: $resp" ;; esac
    fi
    sleep 0.1
  done
  fail "host checkpoint $name: no answer within 60 s"
}
