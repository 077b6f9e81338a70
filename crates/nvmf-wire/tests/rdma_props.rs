//! Property tests for the NVMe/RDMA parsers: arbitrary RDMA_CM private data
//! and limits never panic the connect request check and every answer is
//! consistent with the bytes; arbitrary 16-byte descriptors never panic the
//! keyed SGL decoder, and whatever it accepts encodes back to the same bytes.

use nvmf_wire::rdma::{
    parse_connect_request, KeyedSgl, RdmaCmStatus, RdmaQueueLimits, ADMIN_QUEUE_MIN_ENTRIES,
    IO_QUEUE_MIN_ENTRIES, KEYED_SGL_MAX_LENGTH,
};
use nvmf_wire::zerocopy::IntoBytes;
use proptest::prelude::*;

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn any_limits() -> impl Strategy<Value = RdmaQueueLimits> {
    (0u32..70_000, 0u32..70_000, any::<u16>()).prop_map(|(a, i, q)| RdmaQueueLimits {
        max_admin_entries: a,
        max_io_entries: i,
        max_io_queues: q,
    })
}

/// Private data that is mostly well formed: small fields, sometimes wrong.
fn near_valid() -> impl Strategy<Value = Vec<u8>> {
    (
        prop_oneof![Just(0u16), any::<u16>()],
        0u16..300,
        0u16..300,
        0u16..300,
        any::<u16>(),
        28usize..40,
    )
        .prop_map(|(recfmt, qid, hrq, hsq, cntlid, len)| {
            let mut b = vec![0u8; len];
            let fields = [recfmt, qid, hrq, hsq, cntlid];
            for (i, f) in fields.iter().enumerate() {
                if 2 * i + 2 <= len {
                    b[2 * i..2 * i + 2].copy_from_slice(&f.to_le_bytes());
                }
            }
            b
        })
}

fn check(b: &[u8], limits: &RdmaQueueLimits) {
    match parse_connect_request(b, limits) {
        Ok(r) => {
            assert!(b.len() >= 32);
            assert_eq!(le16(b, 0), 0);
            assert_eq!(r.qid, le16(b, 2));
            assert_eq!(r.hrqsize, le16(b, 4));
            assert_eq!(r.hsqsize, le16(b, 6));
            assert_eq!(r.cntlid, le16(b, 8));
            assert!(r.qid <= limits.max_io_queues);
            let (min, max) = if r.qid == 0 {
                (ADMIN_QUEUE_MIN_ENTRIES, limits.max_admin_entries)
            } else {
                (IO_QUEUE_MIN_ENTRIES, limits.max_io_entries)
            };
            assert!((min..=max).contains(&r.entries()), "{r:?} {limits:?}");
            assert!(u32::from(r.hrqsize) >= r.entries());
            assert!(r.matches_connect(r.qid, r.hsqsize));
            assert_eq!(u32::from(r.accept().crqsize.get()), r.entries());
            assert_eq!(r.accept().as_bytes().len(), 32);
        }
        Err(RdmaCmStatus::InvalidLength) => assert!(b.len() < 32),
        Err(RdmaCmStatus::InvalidRecfmt) => assert_ne!(le16(b, 0), 0),
        Err(RdmaCmStatus::InvalidQid) => assert!(le16(b, 2) > limits.max_io_queues),
        Err(RdmaCmStatus::InvalidHsqsize) => {
            let entries = u32::from(le16(b, 6)) + 1;
            let (min, max) = if le16(b, 2) == 0 {
                (ADMIN_QUEUE_MIN_ENTRIES, limits.max_admin_entries)
            } else {
                (IO_QUEUE_MIN_ENTRIES, limits.max_io_entries)
            };
            assert!(!(min..=max).contains(&entries) || le16(b, 6) == u16::MAX);
        }
        Err(RdmaCmStatus::InvalidHrqsize) => assert!(le16(b, 4) <= le16(b, 6)),
        Err(other) => panic!("the private data check never answers {other}"),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn connect_request_arbitrary_bytes(
        b in proptest::collection::vec(any::<u8>(), 0..64),
        limits in any_limits(),
    ) {
        check(&b, &limits);
    }

    #[test]
    fn connect_request_near_valid(b in near_valid(), limits in any_limits()) {
        check(&b, &limits);
    }

    #[test]
    fn keyed_sgl_arbitrary_bytes(b in proptest::collection::vec(any::<u8>(), 0..24)) {
        match KeyedSgl::decode_bytes(&b) {
            None => prop_assert!(b.len() < 16),
            Some(Err(_)) => {}
            Some(Ok(k)) => {
                prop_assert!(k.length <= KEYED_SGL_MAX_LENGTH);
                prop_assert_eq!(b[15] >> 4, 4);
                let d = k.encode().expect("a decoded length fits");
                prop_assert_eq!(d.as_bytes(), &b[..16]);
            }
        }
    }

    #[test]
    fn keyed_sgl_round_trip(
        address in any::<u64>(),
        length in 0u32..=KEYED_SGL_MAX_LENGTH,
        key in any::<u32>(),
        invalidate in any::<bool>(),
    ) {
        let k = KeyedSgl { address, length, key, invalidate };
        let d = k.encode().expect("24-bit length");
        prop_assert_eq!(KeyedSgl::decode(&d), Ok(k));
        prop_assert_eq!(KeyedSgl::decode_bytes(d.as_bytes()), Some(Ok(k)));
    }
}
