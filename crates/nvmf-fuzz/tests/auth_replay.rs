//! Stable-toolchain replay of the DH-HMAC-CHAP fuzz target: hand-made
//! cases (a Negotiate then the challenge, a malformed Reply, commands
//! before authentication) and a fixed number of PRNG cases go through the
//! same `run_auth_bytes` the libFuzzer target calls.

use nvmf_fuzz::auth::{run_auth_bytes, AuthReport};
use nvmf_wire::auth as w;

/// One step of a hand-made case: op, then the length (LE16), then data.
fn step(out: &mut Vec<u8>, op: u8, data: &[u8], len: u16) {
    out.push(op);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(data);
}

#[test]
fn handmade_cases() {
    // Negotiate (SHA-256, null), Receive the challenge, a Reply with a
    // wrong response, Receive: Failure1, the queue closes.
    let mut neg = Vec::new();
    w::encode_negotiate(&mut neg, 1, &[w::HASH_SHA256], &[w::DHGROUP_NULL]);
    let mut reply = Vec::new();
    w::encode_reply(&mut reply, 1, &[0u8; 32], None, &[]);
    let mut c = Vec::new();
    step(&mut c, 2, &[], 0); // a command before authentication
    step(&mut c, 0, &neg, neg.len() as u16);
    step(&mut c, 1, &[], 1024);
    step(&mut c, 0, &reply, reply.len() as u16);
    step(&mut c, 1, &[], 1024);
    let r: AuthReport = run_auth_bytes(&c);
    assert_eq!((r.sends, r.recvs), (2, 2), "{r:?}");
    assert_eq!(r.refused_before_auth, 1);
    assert_eq!(r.failures, 1);
    assert!(r.closed);

    // A challenge into a buffer too small for it: Failure1, closed.
    let mut c = Vec::new();
    step(&mut c, 0, &neg, neg.len() as u16);
    step(&mut c, 1, &[], 16);
    let r = run_auth_bytes(&c);
    assert!(r.closed && r.failures == 1, "{r:?}");
}

#[test]
fn prng_cases() {
    let mut s: u64 = 0x5eed_a075;
    let mut total = AuthReport::default();
    for _ in 0..400 {
        let n = (next(&mut s) % 400) as usize;
        let mut b: Vec<u8> = (0..n).map(|_| next(&mut s) as u8).collect();
        // Half the cases start with a well-formed Negotiate.
        if next(&mut s).is_multiple_of(2) {
            let mut neg = Vec::new();
            w::encode_negotiate(&mut neg, 7, &[1, 2, 3], &[0, 1]);
            let mut c = Vec::new();
            step(&mut c, 0, &neg, neg.len() as u16);
            c.extend_from_slice(&b);
            b = c;
        }
        let r = run_auth_bytes(&b);
        total.sends += r.sends;
        total.recvs += r.recvs;
        total.failures += r.failures;
        total.refused_before_auth += r.refused_before_auth;
    }
    assert!(
        total.sends > 100 && total.recvs > 100 && total.failures > 10,
        "{total:?}"
    );
}

fn next(s: &mut u64) -> u64 {
    *s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *s;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
