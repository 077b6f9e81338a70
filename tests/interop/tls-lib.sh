# TLS helpers for the 6.12 TLS guests (sourced after /job/lib.sh; run_guest_tls puts this file in
# /job). The trixie userland lives under /opt/trixie: nvme-cli 2.13, keyctl, tlshd.
#
# env: HOSTNQN HOSTID (the host identity every key is derived for)
T=/opt/trixie/bin

# a fresh session keyring with the kernel's .nvme keyring linked in: keys nvme-cli inserts there are
# then "possessed" by this script, so keyctl can read their payloads and clear the ring
tls_session() {  # re-executes the script once inside the new session
  if [ "${TLS_IN_SESSION:-0}" != 1 ]; then
    export TLS_IN_SESSION=1
    exec "$T/keyctl" session nvmf-test bash /job/script
  fi
  "$T/keyctl" link %:.nvme @s >/dev/null || fail "cannot link the .nvme keyring into the session"
}

tls_clear() { "$T/keyctl" clear %:.nvme >/dev/null || fail "keyctl clear .nvme failed"; }

tls_insert() {  # keydata subnqn identity-version: derive + insert as nvme connect --tls will find it
  run "$T/nvme" check-tls-key --keydata="$1" --hostnqn="$HOSTNQN" --subsysnqn="$2" --identity="$3" --insert
}

# prints one line per key in .nvme: PSK|<description>|<payload hex>
tls_dump() {
  local id
  for id in $("$T/keyctl" rlist %:.nvme); do
    echo "PSK|$("$T/keyctl" rdescribe "$id" | cut -d';' -f5-)|$("$T/keyctl" pipe "$id" | od -An -tx1 | tr -d ' \n')"
  done
}

# kTLS + AES-GCM modules and tlshd (the kernel's handshake agent) serving the .nvme keyring
tls_init() {
  local m
  for m in tls gcm aesni-intel aes-generic ghash-generic chacha20poly1305 chacha-x86_64 poly1305-x86_64; do modprobe "$m" 2>/dev/null || true; done
  printf '[authenticate]\nkeyrings=.nvme\n[debug]\nloglevel=1\n' > /etc/tlshd.conf
  timeout "${TLSHD_S:-240}" "$T/tlshd" -s -c /etc/tlshd.conf >/tmp/tlshd.log 2>&1 &
  TLSHD_PID=$!
  sleep 0.3
  kill -0 "$TLSHD_PID" 2>/dev/null || { cat /tmp/tlshd.log; fail "tlshd did not start"; }
}

tls_log() { echo "---- tlshd log ----"; sed 's/^/  | /' /tmp/tlshd.log; }

# nvme connect (trixie's nvme-cli), bounded; extra args e.g. --tls
tls_connect() {  # nqn [args...]
  local nqn=$1; shift
  echo "+ nvme connect -n $nqn $*"
  timeout 40 "$T/nvme" connect -t tcp -a "$ADDR" -s "$PORT" -n "$nqn" --hostnqn="$HOSTNQN" \
    --hostid="$HOSTID" -i 1 "$@" 2>&1 | sed 's/^/  | /'
  return "${PIPESTATUS[0]}"
}
