# User-space RDMA between two guests over soft-RoCE: rping (librdmacm + libibverbs with the rxe
# provider) from the connecting guest to a server in the listening guest. The path a user-space
# NVMe/RDMA target in a guest (nvmfd) takes: rdma_cm connection setup, then RDMA SEND/READ/WRITE.
#
# env: ROLE=server|client  PINGS (count, 5)
#      server: writes /job/serving once rping listens, then waits for one client
#      client: PEER_IP (the server guest's link address)
exec 2>&1
set -u
PINGS=${PINGS:-5}
MY_IP=${TESTBED_LINK_IP:?no --link-ip}
count() { grep -c 'ping data: rdma-ping-' "$1"; }

case ${ROLE:?ROLE not set} in
server)
  rping -s -a "$MY_IP" -C "$PINGS" -v > /tmp/rping.log 2>&1 &
  srv=$!
  sleep 0.5   # rping binds and listens right after its start
  kill -0 "$srv" 2>/dev/null || { cat /tmp/rping.log; echo "FAIL: rping server did not start"; exit 1; }
  touch /job/serving
  wait "$srv"; rc=$?
  sed 's/^/  | /' /tmp/rping.log
  [ "$rc" = 0 ] || { echo "FAIL: rping server exited with status $rc"; exit 1; }
  [ "$(count /tmp/rping.log)" = "$PINGS" ] || { echo "FAIL: the server saw $(count /tmp/rping.log) of $PINGS pings"; exit 1; }
  echo "ok: served $PINGS pings to a client in the other guest" ;;
client)
  : "${PEER_IP:?PEER_IP not set}"
  rc=1
  for i in 1 2 3 4 5; do   # the first ARP/rdma_cm resolution may need a retry
    timeout 20 rping -c -a "$PEER_IP" -C "$PINGS" -v > /tmp/rping.log 2>&1 && { rc=0; break; }
    sleep 0.5
  done
  sed 's/^/  | /' /tmp/rping.log
  [ "$rc" = 0 ] || { echo "FAIL: rping -c $PEER_IP failed"; exit 1; }
  [ "$(count /tmp/rping.log)" = "$PINGS" ] || { echo "FAIL: $(count /tmp/rping.log) of $PINGS pings came back"; exit 1; }
  echo "ok: $PINGS pings to $PEER_IP over rdma_cm" ;;
*) echo "FAIL: ROLE must be server or client"; exit 2 ;;
esac
echo "ALL STEPS PASSED"
