# nvmf-rdma's verbs + rdma_cm layer between two guests over soft-RoCE: the example program
# rdma_pingpong (shipped with --put-bin) as server in the listening guest and as client in the
# connecting one (connect rejected for a wrong private data, then accepted; SEND, RDMA READ,
# RDMA WRITE through a memory window, SEND with invalidate; see its top comment).
#
# env: ROLE=server|client  PORT (the server's port on the link)  TIMEOUT (s, for the program)
#      server: writes /job/serving once it listens, then serves one client; LISTEN_IP (the
#              address it listens on: its link address by default; "[::]" is the wildcard)
#      client: PEER_IP (the server guest's link address)
exec 2>&1
set -u
MY_IP=${TESTBED_LINK_IP:?no --link-ip}
PORT=${PORT:?PORT not set}
TIMEOUT=${TIMEOUT:-60}
PP=/job/rdma_pingpong
[ -x "$PP" ] || { echo "FAIL: $PP was not shipped (--put-bin)"; exit 1; }
t0=$(cut -d' ' -f1 /proc/uptime)
took() { awk -v a="$t0" -v b="$(cut -d' ' -f1 /proc/uptime)" 'BEGIN { printf "%.1f s", b - a }'; }

case ${ROLE:?ROLE not set} in
server)
  "$PP" --server "${LISTEN_IP:-$MY_IP}:$PORT" --timeout "$TIMEOUT" > /tmp/pp.log 2>&1 &
  srv=$!
  for _ in $(seq 100); do   # 10 s at most
    grep -q '^listening on' /tmp/pp.log && break
    kill -0 "$srv" 2>/dev/null || break
    sleep 0.1
  done
  grep -q '^listening on' /tmp/pp.log || { sed 's/^/  | /' /tmp/pp.log; echo "FAIL: rdma_pingpong --server did not listen"; exit 1; }
  touch /job/serving
  wait "$srv"; rc=$?
  sed 's/^/  | /' /tmp/pp.log
  [ "$rc" = 0 ] && grep -q '^PASS$' /tmp/pp.log || { echo "FAIL: rdma_pingpong --server exited with status $rc"; exit 1; }
  echo "ok: served one client over rxe0 ($(took))" ;;
client)
  : "${PEER_IP:?PEER_IP not set}"
  "$PP" --client "$PEER_IP:$PORT" --timeout "$TIMEOUT" > /tmp/pp.log 2>&1; rc=$?
  sed 's/^/  | /' /tmp/pp.log
  [ "$rc" = 0 ] && grep -q '^PASS$' /tmp/pp.log || { echo "FAIL: rdma_pingpong --client $PEER_IP:$PORT exited with status $rc"; exit 1; }
  echo "ok: pingpong with $PEER_IP:$PORT over rdma_cm ($(took))" ;;
*) echo "FAIL: ROLE must be server or client"; exit 2 ;;
esac
echo "ALL STEPS PASSED"
