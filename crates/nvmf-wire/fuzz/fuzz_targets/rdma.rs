//! Fuzz the NVMe/RDMA parsers: the first five bytes pick the queue limits
//! (admin entries, I/O entries, I/O queues), the rest is RDMA_CM private
//! data for the connect request check, and its first 16 bytes a keyed SGL
//! descriptor. Neither may panic; an accepted request must satisfy every
//! limit it was checked against, and an accepted descriptor must encode
//! back to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nvmf_wire::rdma::{
    parse_connect_request, KeyedSgl, RdmaQueueLimits, ADMIN_QUEUE_MIN_ENTRIES,
    IO_QUEUE_MIN_ENTRIES,
};
use nvmf_wire::zerocopy::IntoBytes;

fuzz_target!(|input: &[u8]| {
    if input.len() < 5 {
        return;
    }
    let limits = RdmaQueueLimits {
        max_admin_entries: u32::from(input[0]) * 32,
        max_io_entries: u32::from(u16::from_le_bytes([input[1], input[2]])) + 1,
        max_io_queues: u16::from_le_bytes([input[3], input[4]]),
    };
    let data = &input[5..];
    if let Ok(r) = parse_connect_request(data, &limits) {
        assert!(data.len() >= 32);
        assert_eq!(&data[..2], &[0, 0]);
        assert!(r.qid <= limits.max_io_queues);
        let (min, max) = if r.is_admin() {
            (ADMIN_QUEUE_MIN_ENTRIES, limits.max_admin_entries)
        } else {
            (IO_QUEUE_MIN_ENTRIES, limits.max_io_entries)
        };
        assert!((min..=max).contains(&r.entries()));
        assert!(u32::from(r.hrqsize) >= r.entries());
        assert_eq!(u32::from(r.accept().crqsize.get()), r.entries());
    }
    if let Some(Ok(k)) = KeyedSgl::decode_bytes(data) {
        let d = k.encode().expect("a decoded keyed SGL encodes");
        assert_eq!(d.as_bytes(), &data[..16]);
    }
});
