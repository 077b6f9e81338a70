//! Fuzz the NVMe/TCP PDU decoder: the first byte picks the decoder options,
//! the second a split point; the rest is the receive buffer. The decoder
//! must never panic, and decoding a prefix must agree with decoding the whole.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nvmf_wire::pdu::{decode, DecodeOpts, Decoded, Role};

fuzz_target!(|input: &[u8]| {
    if input.len() < 2 {
        return;
    }
    let (ctl, split, buf) = (input[0], input[1] as usize, &input[2..]);
    let opts = DecodeOpts {
        hdgst: ctl & 1 != 0,
        ddgst: ctl & 2 != 0,
        role: if ctl & 4 != 0 {
            Role::Host
        } else {
            Role::Target
        },
        max_data_len: if ctl & 8 != 0 { 4096 } else { 1 << 20 },
    };
    let whole = decode(buf, &opts);
    match &whole {
        Ok(Decoded::Incomplete { need }) => assert!(*need > buf.len()),
        Ok(Decoded::Pdu { len, pdu }) => {
            assert!(*len <= buf.len());
            assert_eq!(pdu.common().plen() as usize, *len);
        }
        Err(e) => assert!((1..=6).contains(&e.fes())),
    }
    let split = split.min(buf.len());
    let part = decode(&buf[..split], &opts);
    match part {
        Ok(Decoded::Pdu { .. }) | Err(_) => assert_eq!(part, whole),
        Ok(Decoded::Incomplete { need }) => {
            assert!(need > split);
            if let Ok(Decoded::Incomplete { need: n2 }) = whole {
                assert!(n2 >= need);
            }
        }
    }
});
