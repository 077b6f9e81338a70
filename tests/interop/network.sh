# Testbed check: the guest reaches exactly the host ports it was given.
#
# env: PORT      a host port named with --host-port (the host listener greets with "hello")
#      BLOCKED   a host port with a listener that was NOT named
. /job/lib.sh

step "named host port 10.0.2.2:$PORT"
exec 3<>"/dev/tcp/$ADDR/$PORT" || fail "cannot connect to $ADDR:$PORT"
read -r -t 10 greeting <&3 || fail "no greeting from $ADDR:$PORT"
exec 3<&-
[ "$greeting" = hello ] || fail "unexpected greeting '$greeting'"
ok "connected, got '$greeting'"

step "other destinations are unreachable"
for dst in "$ADDR/$BLOCKED" "10.0.2.254/$BLOCKED" "127.0.0.1/$PORT" "1.1.1.1/80" "192.168.1.1/4420"; do
  if timeout 5 bash -c "exec 3<>/dev/tcp/$dst" 2>/dev/null; then
    fail "the guest could connect to $dst"
  fi
  echo "  $dst: refused"
done
ok "no other destination reachable"
echo "ALL STEPS PASSED"
