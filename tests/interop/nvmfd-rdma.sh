# nvmfd's NVMe/RDMA target between two guests over soft-RoCE (rxe0 on the testbed's link).
#
# ROLE=target (the listening guest): starts the shipped /job/nvmfd with a malloc namespace and
#   the RDMA transport, adds NVMe/RDMA listeners (discovery, then the subsystem) on this
#   guest's link address live by RPC (the shipped /job/nvmf rpc), writes
#   /job/serving once it listens, waits for /job/stop from the test (bounded by WAIT_S), stops
#   removes the subsystem's listener live, stops nvmfd with SIGTERM and checks that every
#   queue was torn down and nothing panicked.
# ROLE=host (the connecting guest): the Linux kernel host (nvme-rdma): nvme discover -t rdma,
#   connect, fio 4k randrw 75/25 (writes in-capsule) and 128k sequential (writes by RDMA READ)
#   with crc32c verify, disconnect, clean dmesg. Before that, bad connect private data from
#   /job/rdma_connect_probe (rejected with the NVMe/RDMA status each) and a host that vanishes
#   right after its admin queue was accepted.
# ROLE=victim (a connecting guest the test kills): connects with a KATO s (5) keep-alive timeout
#   (0 is not possible for an I/O controller: nvme-cli leaves it out, and the 6.1 kernel turns
#   keep_alive_tmo=0 written to /dev/nvme-fabrics into its default 5 s), stays idle IDLE_S s (0;
#   nvmfd's liveness probes reach its quiet queues), runs fio 4k randrw at iodepth 32 with no end, writes /job/fio-running once
#   commands are in flight, and waits to be killed (SIGKILL of its qemu: no disconnect, work
#   requests pending).
# ROLE=host2 (the host after the victim, same link address): discover, connect, fio verify,
#   disconnect, clean dmesg.
#
# env: PORT  NQN  HOSTNQN HOSTID (hosts)  TARGET_IP (hosts: the target guest's link address)
#      FIO_MB (host, host2: 8)  WAIT_S (target, 200)
#      REJECTED (target: connect requests the host sends bad, 5; rdma_host.rs's nvmf: 0)
#      MIN_CLOSED (target: NVMe/RDMA queues at least closed by the end, 4)
#      POLL_US (target: nvmfd --poll-us, 50)
#      SPREAD (target, 1: I/O queues must have been placed on two reactors; needs 2 vCPUs:
#        nvmfd runs one reactor per vCPU, at most 2)
#      BUSY (target, 1: some completions must have been reaped by busy polls)
#      WRITE_QUEUES (host: nvme connect --nr-write-queues, 1: a second I/O queue on a 1-vCPU host)
#      NO_SRQ (target: 1 = nvmf_create_transport with no_srq, rpc.py's -r: per-queue receives;
#        else shared receive queues, the default; the log must show the mode used)
#      MAX_CONN_PER_HOST (target: nvmfd --max-connections-per-host; host: the probe then opens
#        that many + 2 connections at once and expects exactly that many accepted, the 2
#        others refused by nvmfd's admission)
#      RPC_STATS (target, 1: once an I/O queue was placed, poll (1/s) until
#        nvmf_subsystem_get_qpairs lists the host's RDMA queues active, then nvmf_get_stats
#        and /metrics (nvmfd --metrics on 127.0.0.1) must show RDMA queues and completions)
. /job/lib.sh
MY_IP=${TESTBED_LINK_IP:?no --link-ip}
MY_IP=${MY_IP%/*}

case ${ROLE:?ROLE not set} in
target)
  step "nvmfd with the RDMA transport, then NVMe/RDMA listeners on $MY_IP:$PORT added live by RPC"
  # No RDMA listener at start: the first live add starts the RDMA reactor, the second reaches
  # it by message (SPDK's rpc.py order: create the transport, then add listeners).
  cat > /tmp/nvmfd.json <<JSON
{"subsystems": [
 {"subsystem": "bdev", "config": [
  {"method": "bdev_malloc_create", "params": {"name": "Malloc0", "num_blocks": 65536, "block_size": 512}}]},
 {"subsystem": "nvmf", "config": [
  {"method": "nvmf_create_transport", "params": {"trtype": "RDMA"$([ "${NO_SRQ:-0}" = 1 ] && echo ', "no_srq": true')}},
  {"method": "nvmf_create_subsystem", "params": {"nqn": "$NQN", "allow_any_host": true,
     "serial_number": "NVMFDRDMA0001", "model_number": "nvmfd rdma"}},
  {"method": "nvmf_subsystem_add_ns", "params": {"nqn": "$NQN", "namespace": {"bdev_name": "Malloc0"}}}]}]}
JSON
  NCPU=$(nproc); [ "$NCPU" -ge 2 ] && CORES=0,1 || CORES=0
  info "nvmfd reactors on core(s) $CORES of $NCPU, --poll-us ${POLL_US:-50}"
  METRICS=(); [ "${RPC_STATS:-0}" = 1 ] && METRICS=(--metrics 127.0.0.1:9464)
  [ -n "${MAX_CONN_PER_HOST:-}" ] && METRICS+=(--max-connections-per-host "$MAX_CONN_PER_HOST")
  RUST_LOG=${RUST_LOG:-info} /job/nvmfd -c /tmp/nvmfd.json -m "$CORES" --poll-us "${POLL_US:-50}" \
    -r /tmp/nvmfd.sock "${METRICS[@]}" > /job/nvmfd.log 2>&1 &
  pid=$!
  for _ in $(seq 150); do   # 15 s at most
    [ -S /tmp/nvmfd.sock ] && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  [ -S /tmp/nvmfd.sock ] || { sed 's/^/  | /' /job/nvmfd.log; fail "nvmfd's RPC socket did not appear"; }
  # rpc.py's command line, by the shipped /job/nvmf (bounded)
  rpc() { timeout 15 /job/nvmf rpc -s /tmp/nvmfd.sock -t 10 "$@" 2>&1; }
  for nqn in nqn.2014-08.org.nvmexpress.discovery "$NQN"; do
    out=$(rpc nvmf_subsystem_add_listener "$nqn" -t rdma -f ipv4 -a "$MY_IP" -s "$PORT") ||
      { sed 's/^/  | /' /job/nvmfd.log; fail "nvmf_subsystem_add_listener $nqn: $out"; }
    ok "listener added live: $nqn"
  done
  # a second address (port): reaches the running RDMA reactor by message
  out=$(rpc nvmf_subsystem_add_listener "$NQN" -t rdma -f ipv4 -a "$MY_IP" -s $((PORT + 1))) ||
    { sed 's/^/  | /' /job/nvmfd.log; fail "nvmf_subsystem_add_listener $NQN port $((PORT + 1)): $out"; }
  [ "$(grep -c 'listening (NVMe/RDMA)' /job/nvmfd.log)" = 2 ] ||
    { sed 's/^/  | /' /job/nvmfd.log; fail "nvmfd does not listen on both RDMA ports"; }
  ok "listener added live on port $((PORT + 1)) too"
  if [ "${NO_SRQ:-0}" = 1 ]; then
    grep -q 'NVMe/RDMA receives: per queue.*no_srq is set' /job/nvmfd.log &&
      ! grep -q 'receives: shared receive queue' /job/nvmfd.log ||
      { sed 's/^/  | /' /job/nvmfd.log; fail "no_srq: nvmfd does not log per-queue receives"; }
    ok "no_srq: per-queue receives"
  else
    grep -q 'NVMe/RDMA receives: shared receive queue (SRQ)' /job/nvmfd.log ||
      { sed 's/^/  | /' /job/nvmfd.log; fail "nvmfd does not log a shared receive queue"; }
    ok "shared receive queue: $(grep -o 'depth=[0-9]*' /job/nvmfd.log | head -1)"
  fi
  grep -q 'listening (NVMe/RDMA)' /job/nvmfd.log || { sed 's/^/  | /' /job/nvmfd.log; fail "nvmfd did not listen on rdma"; }
  ok "nvmfd listens (pid $pid)"
  # RPC_STATS: the connected host's RDMA queues in nvmf_subsystem_get_qpairs, the reactors'
  # RDMA entries in nvmf_get_stats and the RDMA series of /metrics. 1: not yet (retried).
  sum_of() { grep -o "\"$1\":[0-9]*" | cut -d: -f2 | awk '{s+=$1} END {print s+0}'; }
  rpc_stats() {
    QP=$(rpc nvmf_subsystem_get_qpairs "$NQN" | tr -d ' \n') || return 1
    grep -q '"qid":[1-9][0-9]*,"state":"active"' <<<"$QP" || return 1
    grep -q '"trtype":"TCP"' <<<"$QP" && fail "RDMA queues listed as TCP: $QP"
    [ "$(grep -o '"trtype":"RDMA"' <<<"$QP" | wc -l)" -ge 4 ] &&
      grep -q "\"traddr\":\"$MY_IP\"" <<<"$QP" && grep -q "\"trsvcid\":\"$PORT\"" <<<"$QP" ||
      fail "nvmf_subsystem_get_qpairs: no RDMA listen/peer addresses: $QP"
    ST=$(rpc nvmf_get_stats | tr -d ' \n') || fail "nvmf_get_stats: $ST"
    grep -q '"trtype":"RDMA"' <<<"$ST" || fail "nvmf_get_stats: no RDMA transport: $ST"
    [ "$(sum_of completions <<<"$ST")" -gt 0 ] && [ "$(sum_of cq_wakeups <<<"$ST")" -gt 0 ] &&
      [ "$(sum_of current_io_qpairs <<<"$ST")" -ge 1 ] && [ "$(sum_of qpairs <<<"$ST")" -ge 2 ] ||
      fail "nvmf_get_stats: RDMA counters or queues missing: $ST"
    M=$(exec 3<>/dev/tcp/127.0.0.1/9464 && printf 'GET /metrics HTTP/1.0\r\n\r\n' >&3 &&
      timeout 5 cat <&3) || fail "GET /metrics failed"
    grep -q '^nvmf_rdma_completions_total{reactor="[01]"} [1-9]' <<<"$M" &&
      grep -q '^nvmf_rdma_cq_wakeups_total{reactor=' <<<"$M" &&
      grep -q '^nvmf_path_qpairs{.*transport="RDMA".*} [1-9]' <<<"$M" ||
      fail "/metrics: no RDMA series: $(grep -i rdma <<<"$M")"
    info "qpairs: $(grep -o '"qid":[0-9]*,"state":"[a-z]*"' <<<"$QP" | tr '\n' ' ')"
    info "RDMA per reactor: $(grep -o '"\(cq_wakeups\|busy_polls\|completions\)":[0-9]*' <<<"$ST" | tr '\n' ' ')"
    return 0
  }
  touch /job/serving
  step "serving until the test says stop"
  stats_seen=0
  for i in $(seq $((${WAIT_S:-200} * 10))); do
    [ -e /job/stop ] && break
    kill -0 "$pid" 2>/dev/null || break
    if [ "${RPC_STATS:-0}" = 1 ] && [ "$stats_seen" = 0 ] && [ $((i % 10)) = 0 ] &&
       grep -q 'I/O queue placed on reactor' /job/nvmfd.log && rpc_stats; then
      stats_seen=1
      ok "RDMA queues in nvmf_subsystem_get_qpairs, RDMA counters in nvmf_get_stats and /metrics"
    fi
    sleep 0.1
  done
  [ "${RPC_STATS:-0}" = 1 ] && [ "$stats_seen" = 0 ] &&
    fail "the connected host's RDMA queues never showed in nvmf_subsystem_get_qpairs: ${QP:-}"
  kill -0 "$pid" 2>/dev/null || { sed 's/^/  | /' /job/nvmfd.log; fail "nvmfd died while serving"; }
  [ -e /job/stop ] || fail "no stop from the test within ${WAIT_S:-200} s"
  ok "stop requested"
  step "the subsystem's RDMA listeners removed live"
  for p in "$PORT" $((PORT + 1)); do
    out=$(rpc nvmf_subsystem_remove_listener "$NQN" -t rdma -f ipv4 -a "$MY_IP" -s "$p") ||
      fail "nvmf_subsystem_remove_listener port $p: $out"
  done
  grep -q "stopped listening on $MY_IP:$((PORT + 1)) (rdma" /job/nvmfd.log ||
    { sed 's/^/  | /' /job/nvmfd.log; fail "nvmfd still listens on port $((PORT + 1))"; }
  grep -q "stopped listening on $MY_IP:$PORT (rdma" /job/nvmfd.log &&
    fail "the discovery listener on $MY_IP:$PORT was dropped with the subsystem's"
  ok "removed (port $((PORT + 1)) no longer listened on; the discovery subsystem keeps $PORT)"
  step "SIGTERM: nvmfd shuts down, every queue was torn down"
  kill -TERM "$pid"
  for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$pid" 2>/dev/null && fail "nvmfd still running 10 s after SIGTERM"
  wait "$pid"; rc=$?
  [ "$rc" = 0 ] || fail "nvmfd exited with status $rc"
  grep -q 'panicked' /job/nvmfd.log && fail "nvmfd panicked (see nvmfd.log)"
  closed=$(grep -c 'NVMe/RDMA connection closed' /job/nvmfd.log)
  info "NVMe/RDMA queues closed: $closed"
  # default: the vanished host's admin queue, the discovery queue, the I/O controller's two queues
  [ "$closed" -ge "${MIN_CLOSED:-4}" ] || fail "fewer than ${MIN_CLOSED:-4} NVMe/RDMA queues were closed ($closed)"
  grep -q 'active_controllers=0' /job/nvmfd.log || fail "the controller was not freed (no active_controllers=0)"
  rejected=$(grep -c 'NVMe/RDMA connect request rejected' /job/nvmfd.log)
  info "connect requests rejected: $rejected"
  [ "$rejected" = "${REJECTED:-5}" ] || fail "nvmfd logged $rejected rejected connect requests, the host sent ${REJECTED:-5} bad ones"
  ok "clean shutdown"
  step "NVMe/RDMA queues on the reactors: placement and completion polling"
  grep 'I/O queue placed on reactor' /job/nvmfd.log | sed 's/^/  | /'
  grep 'NVMe/RDMA port closed' /job/nvmfd.log | sed 's/^/  | /'
  if [ "${SPREAD:-0}" = 1 ]; then
    [ "$CORES" = 0,1 ] || fail "SPREAD needs 2 vCPUs (this guest has $NCPU)"
    for r in 0 1; do
      grep -q "I/O queue placed on reactor $r" /job/nvmfd.log || fail "no I/O queue was placed on reactor $r"
      grep 'NVMe/RDMA connection closed' /job/nvmfd.log | grep -q "reactor=$r" ||
        fail "no NVMe/RDMA queue was served (and closed) on reactor $r"
    done
    ok "I/O queues served on reactors 0 and 1"
  fi
  sum() { grep 'NVMe/RDMA port closed' /job/nvmfd.log | sed -n "s/.* $1=\([0-9]*\).*/\1/p" | awk '{s+=$1} END {print s+0}'; }
  polled=$(sum polled_completions); wakeups=$(sum cq_wakeups); total=$(sum completions)
  info "completions $total: $polled by busy polls, $wakeups CQ wake-ups"
  if [ "${POLL_US:-50}" = 0 ]; then
    [ "$polled" = 0 ] || fail "--poll-us 0 but $polled completions were busy-polled"
  elif [ "${BUSY:-0}" = 1 ]; then
    [ "$polled" -gt 0 ] || fail "--poll-us ${POLL_US:-50}: no completion was reaped by a busy poll"
  fi
  ok "completion polling as configured"
  echo "ALL STEPS PASSED" ;;
host)
  FIO_MB=${FIO_MB:-8}
  H=(--hostnqn="$HOSTNQN" --hostid="$HOSTID")
  P=/job/rdma_connect_probe; T="$TARGET_IP:$PORT"
  step "bad NVMe/RDMA connect private data: rejected with the NVMe/RDMA status"
  run "$P" "$T" --recfmt 1 --expect-reject 2
  run "$P" "$T" --qid 200 --expect-reject 3
  run "$P" "$T" --hsqsize 7 --hrqsize 8 --expect-reject 4
  run "$P" "$T" --qid 1 --hsqsize 1000 --hrqsize 1001 --expect-reject 4
  run "$P" "$T" --hrqsize 16 --expect-reject 5
  ok "wrong RECFMT, QID, admin and I/O HSQSIZE, HRQSIZE rejected"
  if [ -n "${MAX_CONN_PER_HOST:-}" ]; then
    step "$((MAX_CONN_PER_HOST + 2)) connections held at once: $MAX_CONN_PER_HOST accepted, 2 refused (--max-connections-per-host)"
    run "$P" "$T" --count $((MAX_CONN_PER_HOST + 2)) --expect-accepted "$MAX_CONN_PER_HOST"
    ok "$LAST_OUT"
    sleep 1   # the target destroys the probe's connections (their tickets go back)
  fi
  step "a host that vanishes right after its queue was accepted"
  run "$P" "$T" --expect-accept --vanish
  ok "gone without a disconnect"
  # a write queue besides the per-CPU I/O queue: two I/O queues on a 1-vCPU host, which
  # nvmfd's placement spreads over its reactors
  CONNECT_EXTRA="--nr-write-queues=${WRITE_QUEUES:-1}" rdma_discover_connect
  run nvme id-ctrl "/dev/$CTRL"
  sgls=$(awk '$1 == "sgls" {print $3}' <<<"$LAST_OUT")
  [ -n "$sgls" ] && [ $((sgls & 4)) = 4 ] || fail "Identify SGLS $sgls: no keyed SGL data block support (bit 2)"
  ok "controller $CTRL (rdma), namespace $D"
  step "fio over rdma: 4k randrw 75/25 (in-capsule writes) and 128k sequential (RDMA READ writes), ${FIO_MB} MiB, crc32c verify"
  fio_suite rdma "$D" "$FIO_MB"
  ok "fio verified"
  rdma_disconnect
  echo "ALL STEPS PASSED" ;;
victim)
  H=(--hostnqn="$HOSTNQN" --hostid="$HOSTID")
  modprobe nvme-rdma || fail "modprobe nvme-rdma"
  step "nvme connect -t rdma $NQN --keep-alive-tmo=${KATO:-5}"
  run nvme connect -t rdma -a "$TARGET_IP" -s "$PORT" -n "$NQN" "${H[@]}" --keep-alive-tmo="${KATO:-5}"
  D=$(ns_dev "$NQN" 1) || fail "no block device for namespace 1"
  ok "namespace $D"
  if [ "${IDLE_S:-0}" -gt 0 ]; then
    step "idle for $IDLE_S s (the target probes quiet queues), then one read"
    sleep "$IDLE_S"
    dd if="$D" of=/dev/null bs=4k count=1 iflag=direct 2>/dev/null || fail "read from $D after idling"
    ok "still served after $IDLE_S s idle"
  fi
  step "fio 4k randrw iodepth 32 until this guest is killed"
  fio --name=victim --filename="$D" --direct=1 --ioengine=libaio --rw=randrw \
      --bs=4k --iodepth=32 --time_based --runtime=300 > /job/fio.out 2>&1 &
  fio_pid=$!
  for _ in $(seq 300); do   # 30 s at most
    # the multipath head (bio based) counts nothing: sum over its path disks too; wait for
    # I/O that completes (500 reads and writes done) and commands in flight
    n=$(cat /sys/block/nvme*/inflight 2>/dev/null | awk '{ s += $1 + $2 } END { print s + 0 }')
    done_ios=$(cat /sys/block/nvme*/stat 2>/dev/null | awk '{ s += $1 + $5 } END { print s + 0 }')
    [ "${n:-0}" -gt 0 ] && [ "${done_ios:-0}" -ge 500 ] && break
    kill -0 "$fio_pid" 2>/dev/null || { cat /job/fio.out; fail "fio ended"; }
    sleep 0.1
  done
  [ "${n:-0}" -gt 0 ] && [ "${done_ios:-0}" -ge 500 ] ||
    fail "fio on $D: $done_ios I/Os done, $n in flight after 30 s (want 500 and some)"
  touch /job/fio-running
  ok "fio running ($done_ios I/Os done, $n in flight): waiting to be killed"
  wait "$fio_pid"
  fail "fio ended: this guest should have been killed" ;;
host2)
  FIO_MB=${FIO_MB:-8}
  H=(--hostnqn="$HOSTNQN" --hostid="$HOSTID")
  modprobe nvme-rdma || fail "modprobe nvme-rdma"
  dmesg_mark
  step "nvme discover -t rdma -a $TARGET_IP -s $PORT (after the previous host was killed)"
  run nvme discover -t rdma -a "$TARGET_IP" -s "$PORT" "${H[@]}"
  grep -q "subnqn: *$NQN" <<<"$LAST_OUT" || fail "the discovery log does not list $NQN"
  ok "discovery log lists $NQN"
  step "nvme connect -t rdma $NQN"
  run nvme connect -t rdma -a "$TARGET_IP" -s "$PORT" -n "$NQN" "${H[@]}"
  D=$(ns_dev "$NQN" 1) || fail "no block device for namespace 1"
  ok "namespace $D"
  step "fio 4k randrw ${FIO_MB} MiB, crc32c verify"
  fio_verify rdma-after-kill "$D" 1 --rw=randrw --rwmixread=75 --bs=4k --iodepth=16 --size="${FIO_MB}m"
  ok "fio verified"
  rdma_disconnect
  echo "ALL STEPS PASSED" ;;
esac
