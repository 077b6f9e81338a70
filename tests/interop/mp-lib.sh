# Guest-side multipath helpers (sourced as /job/mp-lib.sh after /job/lib.sh): several paths
# (host ports) to one subsystem through the kernel's native NVMe multipath, a background fio
# crc32c verify loop on the multipath head device, and the pause it saw.
#
# env: NQN HOSTNQN HOSTID, PORTS (space separated host ports, one path each)
#
#   mp_connect              nvme connect to every port in $PORTS (same host NQN/ID), fast
#                           reconnect (1 s) and a long controller-loss timeout
#   mp_wait_live N [S]      wait up to S s (30) for N live paths (controllers) of $NQN
#   mp_show                 nvme list-subsys + each path's state
#   mp_iopolicy POLICY      set the subsystem's iopolicy (round-robin, numa, queue-depth)
#   mp_path_ios PORT        I/Os completed through the path of host port PORT
#   mp_ana_of PORT NSID     a namespace's ANA state through a live path ("none" otherwise)
#   mp_wait_owner NSID "PORTS" S   wait until exactly one live path, one of PORTS, is optimized
#   mp_show_ana N           ANA states of namespaces 1..N through every port
#   io_start DEV / io_stop  background fio verify loop on DEV; io_stop waits for it and fails
#                           the scenario unless every fio run passed; prints PAUSE_MS=
#                           (the longest I/O latency fio saw, read or write, in ms)
MP_H=(--hostnqn="$HOSTNQN" --hostid="$HOSTID")

# The helpers below read sysfs without starting a process (sys_rd, lib.sh): under TCG, with fio running, each
# fork and exec costs milliseconds, and the old helpers (cat, readlink, basename and tr for
# every controller and path device) spent 0.5-1 s on one ANA state: mp_show_ana 7 took
# 10-20 s and the gateway scenarios' steps most of their time.

# the subsystem directory /sys/class/nvme-subsystem/nvme-subsysN of $NQN
mp_subsys() {
  local s v
  for s in /sys/class/nvme-subsystem/nvme-subsys*; do
    sys_rd v "$s/subsysnqn"
    [ "$v" = "$NQN" ] && { echo "$s"; return 0; }
  done
  return 1
}

mp_connect() {
  local p
  for p in $PORTS; do
    run nvme connect -t tcp -a "$ADDR" -s "$p" -n "$NQN" "${MP_H[@]}" \
        --reconnect-delay=1 --ctrl-loss-tmo=600
  done
}

# controller (nvmeX) whose transport address has trsvcid=PORT, any state, into MP_C (no
# subshell)
_mp_ctrl() {
  local c v
  for c in /sys/class/nvme/nvme*; do
    sys_rd v "$c/subsysnqn"
    [ "$v" = "$NQN" ] || continue
    sys_rd v "$c/address"
    case ",${v// /}," in
      *",trsvcid=$1,"*) MP_C=${c##*/}; return 0 ;;
    esac
  done
  return 1
}

# the path device of namespace $2 through controller $1 (nvmeY) into MP_B: the kernel names
# it nvme<subsystem>c<Y>n<head> (/sys/block/nvmeXcYnZ)
_mp_path() {
  local b v y=${1#nvme}
  for b in /sys/block/nvme*c"$y"n*; do
    [[ ${b##*/} =~ ^nvme[0-9]+c${y}n[0-9]+$ ]] || continue
    sys_rd v "$b/nsid"
    [ "$v" = "$2" ] && { MP_B=$b; return 0; }
  done
  return 1
}

mp_live_count() {
  local c v w n=0
  for c in /sys/class/nvme/nvme*; do
    sys_rd v "$c/subsysnqn"; sys_rd w "$c/state"
    [ "$v" = "$NQN" ] && [ "$w" = live ] && n=$((n + 1))
  done
  echo "$n"
}

mp_wait_live() {  # n [seconds]
  local i
  for i in $(seq $((${2:-30} * 10))); do
    [ "$(mp_live_count)" -ge "$1" ] && return 0
    sleep 0.1
  done
  return 1
}

mp_show() {
  local c
  nvme list-subsys 2>&1 | sed 's/^/  | /'
  for c in /sys/class/nvme/nvme*; do
    [ "$(cat "$c/subsysnqn" 2>/dev/null)" = "$NQN" ] || continue
    echo "  ${c##*/}: $(cat "$c/state") cntlid=$(cat "$c/cntlid") $(cat "$c/address")"
  done
}

mp_iopolicy() {
  local s
  s=$(mp_subsys) || fail "no nvme-subsystem for $NQN"
  echo "$1" > "$s/iopolicy" || fail "cannot set iopolicy $1"
  info "iopolicy $(cat "$s/iopolicy")"
}

mp_path_ios() {  # port -> reads+writes completed through that path's first namespace (nvmeXcYn1)
  local b a r
  _mp_ctrl "$1" || { echo 0; return; }
  for b in /sys/block/nvme*c"${MP_C#nvme}"n1; do
    [ -e "$b/stat" ] || continue
    read -r a _ _ _ r _ < "$b/stat"
    echo $((a + r)); return
  done
  echo 0
}

# ana_state of namespace $2 through the path of host port $1 ("none" without a live one: a
# dead controller's path keeps the last state it read)
_mp_ana() {  # sets MP_ANA
  local v
  MP_ANA=none
  _mp_ctrl "$1" || return 0
  sys_rd v "/sys/class/nvme/$MP_C/state"
  [ "$v" = live ] || return 0
  _mp_path "$MP_C" "$2" || return 0
  sys_rd MP_ANA "$MP_B/ana_state"
}
mp_ana_of() { _mp_ana "$1" "$2"; echo "$MP_ANA"; }

# wait up to $3 s until namespace $1 is optimized through exactly one live path, one of the
# ports in $2 (space separated)
mp_wait_owner() {
  local i p n
  for i in $(seq $(($3 * 10))); do
    n=0
    for p in $PORTS; do
      _mp_ana "$p" "$1"
      if [ "$MP_ANA" = optimized ]; then
        case " $2 " in *" $p "*) n=$((n + 1)) ;; *) n=99 ;; esac
      fi
    done
    [ "$n" = 1 ] && return 0
    sleep 0.1
  done
  return 1
}

# each of namespaces 1..$1's ANA state through every port
mp_show_ana() {
  local p n line
  for n in $(seq "$1"); do
    line="  namespace $n: "
    for p in $PORTS; do _mp_ana "$p" "$n"; line+="$p=$MP_ANA "; done
    echo "$line"
  done
}

# one fio crc32c verify run after another on $1 (one device, or several separated by spaces:
# one fio job each, run together) until /tmp/io.stop appears; each run writes and then
# verifies IO_MB MiB (default 4) per device.  Results in /tmp/io.log, one terse line per job.
io_loop() {
  local devs=$1 n=0 out rc lines d
  local -a jobs
  : > /tmp/io.log
  while [ ! -e /tmp/io.stop ]; do
    n=$((n + 1))
    jobs=()
    for d in $devs; do jobs+=(--name="mp$n-${d##*/}" --filename="$d"); done
    out=$(fio --direct=1 --ioengine=libaio --rw=randrw \
              --rwmixread=50 --bs=4k --iodepth=8 --size="${IO_MB:-4}m" --offset="$(( (n % 4) * ${IO_MB:-4} ))m" \
              --verify=crc32c --do_verify=1 --verify_fatal=1 \
              --output-format=terse --terse-version=3 "${jobs[@]}" 2>&1); rc=$?
    lines=$(printf '%s\n' "$out" | grep '^3;')
    if [ "$rc" != 0 ] || [ -z "$lines" ]; then
      { echo "run $n: fio status $rc"; printf '%s\n' "$out" | tail -n 20; } >> /tmp/io.fail
      break
    fi
    printf '%s\n' "$lines" >> /tmp/io.log
  done
  echo done > /tmp/io.done
}

io_start() {
  rm -f /tmp/io.stop /tmp/io.done /tmp/io.fail
  io_loop "$1" > /dev/null 2>&1 &
  IO_PID=$!
}

io_alive() { [ ! -e /tmp/io.done ]; }

# io_stop [PREFIX]: ends the loop and checks every run; prints ${PREFIX}PAUSE_MS (the longest
# I/O) and ${PREFIX}IO_PAUSES_MS (each run's longest over 1 s), sets IO_WORST_MS and IO_RUNS
io_stop() {
  local i err rkb wkb rmax wmax worst=0 runs=0 line run long="" pre=${1:-}
  touch /tmp/io.stop
  for i in $(seq 1200); do [ -e /tmp/io.done ] && break; sleep 0.1; done
  [ -e /tmp/io.done ] || fail "the fio loop did not end within 120 s of the stop request (hung I/O?)"
  wait "$IO_PID" 2>/dev/null
  [ -e /tmp/io.fail ] && { sed 's/^/  | /' /tmp/io.fail; fail "a fio verify run failed (see above)"; }
  while read -r line; do
    runs=$((runs + 1))
    err=$(echo "$line" | cut -d';' -f5); rkb=$(echo "$line" | cut -d';' -f6)
    wkb=$(echo "$line" | cut -d';' -f47)
    rmax=$(echo "$line" | cut -d';' -f39 | cut -d. -f1); wmax=$(echo "$line" | cut -d';' -f80 | cut -d. -f1)
    [ "$err" = 0 ] || fail "fio run $runs reported error $err"
    [ "$wkb" -gt 0 ] && [ "$rkb" -ge "$wkb" ] || fail "fio run $runs: read $rkb KiB < written $wkb KiB"
    [ "${rmax:-0}" -gt "$worst" ] && worst=$rmax
    [ "${wmax:-0}" -gt "$worst" ] && worst=$wmax
  done < /tmp/io.log
  # each fio run's longest I/O (its jobs run together), those over 1 s: one per failure
  # the run lived through
  long=$(cut -d';' -f3,39,80 /tmp/io.log | awk -F';' '{ split($1, j, "-"); r = j[1];
           m = ($2 > $3 ? $2 : $3); if (m > w[r]) w[r] = m }
         END { for (r in w) if (w[r] > 1000000) printf "%d\n", w[r] / 1000 }' | sort -n | tr '\n' ' ')
  [ -n "$long" ] && echo "${pre}IO_PAUSES_MS=$long"
  [ "$runs" -gt 0 ] || fail "no fio run completed"
  IO_RUNS=$runs
  IO_WORST_MS=$((worst / 1000))
  echo "${pre}PAUSE_MS=$(awk -v u="$worst" 'BEGIN { printf "%.0f", u / 1000 }')"
  ok "$runs fio crc32c verify runs, 0 errors, 0 verify failures; longest I/O $((worst / 1000)) ms"
}
