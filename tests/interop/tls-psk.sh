# Interop scenario (6.12 TLS guest): how the Linux host derives NVMe/TCP TLS PSKs, and what its
# TLS client (tlshd) offers.  The host driver compares the keys with nvmf_core::tls::psk.
#  1. for each configured PSK in PSKS: `nvme check-tls-key --insert --identity=0|1` and print the
#     .nvme keyring's key descriptions (= TLS PSK identities) and payloads (= TLS PSKs);
#  2. for each PSK in HELLO_PSKS: both identities in the keyring, tlshd running, `nvme connect
#     --tls` to the host's capture listener (PORT), which records the ClientHello; checkpoint
#     hello-N lets the host read it (the connect itself must fail: nobody answers the handshake);
#     then once more with only the version-0 identity of the first key in the keyring (hello-v0).
# env: PORT HOSTNQN HOSTID SUBNQN PSKS HELLO_PSKS (space-separated interchange keys)
. /job/lib.sh
. /job/tls-lib.sh
tls_session

step "derive: nvme check-tls-key --insert, identity versions 0 and 1"
for K in $PSKS; do
  tls_clear
  QUIET_RUN=1 tls_insert "$K" "$SUBNQN" 0
  QUIET_RUN=1 tls_insert "$K" "$SUBNQN" 1
  echo "CONFIGURED|$K"
  tls_dump
done
ok "keys derived"

step "ClientHello of nvme connect --tls"
tls_init
n=0
for K in $HELLO_PSKS; do
  n=$((n + 1))
  tls_clear
  QUIET_RUN=1 tls_insert "$K" "$SUBNQN" 0
  QUIET_RUN=1 tls_insert "$K" "$SUBNQN" 1
  if tls_connect "$SUBNQN" --tls; then fail "nvme connect --tls to a capture listener succeeded"; fi
  checkpoint "hello-$n" "$K both"
done
# only the version-0 identity in the keyring: does the host fall back to it?
K=${HELLO_PSKS%% *}
tls_clear
QUIET_RUN=1 tls_insert "$K" "$SUBNQN" 0
if tls_connect "$SUBNQN" --tls; then fail "nvme connect --tls to a capture listener succeeded"; fi
checkpoint "hello-v0" "$K 0"
tls_log
ok "ClientHellos captured"
echo "ALL STEPS PASSED"
