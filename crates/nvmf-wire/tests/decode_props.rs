//! Property tests for the PDU decoder: arbitrary bytes and arbitrary split
//! points never panic and give consistent answers, and streams of valid PDUs
//! split into arbitrary chunks decode to the PDUs that were encoded.

use nvmf_wire::pdu::*;
use nvmf_wire::{Command, Completion, Status};
use proptest::prelude::*;

fn any_opts() -> impl Strategy<Value = DecodeOpts> {
    (any::<bool>(), any::<bool>(), 0u32..70_000, any::<bool>()).prop_map(
        |(hdgst, ddgst, max, host)| DecodeOpts {
            hdgst,
            ddgst,
            max_data_len: max,
            role: if host { Role::Host } else { Role::Target },
        },
    )
}

/// Check the decoder's contract for one buffer and return its answer.
fn check_one<'a>(buf: &'a [u8], opts: &DecodeOpts) -> Result<Decoded<'a>, PduError> {
    let r = decode(buf, opts);
    match &r {
        Ok(Decoded::Incomplete { need }) => {
            assert!(*need > buf.len(), "need {need} <= len {}", buf.len())
        }
        Ok(Decoded::Pdu { len, pdu }) => {
            assert!(*len <= buf.len());
            assert!(*len >= 8);
            assert_eq!(pdu.common().plen() as usize, *len);
            assert!(pdu.data().len() < *len);
        }
        Err(e) => assert!((1..=6).contains(&e.fes()), "{e}"),
    }
    r
}

/// Decoding a prefix must agree with decoding the whole buffer: a prefix
/// never claims a PDU longer than itself, a complete PDU or an error found in
/// a prefix is found identically in the whole, and `need` only grows.
fn check_prefix_consistency(buf: &[u8], split: usize, opts: &DecodeOpts) {
    let split = split.min(buf.len());
    let part = check_one(&buf[..split], opts);
    let whole = check_one(buf, opts);
    match part {
        Ok(Decoded::Pdu { .. }) | Err(_) => assert_eq!(part, whole),
        Ok(Decoded::Incomplete { need }) => {
            if let Ok(Decoded::Incomplete { need: n2 }) = whole {
                assert!(n2 >= need);
            }
        }
    }
}

/// One random but well-formed PDU, encoded with `eo`, plus the role that receives it.
fn encode_random(kind: u8, x: u32, data: &[u8], eo: &EncodeOpts, out: &mut Vec<u8>) -> Role {
    let cid = x as u16;
    match kind % 9 {
        0 => {
            encode_ic_req(out, (x % 32) as u8, eo.hdgst, eo.ddgst, x);
            Role::Target
        }
        1 => {
            encode_ic_resp(out, (x % 32) as u8, eo.hdgst, eo.ddgst, x);
            Role::Host
        }
        2 => {
            encode_term_req(out, Role::Host, (x % 7) as u16, x, data);
            Role::Target
        }
        3 => {
            encode_term_req(out, Role::Target, (x % 7) as u16, x, data);
            Role::Host
        }
        4 => {
            encode_capsule_cmd(out, eo, &Command::new(0x01, cid), data);
            Role::Target
        }
        5 => {
            encode_capsule_resp(out, eo, &Completion::new(cid, 1, 2, Status::SUCCESS, x));
            Role::Host
        }
        6 => {
            encode_h2c_data(out, eo, cid, cid ^ 0xff, x, data, DATA_LAST);
            Role::Target
        }
        7 => {
            encode_c2h_data(out, eo, cid, x, data, DATA_LAST | DATA_SUCCESS);
            Role::Host
        }
        _ => {
            encode_r2t(out, eo, cid, 3, x, x / 2);
            Role::Host
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(buf in proptest::collection::vec(any::<u8>(), 0..400),
                                   split in 0usize..400, opts in any_opts()) {
        check_prefix_consistency(&buf, split, &opts);
    }

    /// Plausible headers (valid type, hlen and small plen) reach the deeper
    /// checks far more often than random bytes do.
    #[test]
    fn plausible_headers_never_panic(ty in prop::sample::select(PduType::ALL.to_vec()),
                                     flags in any::<u8>(), pdo in any::<u8>(),
                                     plen_delta in 0u32..300,
                                     tail in proptest::collection::vec(any::<u8>(), 0..400),
                                     split in 0usize..500, opts in any_opts()) {
        let hlen = ty.hlen() as u8;
        let plen = ty.hlen() as u32 + plen_delta;
        let mut buf = vec![ty as u8, flags, hlen, pdo];
        buf.extend_from_slice(&plen.to_le_bytes());
        buf.extend_from_slice(&tail);
        let opts = DecodeOpts { role: match ty.sender() { Role::Host => Role::Target, Role::Target => Role::Host }, ..opts };
        check_prefix_consistency(&buf, split, &opts);
    }

    /// Valid PDUs with one corrupted byte: never panic, prefixes consistent.
    #[test]
    fn mutated_valid_pdus(kind in any::<u8>(), x in any::<u32>(),
                          data in proptest::collection::vec(any::<u8>(), 0..300),
                          hd in any::<bool>(), dd in any::<bool>(), pda in 0u8..4,
                          pos in any::<usize>(), xor in 1u8..=255, split in any::<usize>()) {
        let eo = EncodeOpts { hdgst: hd, ddgst: dd, pda };
        let mut out = Vec::new();
        let role = encode_random(kind, x, &data, &eo, &mut out);
        let opts = DecodeOpts { hdgst: hd, ddgst: dd, max_data_len: 1 << 20, role };
        // Unmodified, it decodes whole.
        match decode(&out, &opts) {
            Ok(Decoded::Pdu { len, pdu }) => {
                prop_assert_eq!(len, out.len());
                prop_assert!(pdu.data_digest_ok());
            }
            other => prop_assert!(false, "{:?}", other),
        }
        let p = pos % out.len();
        out[p] ^= xor;
        check_prefix_consistency(&out, split % (out.len() + 1), &opts);
    }

    /// A stream of valid PDUs cut into arbitrary chunks decodes to exactly the
    /// PDUs that were sent, in order.
    #[test]
    fn chunked_stream_round_trips(pdus in proptest::collection::vec(
                                      (0u8..9, any::<u32>(), proptest::collection::vec(any::<u8>(), 0..200)), 1..8),
                                  hd in any::<bool>(), dd in any::<bool>(), host in any::<bool>(),
                                  chunks in proptest::collection::vec(1usize..300, 1..50)) {
        let eo = EncodeOpts::new(hd, dd);
        let role = if host { Role::Host } else { Role::Target };
        let opts = DecodeOpts { hdgst: hd, ddgst: dd, max_data_len: 1 << 20, role };
        let mut wire = Vec::new();
        let mut expected = Vec::new();
        for (kind, x, data) in &pdus {
            let mut one = Vec::new();
            // Only keep PDUs that this role receives.
            if encode_random(*kind, *x, data, &eo, &mut one) == role {
                wire.extend_from_slice(&one);
                expected.push(one);
            }
        }
        let mut rx: Vec<u8> = Vec::new();
        let mut got: Vec<Vec<u8>> = Vec::new();
        let mut sent = 0;
        let mut ci = 0;
        while sent < wire.len() {
            let n = chunks[ci % chunks.len()].min(wire.len() - sent);
            ci += 1;
            rx.extend_from_slice(&wire[sent..sent + n]);
            sent += n;
            loop {
                match decode(&rx, &opts).unwrap() {
                    Decoded::Incomplete { need } => { prop_assert!(need > rx.len()); break; }
                    Decoded::Pdu { len, pdu } => {
                        prop_assert!(pdu.data_digest_ok());
                        got.push(rx[..len].to_vec());
                        rx.drain(..len);
                    }
                }
            }
        }
        prop_assert!(rx.is_empty());
        prop_assert_eq!(got, expected);
    }
}
