//! Socket-free tests of the NVMe/TCP connection state machine: host PDUs are
//! fed in arbitrary splits, output is drained with partial writes, and the
//! PDUs that come back are checked (happy paths with and without digests,
//! every termination case, data digest errors, Connect rejections, garbage).

mod common;

use common::host::*;
use common::{config_json, ALLOWED_HOST, RESTRICTED_NQN};
use nvmf_config::TargetConfig;
use nvmf_core::{PortInfo, Target};
use nvmf_tcp::{Connection, TcpParams};
use nvmf_wire::command::Command;
use nvmf_wire::fabrics::CNTLID_DYNAMIC;
use nvmf_wire::pdu::*;
use nvmf_wire::status::Status;
use std::collections::VecDeque;
use std::io::IoSlice;
use std::sync::Arc;

fn target() -> Arc<Target> {
    let cfg = TargetConfig::from_json_str(&config_json(4420)).expect("test config");
    Target::from_config(&cfg).expect("target")
}

fn port() -> Arc<PortInfo> {
    Arc::new(PortInfo {
        trtype: nvmf_config::TransportType::Tcp,
        adrfam: nvmf_config::AddressFamily::Ipv4,
        traddr: "127.0.0.1".into(),
        trsvcid: "4420".into(),
        peer: "127.0.0.1:50000".parse().unwrap(),
        tls: None,
        caps: nvmf_core::TransportCaps::MESSAGE_BASED,
    })
}

/// An in-memory pipe to a `Connection` that splits input and output at
/// pseudo-random points.
struct Mem {
    conn: Connection,
    inbox: Vec<u8>,
    parsed: VecDeque<Resp>,
    rng: u64,
}

impl Mem {
    fn new(t: &Arc<Target>, seed: u64) -> Mem {
        let params = TcpParams::new(t.limits(), true);
        Mem {
            conn: Connection::new(t.clone(), port(), &params),
            inbox: Vec::new(),
            parsed: VecDeque::new(),
            rng: seed | 1,
        }
    }

    fn rand(&mut self, n: usize) -> usize {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        (self.rng % n.max(1) as u64) as usize
    }

    /// Takes all output, in randomly sized partial writes.
    fn drain(&mut self) {
        while self.conn.has_output() {
            let lim = if self.rand(4) == 0 { 7 } else { 70_000 };
            let max = 1 + self.rand(lim);
            let mut got = Vec::new();
            {
                let mut iov = [IoSlice::new(&[]); 8];
                let n = self.conn.output(&mut iov);
                assert!(n > 0);
                for s in &iov[..n] {
                    let take = (max - got.len()).min(s.len());
                    got.extend_from_slice(&s[..take]);
                    if got.len() == max {
                        break;
                    }
                }
            }
            self.conn.consume_output(got.len());
            self.inbox.extend_from_slice(&got);
        }
    }

    fn closed(&self) -> bool {
        self.conn.close_reason().is_some()
    }
}

impl Wire for Mem {
    fn send(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let lim = if self.rand(3) == 0 { 5 } else { bytes.len() };
            let n = 1 + self.rand(lim);
            let n = n.min(bytes.len());
            self.conn.feed(&bytes[..n]);
            bytes = &bytes[n..];
        }
    }

    fn recv(&mut self, host: &Host) -> Resp {
        if let Some(r) = self.parsed.pop_front() {
            return r;
        }
        self.drain();
        let got = host.parse(&mut self.inbox).expect("target output decodes");
        self.parsed.extend(got);
        self.parsed.pop_front().unwrap_or_else(|| {
            panic!(
                "no PDU from target (closed: {:?})",
                self.conn.close_reason()
            )
        })
    }
}

fn io_conn(t: &Arc<Target>, seed: u64, cntlid: u16, digests: bool) -> (Mem, Host) {
    let mut m = Mem::new(t, seed);
    let mut h = Host::new();
    init(&mut m, &mut h, digests, digests);
    let c = connect(&mut m, &mut h, 1, 63, cntlid, DEFAULT_NQN, HOSTNQN);
    assert_eq!(c.status(), Status::SUCCESS, "I/O connect");
    (m, h)
}

fn full_flow(digests: bool, seed: u64) {
    let t = target();
    let mut admin = Mem::new(&t, seed);
    let mut ah = Host::new();
    let cntlid = admin_up(&mut admin, &mut ah, digests, digests);
    let id = identify_ctrl(&mut admin, &mut ah);
    assert!(id.iter().any(|&b| b != 0));
    assert_eq!(t.active_controllers(), 1);

    let (mut io, mut h) = io_conn(&t, seed + 1, cntlid, digests);
    let a = pattern(seed, 4096);
    assert_eq!(write(&mut io, &mut h, 8, &a, true), Status::SUCCESS);
    let b = pattern(seed + 7, 64 * 1024);
    assert_eq!(write(&mut io, &mut h, 64, &b, false), Status::SUCCESS);
    let c = pattern(seed + 9, 128 * 1024);
    assert_eq!(write(&mut io, &mut h, 1024, &c, false), Status::SUCCESS);
    let (s, d) = read(&mut io, &mut h, 8, 4096);
    assert_eq!(s, Status::SUCCESS);
    assert!(d == a, "in-capsule write reads back");
    let (s, d) = read(&mut io, &mut h, 64, 64 * 1024);
    assert_eq!(s, Status::SUCCESS);
    assert!(d == b, "R2T write reads back");
    let (s, d) = read(&mut io, &mut h, 1024, 128 * 1024);
    assert_eq!(s, Status::SUCCESS);
    assert!(d == c, "128 KiB R2T write reads back");
    assert!(!io.closed() && !admin.closed());
    drop(io);
    drop(admin);
    assert_eq!(t.active_controllers(), 0);
}

#[test]
fn happy_path_without_digests() {
    for seed in 1..4 {
        full_flow(false, seed);
    }
}

#[test]
fn happy_path_with_digests() {
    for seed in 10..13 {
        full_flow(true, seed);
    }
}

#[test]
fn pipelined_commands_in_one_buffer() {
    let t = target();
    let mut admin = Mem::new(&t, 5);
    let mut ah = Host::new();
    let cntlid = admin_up(&mut admin, &mut ah, false, false);
    let (mut io, h) = io_conn(&t, 6, cntlid, false);
    // 32 reads back to back in one send; all answered, in any order.
    let mut bytes = Vec::new();
    for i in 0..32u16 {
        let mut cmd = Command::new(0x02, 100 + i);
        cmd.set_nsid(1);
        cmd.set_lba_range(u64::from(i) * 8, 8);
        cmd.set_sgl(nvmf_wire::command::SglDescriptor::transport(4096));
        bytes.extend(h.capsule(&cmd, &[]));
    }
    io.send(&bytes);
    let mut done = std::collections::BTreeSet::new();
    while done.len() < 32 {
        match io.recv(&h) {
            Resp::C2H { data, .. } => assert_eq!(data.len(), 4096),
            Resp::Cqe(c) => {
                assert_eq!(c.status(), Status::SUCCESS);
                assert!(done.insert(c.cid()), "CID {} answered twice", c.cid());
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(done, (100..132).collect());
}

/// Expects a C2HTermReq with `fes` (and `fei` when given), then a close.
fn expect_term(m: &mut Mem, h: &Host, fes: u16, fei: Option<u32>) {
    match m.recv(h) {
        Resp::Term {
            fes: f,
            fei: i,
            quoted,
        } => {
            assert_eq!(f, fes, "FES");
            if let Some(fei) = fei {
                assert_eq!(i, fei, "FEI");
            }
            assert!(quoted.len() <= 128);
        }
        other => panic!("expected C2HTermReq, got {other:?}"),
    }
    assert!(m.closed(), "connection closes after termination");
    // Nothing more is processed.
    m.send(&h.icreq(false, false));
    m.drain();
    assert!(m.inbox.is_empty());
}

#[test]
fn capsule_before_icreq() {
    let t = target();
    let mut m = Mem::new(&t, 1);
    let h = Host::new();
    let cmd = Command::connect(1, 0, 31, 0, 0);
    m.send(&h.capsule(&cmd, &[0u8; 1024]));
    expect_term(&mut m, &h, FES_PDU_SEQUENCE_ERROR, None);
}

#[test]
fn second_icreq() {
    let t = target();
    let mut m = Mem::new(&t, 2);
    let mut h = Host::new();
    init(&mut m, &mut h, false, false);
    m.send(&h.icreq(false, false));
    expect_term(&mut m, &h, FES_PDU_SEQUENCE_ERROR, None);
}

#[test]
fn unknown_pdu_type() {
    let t = target();
    let mut m = Mem::new(&t, 3);
    let mut h = Host::new();
    init(&mut m, &mut h, false, false);
    let mut p = h.capsule(&Command::new(0x18, 1), &[]);
    p[0] = 0x0b;
    m.send(&p);
    expect_term(&mut m, &h, FES_INVALID_HEADER_FIELD, Some(0));
}

#[test]
fn controller_pdu_from_host() {
    let t = target();
    let mut m = Mem::new(&t, 3);
    let mut h = Host::new();
    init(&mut m, &mut h, false, false);
    let mut p = h.capsule(&Command::new(0x18, 1), &[]);
    p[0] = PduType::R2T as u8;
    p[2] = 24;
    p.truncate(24);
    p[4..8].copy_from_slice(&24u32.to_le_bytes());
    m.send(&p);
    expect_term(&mut m, &h, FES_INVALID_HEADER_FIELD, Some(0));
}

#[test]
fn header_length_mismatch() {
    let t = target();
    let mut m = Mem::new(&t, 4);
    let mut h = Host::new();
    init(&mut m, &mut h, false, false);
    let mut p = h.capsule(&Command::new(0x18, 1), &[]);
    p[2] = 64;
    m.send(&p);
    expect_term(&mut m, &h, FES_INVALID_HEADER_FIELD, Some(2));
}

#[test]
fn pdu_length_overflow() {
    let t = target();
    let mut m = Mem::new(&t, 5);
    let mut h = Host::new();
    init(&mut m, &mut h, false, false);
    let mut p = h.capsule(&Command::new(0x01, 1), &[0u8; 512]);
    p[4..8].copy_from_slice(&0xffff_fff0u32.to_le_bytes());
    // Only the header arrives: the target must not wait for 4 GiB.
    m.send(&p[..72]);
    expect_term(&mut m, &h, FES_DATA_LIMIT_EXCEEDED, None);
}

#[test]
fn header_digest_error() {
    let t = target();
    let mut m = Mem::new(&t, 6);
    let mut h = Host::new();
    init(&mut m, &mut h, true, false);
    let mut p = h.capsule(&Command::new(0x18, 1), &[]);
    p[72] ^= 0xff;
    m.send(&p);
    expect_term(&mut m, &h, FES_HEADER_DIGEST_ERROR, None);
}

#[test]
fn io_before_connect() {
    let t = target();
    let mut m = Mem::new(&t, 7);
    let mut h = Host::new();
    init(&mut m, &mut h, false, false);
    let mut cmd = Command::new(0x02, 1);
    cmd.set_nsid(1);
    cmd.set_sgl(nvmf_wire::command::SglDescriptor::transport(512));
    m.send(&h.capsule(&cmd, &[]));
    expect_term(&mut m, &h, FES_PDU_SEQUENCE_ERROR, None);
}

/// A host→controller command with a Transport SGL before Connect: the
/// connection fails at once, without an R2T (no data is taken in).
#[test]
fn write_before_connect_gets_no_r2t() {
    let t = target();
    let mut m = Mem::new(&t, 8);
    let mut h = Host::new();
    init(&mut m, &mut h, false, false);
    let mut cmd = Command::new(0x01, 1);
    cmd.set_nsid(1);
    cmd.set_lba_range(0, 8);
    cmd.set_sgl(nvmf_wire::command::SglDescriptor::transport(4096));
    m.send(&h.capsule(&cmd, &[]));
    expect_term(&mut m, &h, FES_PDU_SEQUENCE_ERROR, Some(0));
}

/// Likewise an admin command with in-capsule data.
#[test]
fn admin_capsule_before_connect_is_fatal() {
    let t = target();
    let mut m = Mem::new(&t, 9);
    let mut h = Host::new();
    init(&mut m, &mut h, false, false);
    let mut cmd = Command::new(0x09, 1);
    cmd.set_sgl(nvmf_wire::command::SglDescriptor::in_capsule(0, 16));
    m.send(&h.capsule(&cmd, &[0u8; 16]));
    expect_term(&mut m, &h, FES_PDU_SEQUENCE_ERROR, Some(0));
}

fn r2t_for_write(m: &mut Mem, h: &Host, cid: u16, len: u32) -> u16 {
    let mut cmd = Command::new(0x01, cid);
    cmd.set_nsid(1);
    cmd.set_lba_range(0, len / 512);
    cmd.set_sgl(nvmf_wire::command::SglDescriptor::transport(len));
    m.send(&h.capsule(&cmd, &[]));
    match m.recv(h) {
        Resp::R2T {
            cccid, ttag, r2tl, ..
        } => {
            assert_eq!((cccid, r2tl), (cid, len));
            ttag
        }
        other => panic!("expected R2T, got {other:?}"),
    }
}

fn connected_io(seed: u64, digests: bool) -> (Arc<Target>, Mem, Mem, Host) {
    let t = target();
    let mut admin = Mem::new(&t, seed);
    let mut ah = Host::new();
    let cntlid = admin_up(&mut admin, &mut ah, digests, digests);
    let (io, h) = io_conn(&t, seed + 1, cntlid, digests);
    (t, admin, io, h)
}

#[test]
fn h2c_data_offset_outside_command() {
    let (_t, _a, mut m, h) = connected_io(20, false);
    let ttag = r2t_for_write(&mut m, &h, 5, 8192);
    m.send(&h.h2c(5, ttag, 8192, &[1u8; 512], true));
    expect_term(&mut m, &h, FES_DATA_OUT_OF_RANGE, Some(12));
}

#[test]
fn h2c_data_length_beyond_command() {
    let (_t, _a, mut m, h) = connected_io(21, false);
    let ttag = r2t_for_write(&mut m, &h, 5, 4096 + 512);
    m.send(&h.h2c(5, ttag, 0, &[1u8; 8192], true));
    expect_term(&mut m, &h, FES_DATA_OUT_OF_RANGE, None);
}

#[test]
fn large_h2c_data_with_bad_header_digest() {
    let (_t, _a, mut m, h) = connected_io(25, true);
    let ttag = r2t_for_write(&mut m, &h, 5, 65536);
    let mut p = h.h2c(5, ttag, 0, &[1u8; 65536], true);
    p[24] ^= 1;
    // Header plus a little payload: judged before the payload arrives.
    m.send(&p[..100]);
    expect_term(&mut m, &h, FES_HEADER_DIGEST_ERROR, None);
}

#[test]
fn large_h2c_data_out_of_range_before_payload() {
    let (_t, _a, mut m, h) = connected_io(26, false);
    let ttag = r2t_for_write(&mut m, &h, 5, 65536);
    let p = h.h2c(5, ttag, 4096, &[1u8; 65536], true);
    m.send(&p[..64]);
    expect_term(&mut m, &h, FES_DATA_OUT_OF_RANGE, Some(12));
}

#[test]
fn h2c_data_without_data_is_fatal() {
    let (_t, _a, mut m, h) = connected_io(27, false);
    let ttag = r2t_for_write(&mut m, &h, 5, 4096);
    m.send(&h.h2c(5, ttag, 0, &[], false));
    expect_term(&mut m, &h, FES_INVALID_HEADER_FIELD, Some(16));
}

#[test]
fn h2c_data_last_flag_must_mark_the_end() {
    // LAST on a PDU that does not end the transfer.
    let (_t, _a, mut m, h) = connected_io(28, false);
    let ttag = r2t_for_write(&mut m, &h, 5, 8192);
    m.send(&h.h2c(5, ttag, 0, &[1u8; 4096], true));
    expect_term(&mut m, &h, FES_INVALID_HEADER_FIELD, Some(1));

    // The PDU that ends the transfer without LAST.
    let (_t, _a, mut m, h) = connected_io(30, false);
    let ttag = r2t_for_write(&mut m, &h, 5, 8192);
    m.send(&h.h2c(5, ttag, 0, &[1u8; 4096], false));
    m.drain();
    assert!(m.inbox.is_empty(), "first half accepted silently");
    m.send(&h.h2c(5, ttag, 4096, &[1u8; 4096], false));
    expect_term(&mut m, &h, FES_INVALID_HEADER_FIELD, Some(1));

    // Same on the direct-placement path (large payload, header judged
    // before the payload arrives).
    let (_t, _a, mut m, h) = connected_io(32, false);
    let ttag = r2t_for_write(&mut m, &h, 5, 65536);
    let p = h.h2c(5, ttag, 0, &[1u8; 65536], false);
    m.send(&p[..64]);
    expect_term(&mut m, &h, FES_INVALID_HEADER_FIELD, Some(1));

    // Split correctly: accepted.
    let (_t, _a, mut m, h) = connected_io(34, false);
    let ttag = r2t_for_write(&mut m, &h, 5, 8192);
    m.send(&h.h2c(5, ttag, 0, &[1u8; 4096], false));
    m.send(&h.h2c(5, ttag, 4096, &[1u8; 4096], true));
    match m.recv(&h) {
        Resp::Cqe(c) => assert_eq!(c.status(), Status::SUCCESS),
        other => panic!("{other:?}"),
    }
}

#[test]
fn h2c_data_unknown_ttag() {
    let (_t, _a, mut m, h) = connected_io(22, false);
    let ttag = r2t_for_write(&mut m, &h, 5, 8192);
    m.send(&h.h2c(5, ttag + 40, 0, &[1u8; 512], false));
    expect_term(&mut m, &h, FES_INVALID_HEADER_FIELD, Some(10));
}

#[test]
fn cid_conflict_is_fatal() {
    let (_t, _a, mut m, h) = connected_io(23, false);
    r2t_for_write(&mut m, &h, 5, 8192);
    let mut cmd = Command::new(0x02, 5);
    cmd.set_nsid(1);
    cmd.set_sgl(nvmf_wire::command::SglDescriptor::transport(512));
    m.send(&h.capsule(&cmd, &[]));
    expect_term(&mut m, &h, FES_INVALID_HEADER_FIELD, Some(10));
}

#[test]
fn data_digest_errors_fail_the_command_only() {
    let (_t, _a, mut m, mut h) = connected_io(24, true);
    // In-capsule data with a bad digest.
    let mut cmd = Command::new(0x01, 9);
    cmd.set_nsid(1);
    cmd.set_lba_range(0, 1);
    cmd.set_sgl(nvmf_wire::command::SglDescriptor::in_capsule(0, 512));
    let mut p = h.capsule(&cmd, &[3u8; 512]);
    let n = p.len();
    p[n - 1] ^= 1;
    m.send(&p);
    match m.recv(&h) {
        Resp::Cqe(c) => assert_eq!(c.status(), Status::TRANSIENT_TRANSPORT_ERROR),
        other => panic!("{other:?}"),
    }
    // H2CData with a bad digest.
    let ttag = r2t_for_write(&mut m, &h, 10, 1024);
    let mut p = h.h2c(10, ttag, 0, &[4u8; 1024], true);
    let n = p.len();
    p[n - 2] ^= 1;
    m.send(&p);
    match m.recv(&h) {
        Resp::Cqe(c) => {
            assert_eq!(c.cid(), 10);
            assert_eq!(c.status(), Status::TRANSIENT_TRANSPORT_ERROR)
        }
        other => panic!("{other:?}"),
    }
    // A large H2CData (received in place) with a bad digest.
    let ttag = r2t_for_write(&mut m, &h, 11, 65536);
    let mut p = h.h2c(11, ttag, 0, &pattern(5, 65536), true);
    let n = p.len();
    p[n - 100] ^= 1;
    m.send(&p);
    match m.recv(&h) {
        Resp::Cqe(c) => {
            assert_eq!(c.cid(), 11);
            assert_eq!(c.status(), Status::TRANSIENT_TRANSPORT_ERROR)
        }
        other => panic!("{other:?}"),
    }
    // The connection still works.
    assert!(!m.closed());
    let d = pattern(3, 1024);
    assert_eq!(write(&mut m, &mut h, 4, &d, false), Status::SUCCESS);
    assert_eq!(read(&mut m, &mut h, 4, 1024).1, d);
}

#[test]
fn connect_rejections_keep_the_connection_open() {
    // As SPDK's target and nvmet: the host reads the status and hangs up
    // itself; only another Connect is accepted meanwhile (the reactor's
    // connect timeout bounds a connection that never gets connected).
    let t = target();
    // Host not on the allow list, then the allowed host on the same
    // connection.
    let mut m = Mem::new(&t, 30);
    let mut h = Host::new();
    init(&mut m, &mut h, false, false);
    let c = connect(
        &mut m,
        &mut h,
        0,
        31,
        CNTLID_DYNAMIC,
        RESTRICTED_NQN,
        HOSTNQN,
    );
    assert_eq!((c.status().sct, c.status().sc), (1, 0x84));
    assert!(!m.closed(), "{:?}", m.conn.close_reason());
    let c = connect(
        &mut m,
        &mut h,
        0,
        31,
        CNTLID_DYNAMIC,
        RESTRICTED_NQN,
        ALLOWED_HOST,
    );
    assert_eq!(c.status(), Status::SUCCESS);
    assert!(!m.closed());
    // Unknown subsystem.
    let mut m = Mem::new(&t, 32);
    let mut h = Host::new();
    init(&mut m, &mut h, false, false);
    let c = connect(
        &mut m,
        &mut h,
        0,
        31,
        CNTLID_DYNAMIC,
        "nqn.2024-01.io.nvmfd:nope",
        HOSTNQN,
    );
    assert_eq!((c.status().sct, c.status().sc), (1, 0x82));
    assert!(!m.closed(), "{:?}", m.conn.close_reason());
}

#[test]
fn garbage_never_panics() {
    let t = target();
    for seed in 1..300u64 {
        let mut m = Mem::new(&t, seed);
        let mut h = Host::new();
        if seed % 2 == 0 {
            init(&mut m, &mut h, seed % 4 == 0, seed % 3 == 0);
        }
        let mut junk = pattern(seed, 64 + (seed as usize * 37) % 3000);
        // Make it look like a PDU more often than not.
        if seed % 3 != 0 {
            junk[0] = (seed % 10) as u8;
            junk[2] = [8u8, 24, 72, 128][(seed % 4) as usize];
        }
        m.send(&junk);
        m.drain();
        // Whatever the target said decodes whole; it either ended with a
        // C2HTermReq and closed, or waits for the rest of a PDU.
        let got = h.parse(&mut m.inbox).expect("target output decodes");
        assert!(
            m.inbox.is_empty(),
            "seed {seed}: a partial PDU from the target"
        );
        if m.closed() {
            assert!(
                matches!(got.last(), Some(Resp::Term { .. })),
                "seed {seed}: closed without a C2HTermReq: {got:?}"
            );
        } else {
            assert!(
                m.conn.has_partial_input(),
                "seed {seed}: garbage neither rejected nor awaited: {got:?}"
            );
        }
    }
}

#[test]
fn large_h2c_payload_is_placed_directly() {
    for digests in [false, true] {
        let (_t, _a, mut m, mut h) = connected_io(40, digests);
        let ttag = r2t_for_write(&mut m, &h, 5, 65536);
        let data = pattern(41, 65536);
        let p = h.h2c(5, ttag, 0, &data, true);
        m.conn.feed(&p[..30]);
        m.conn.feed(&p[30..1000]);
        m.conn.feed(&p[1000..40000]);
        m.conn.feed(&p[40000..p.len() - 2]);
        assert_eq!(m.conn.stats().direct_h2c, 1);
        assert!(m.conn.has_partial_input());
        m.conn.feed(&p[p.len() - 2..]);
        match m.recv(&h) {
            Resp::Cqe(c) => assert_eq!(c.status(), Status::SUCCESS),
            other => panic!("{other:?}"),
        }
        assert!(!m.conn.has_partial_input());
        assert_eq!(read(&mut m, &mut h, 0, 65536).1, data);
    }
}

#[test]
fn c2h_success_flag_when_sq_flow_control_is_disabled() {
    use nvmf_wire::command::SglDescriptor;
    use nvmf_wire::fabrics::{ConnectData, CATTR_DISABLE_SQ_FLOW_CONTROL};
    use zerocopy::IntoBytes;
    let t = target();
    let mut admin = Mem::new(&t, 50);
    let mut ah = Host::new();
    let cntlid = admin_up(&mut admin, &mut ah, false, false);
    let mut m = Mem::new(&t, 51);
    let mut h = Host::new();
    init(&mut m, &mut h, false, false);
    let cmd = Command::connect(1, 1, 31, CATTR_DISABLE_SQ_FLOW_CONTROL, 0);
    let cd = ConnectData::new([7; 16], cntlid, DEFAULT_NQN, HOSTNQN);
    let (c, _) = exec(&mut m, &h, cmd, Out::InCapsule(cd.as_bytes()), 0);
    assert_eq!(c.status(), Status::SUCCESS);
    let data = pattern(52, 4096);
    assert_eq!(write(&mut m, &mut h, 0, &data, true), Status::SUCCESS);
    for i in 0..3u16 {
        let mut cmd = Command::new(0x02, 200 + i);
        cmd.set_nsid(1);
        cmd.set_lba_range(0, 8);
        cmd.set_sgl(SglDescriptor::transport(4096));
        m.send(&h.capsule(&cmd, &[]));
        match m.recv(&h) {
            Resp::C2H {
                cccid,
                data: d,
                last,
                success,
                ..
            } => {
                assert_eq!(cccid, 200 + i);
                assert!(
                    last && success,
                    "SUCCESS flag replaces the response capsule"
                );
                assert_eq!(d, data);
            }
            other => panic!("{other:?}"),
        }
    }
    // No response capsules were queued behind the data.
    m.drain();
    assert!(h.parse(&mut m.inbox).unwrap().is_empty());
}

/// `c2h_success: false` (SPDK's `nvmf_create_transport` option): even with
/// SQ flow control disabled, reads end with a response capsule, not with a
/// SUCCESS-flagged C2HData.
#[test]
fn c2h_success_off_keeps_response_capsules() {
    use nvmf_wire::command::SglDescriptor;
    use nvmf_wire::fabrics::{ConnectData, CATTR_DISABLE_SQ_FLOW_CONTROL};
    use zerocopy::IntoBytes;
    let t = target();
    let mut admin = Mem::new(&t, 55);
    let mut ah = Host::new();
    let cntlid = admin_up(&mut admin, &mut ah, false, false);
    let mut m = Mem::new(&t, 56);
    m.conn = Connection::new(t.clone(), port(), &TcpParams::new(t.limits(), false));
    let mut h = Host::new();
    init(&mut m, &mut h, false, false);
    let cmd = Command::connect(1, 1, 31, CATTR_DISABLE_SQ_FLOW_CONTROL, 0);
    let cd = ConnectData::new([7; 16], cntlid, DEFAULT_NQN, HOSTNQN);
    let (c, _) = exec(&mut m, &h, cmd, Out::InCapsule(cd.as_bytes()), 0);
    assert_eq!(c.status(), Status::SUCCESS);
    let mut cmd = Command::new(0x02, 300);
    cmd.set_nsid(1);
    cmd.set_lba_range(0, 8);
    cmd.set_sgl(SglDescriptor::transport(4096));
    m.send(&h.capsule(&cmd, &[]));
    match m.recv(&h) {
        Resp::C2H { last, success, .. } => assert!(last && !success, "no SUCCESS flag"),
        other => panic!("{other:?}"),
    }
    match m.recv(&h) {
        Resp::Cqe(c) => assert_eq!((c.cid(), c.status()), (300, Status::SUCCESS)),
        other => panic!("expected a response capsule, got {other:?}"),
    }
}

#[test]
fn async_event_request_completes_through_poll() {
    let t = target();
    let mut admin = Mem::new(&t, 60);
    let mut ah = Host::new();
    admin_up(&mut admin, &mut ah, false, false);
    // Enable namespace attribute notices (Set Features 0x0b, bit 8).
    let mut sf = Command::new(0x09, 70);
    sf.set_cdw10(0x0b);
    sf.set_cdw11(1 << 8);
    let (c, _) = exec(&mut admin, &ah, sf, Out::None, 0);
    assert_eq!(c.status(), Status::SUCCESS);
    let aer = Command::new(0x0c, 71);
    admin.send(&ah.capsule(&aer, &[]));
    admin.drain();
    assert!(admin.inbox.is_empty(), "AER stays outstanding");
    let ns = nvmf_config::NamespaceConfig {
        nsid: 2,
        bdev_name: "Malloc1".into(),
        nguid: [2; 16],
        eui64: [2; 8],
        uuid: [2; 16],
        anagrpid: 1,
        ptpl_file: None,
    };
    t.add_namespace(DEFAULT_NQN, &ns).expect("add namespace");
    admin.conn.poll(std::time::Instant::now());
    match admin.recv(&ah) {
        Resp::Cqe(c) => {
            assert_eq!(c.cid(), 71);
            assert_eq!(c.status(), Status::SUCCESS);
        }
        other => panic!("{other:?}"),
    }
    // The AER's slot was freed: its CID can be used again.
    let (c, _) = exec(&mut admin, &ah, Command::new(0x18, 71), Out::None, 0);
    assert_eq!(c.status(), Status::SUCCESS);
}

/// SPDK's host cancels its outstanding AERs locally when it detaches and
/// reuses their command IDs for the shutdown commands: the target drops the
/// abandoned AER (no completion for it) and runs the new command, instead
/// of terminating the admin connection. A collision with any other
/// outstanding command stays fatal (`cid_conflict_is_fatal`).
#[test]
fn command_reusing_an_outstanding_aer_id_replaces_it() {
    let t = target();
    let mut admin = Mem::new(&t, 61);
    let mut ah = Host::new();
    admin_up(&mut admin, &mut ah, false, false);
    for cid in [80u16, 81] {
        admin.send(&ah.capsule(&Command::new(0x0c, cid), &[]));
    }
    admin.drain();
    assert!(admin.inbox.is_empty(), "AERs stay outstanding");
    // Keep Alive with the first AER's ID: answered, connection kept.
    let (c, _) = exec(&mut admin, &ah, Command::new(0x18, 80), Out::None, 0);
    assert_eq!((c.cid(), c.status()), (80, Status::SUCCESS));
    assert!(admin.conn.close_reason().is_none());
    // The second AER is still outstanding and still delivers an event;
    // the abandoned one never completes.
    let mut sf = Command::new(0x09, 70);
    sf.set_cdw10(0x0b);
    sf.set_cdw11(1 << 8);
    let (c, _) = exec(&mut admin, &ah, sf, Out::None, 0);
    assert_eq!(c.status(), Status::SUCCESS);
    let ns = nvmf_config::NamespaceConfig {
        nsid: 2,
        bdev_name: "Malloc1".into(),
        nguid: [2; 16],
        eui64: [2; 8],
        uuid: [2; 16],
        anagrpid: 1,
        ptpl_file: None,
    };
    t.add_namespace(DEFAULT_NQN, &ns).expect("add namespace");
    admin.conn.poll(std::time::Instant::now());
    match admin.recv(&ah) {
        Resp::Cqe(c) => assert_eq!((c.cid(), c.status()), (81, Status::SUCCESS)),
        other => panic!("{other:?}"),
    }
    admin.conn.poll(std::time::Instant::now());
    admin.drain();
    assert!(
        admin.inbox.is_empty(),
        "the abandoned AER must not complete"
    );
}

// ---------------------------------------------------------------------------
// Bounded memory: buffer budget, R2T allowance, H2CData timeout, SQHD
// ---------------------------------------------------------------------------

use nvmf_tcp::BufPolicy;
use std::time::{Duration, Instant};

impl Mem {
    fn with_params(t: &Arc<Target>, seed: u64, params: &TcpParams) -> Mem {
        Mem {
            conn: Connection::new(t.clone(), port(), params),
            inbox: Vec::new(),
            parsed: VecDeque::new(),
            rng: seed | 1,
        }
    }
}

/// Parameters with a data buffer budget of `budget` bytes (4 KiB retained
/// per slot, 128 KiB largest buffer).
fn small_budget(t: &Arc<Target>, budget: usize) -> TcpParams {
    let mut p = TcpParams::new(t.limits(), true);
    p.buffers = BufPolicy::new(budget, 4096, 131072);
    p
}

/// An admin queue and `n` I/O queues of one controller, all sharing `params`.
fn queues(t: &Arc<Target>, params: &TcpParams, n: u16, seed: u64) -> (Mem, Vec<(Mem, Host)>) {
    let mut admin = Mem::with_params(t, seed, params);
    let mut ah = Host::new();
    let cntlid = admin_up(&mut admin, &mut ah, false, false);
    let io = (1..=n)
        .map(|qid| {
            let mut m = Mem::with_params(t, seed + u64::from(qid), params);
            let mut h = Host::new();
            init(&mut m, &mut h, false, false);
            let c = connect(&mut m, &mut h, qid, 63, cntlid, DEFAULT_NQN, HOSTNQN);
            assert_eq!(c.status(), Status::SUCCESS, "I/O connect");
            (m, h)
        })
        .collect();
    (admin, io)
}

/// Sends a write of `len` bytes (transport SGL) without waiting for anything.
fn send_write(m: &mut Mem, h: &Host, cid: u16, slba: u64, len: u32) {
    let mut cmd = Command::new(0x01, cid);
    cmd.set_nsid(1);
    cmd.set_lba_range(slba, len / 512);
    cmd.set_sgl(nvmf_wire::command::SglDescriptor::transport(len));
    m.send(&h.capsule(&cmd, &[]));
}

/// Every PDU the target has queued so far.
fn all_output(m: &mut Mem, h: &Host) -> Vec<Resp> {
    m.drain();
    let mut v: Vec<Resp> = m.parsed.drain(..).collect();
    v.extend(h.parse(&mut m.inbox).expect("target output decodes"));
    v
}

fn r2ts(v: &[Resp]) -> Vec<(u16, u16)> {
    v.iter()
        .filter_map(|r| match r {
            Resp::R2T { cccid, ttag, .. } => Some((*cccid, *ttag)),
            _ => None,
        })
        .collect()
}

/// Sends the whole H2CData of a write whose R2T came.
fn send_data(m: &mut Mem, h: &Host, cid: u16, ttag: u16, data: &[u8]) {
    let mut bytes = Vec::new();
    let mut off = 0;
    while off < data.len() {
        let n = (data.len() - off).min(h.maxh2cdata as usize);
        bytes.extend(h.h2c(
            cid,
            ttag,
            off as u32,
            &data[off..off + n],
            off + n == data.len(),
        ));
        off += n;
    }
    m.send(&bytes);
}

#[test]
fn exhausted_budget_makes_commands_wait_then_proceed() {
    let t = target();
    let params = small_budget(&t, 256 * 1024);
    let budget = params.buffers.budget.clone();
    let (_admin, mut io) = queues(&t, &params, 2, 100);
    let (mut a, ha) = io.remove(0);
    // Three 128 KiB writes: two fit the budget, the third waits (no R2T).
    for cid in 1..=3u16 {
        send_write(&mut a, &ha, cid, u64::from(cid) * 256, 131072);
    }
    let out = all_output(&mut a, &ha);
    let got = r2ts(&out);
    assert_eq!(got.iter().map(|r| r.0).collect::<Vec<_>>(), vec![1, 2]);
    assert_eq!(a.conn.waiting_for_buffer(), 1);
    assert_eq!(a.conn.stats().buffer_waits, 1);
    assert_eq!(budget.used(), 256 * 1024);
    assert_eq!(budget.waiting(), 1, "the connection counts as a waiter");
    // A read of 64 KiB on the same connection queues behind it (FIFO).
    let mut rd = Command::new(0x02, 4);
    rd.set_nsid(1);
    rd.set_lba_range(1024, 128);
    rd.set_sgl(nvmf_wire::command::SglDescriptor::transport(65536));
    a.send(&ha.capsule(&rd, &[]));
    assert!(all_output(&mut a, &ha).is_empty());
    assert_eq!(a.conn.waiting_for_buffer(), 2);

    // Another queue with nothing charged still gets its buffer (overdraft):
    // no connection can be starved by others.
    let (mut b, hb) = io.remove(0);
    send_write(&mut b, &hb, 9, 0, 131072);
    let got_b = r2ts(&all_output(&mut b, &hb));
    assert_eq!(got_b.len(), 1, "an empty connection always gets one buffer");
    send_data(&mut b, &hb, 9, got_b[0].1, &pattern(9, 131072));
    match b.recv(&hb) {
        Resp::Cqe(c) => assert_eq!(c.status(), Status::SUCCESS),
        other => panic!("{other:?}"),
    }

    // The first write's data arrives: it completes, its buffer is freed
    // (pressure) and the waiting write gets its R2T at once.
    let d1 = pattern(1, 131072);
    send_data(&mut a, &ha, 1, got[0].1, &d1);
    let out = all_output(&mut a, &ha);
    assert!(out
        .iter()
        .any(|r| matches!(r, Resp::Cqe(c) if c.cid() == 1 && c.status() == Status::SUCCESS)));
    let got3 = r2ts(&out);
    assert_eq!(got3.iter().map(|r| r.0).collect::<Vec<_>>(), vec![3]);
    assert!(budget.used() <= 256 * 1024 + 131072);
    // Finish everything; the read runs once room frees up.
    let d2 = pattern(2, 131072);
    send_data(&mut a, &ha, 2, got[1].1, &d2);
    let d3 = pattern(3, 131072);
    send_data(&mut a, &ha, 3, got3[0].1, &d3);
    let mut done = Vec::new();
    let mut read_data = Vec::new();
    for r in all_output(&mut a, &ha) {
        match r {
            Resp::Cqe(c) => {
                assert_eq!(c.status(), Status::SUCCESS);
                done.push(c.cid());
            }
            Resp::C2H { cccid, data, .. } => {
                assert_eq!(cccid, 4);
                read_data.extend(data);
            }
            other => panic!("{other:?}"),
        }
    }
    done.sort_unstable();
    assert_eq!(done, vec![2, 3, 4]);
    assert!(
        read_data == vec![0u8; 65536],
        "LBAs 1024..1152 were never written"
    );
    assert_eq!(a.conn.waiting_for_buffer(), 0);
    assert_eq!(budget.waiting(), 0);
    // Data went where it should.
    let mut a2 = a;
    let mut ha2 = ha;
    assert!(read(&mut a2, &mut ha2, 3 * 256, 131072).1 == d3);
    drop(a2);
    drop(b);
    drop(io);
    assert_eq!(
        budget.used(),
        0,
        "closed connections give their buffers back"
    );
}

#[test]
fn idle_buffers_are_freed_under_pressure_only() {
    let t = target();
    let params = small_budget(&t, 256 * 1024);
    let budget = params.buffers.budget.clone();
    let (_admin, mut io) = queues(&t, &params, 2, 120);
    let (mut a, mut ha) = io.remove(0);
    let (mut b, hb) = io.remove(0);
    // A 128 KiB read on A: its buffer stays allocated (no pressure) and
    // is reused by the next read without another charge.
    assert_eq!(read(&mut a, &mut ha, 0, 131072).0, Status::SUCCESS);
    assert_eq!(a.conn.buffer_bytes_charged(), 131072);
    assert_eq!(read(&mut a, &mut ha, 0, 131072).0, Status::SUCCESS);
    assert_eq!(budget.used(), 131072);
    // B takes the rest, then needs more: it waits, which is pressure.
    send_write(&mut b, &hb, 1, 0, 131072);
    send_write(&mut b, &hb, 2, 256, 131072);
    let got = r2ts(&all_output(&mut b, &hb));
    assert_eq!(got.len(), 1);
    assert_eq!(b.conn.waiting_for_buffer(), 1);
    assert!(budget.under_pressure());
    // A's tick frees its idle buffer; B's tick then starts the waiter.
    let now = Instant::now();
    a.conn.poll(now);
    assert_eq!(
        a.conn.buffer_bytes_charged(),
        0,
        "idle buffer freed under pressure"
    );
    b.conn.poll(now);
    let got2 = r2ts(&all_output(&mut b, &hb));
    assert_eq!(got2.iter().map(|r| r.0).collect::<Vec<_>>(), vec![2]);
    assert_eq!(b.conn.waiting_for_buffer(), 0);
    assert_eq!(budget.waiting(), 0);
}

#[test]
fn r2t_allowance_bounds_outstanding_write_data() {
    let t = target();
    let mut params = TcpParams::new(t.limits(), true);
    params.max_r2t_bytes = 131072;
    let budget = params.buffers.budget.clone();
    let (_admin, mut io) = queues(&t, &params, 1, 140);
    let (mut m, h) = io.remove(0);
    for cid in 1..=3u16 {
        send_write(&mut m, &h, cid, u64::from(cid) * 256, 65536);
    }
    let got = r2ts(&all_output(&mut m, &h));
    assert_eq!(got.iter().map(|r| r.0).collect::<Vec<_>>(), vec![1, 2]);
    assert_eq!(m.conn.r2ts_outstanding(), 2);
    assert_eq!(m.conn.waiting_for_buffer(), 1);
    assert_eq!(
        budget.waiting(),
        0,
        "waiting for R2T allowance is not budget pressure"
    );
    send_data(&mut m, &h, 1, got[0].1, &pattern(1, 65536));
    let out = all_output(&mut m, &h);
    assert_eq!(r2ts(&out).iter().map(|r| r.0).collect::<Vec<_>>(), vec![3]);
    // One R2T is always allowed, whatever its size.
    let mut params = TcpParams::new(t.limits(), true);
    params.max_r2t_bytes = 4096;
    let (_admin, mut io) = queues(&t, &params, 1, 150);
    let (mut m, mut h) = io.remove(0);
    let d = pattern(7, 131072);
    assert_eq!(write(&mut m, &mut h, 0, &d, false), Status::SUCCESS);
}

#[test]
fn unanswered_r2t_times_out_and_closes() {
    let t = target();
    let mut params = TcpParams::new(t.limits(), true);
    params.h2c_timeout = Duration::from_secs(2);
    let (_admin, mut io) = queues(&t, &params, 1, 160);
    let (mut m, mut h) = io.remove(0);
    let start = Instant::now();
    m.conn.poll(start);
    // Data that arrives in time: no close, however long the queue idles.
    let d = pattern(8, 65536);
    assert_eq!(write(&mut m, &mut h, 0, &d, false), Status::SUCCESS);
    m.conn.poll(start + Duration::from_secs(10));
    assert!(!m.closed());
    // R2Ts left unanswered: closed once the oldest is older than 2 s.
    let t0 = start + Duration::from_secs(10);
    send_write(&mut m, &h, 50, 0, 65536);
    send_write(&mut m, &h, 51, 128, 65536);
    assert_eq!(r2ts(&all_output(&mut m, &h)).len(), 2);
    assert_eq!(m.conn.r2ts_outstanding(), 2);
    m.conn.poll(t0 + Duration::from_millis(1900));
    assert!(!m.closed(), "not before the timeout");
    m.conn.poll(t0 + Duration::from_millis(2100));
    assert_eq!(m.conn.close_reason(), Some("H2CData timeout"));
}

#[test]
fn transport_failed_completions_carry_sqhd() {
    let (_t, _a, mut m, h) = connected_io(170, true);
    // After Connect (SQHD 1), a data digest error is the second command.
    let mut cmd = Command::new(0x01, 9);
    cmd.set_nsid(1);
    cmd.set_lba_range(0, 1);
    cmd.set_sgl(nvmf_wire::command::SglDescriptor::in_capsule(0, 512));
    let mut p = h.capsule(&cmd, &[3u8; 512]);
    let n = p.len();
    p[n - 1] ^= 1;
    m.send(&p);
    match m.recv(&h) {
        Resp::Cqe(c) => {
            assert_eq!(c.status(), Status::TRANSIENT_TRANSPORT_ERROR);
            assert_eq!((c.sqid(), c.sqhd()), (1, 2));
        }
        other => panic!("{other:?}"),
    }
    // A bad SGL type (keyed data block) is the third; a good command the fourth.
    let mut cmd = Command::new(0x02, 10);
    cmd.set_nsid(1);
    let mut sgl = nvmf_wire::command::SglDescriptor::transport(512);
    sgl.id = 0x40;
    cmd.set_sgl(sgl);
    m.send(&h.capsule(&cmd, &[]));
    match m.recv(&h) {
        Resp::Cqe(c) => {
            assert_eq!(c.status(), Status::SGL_INVALID_DESCRIPTOR_TYPE.with_dnr());
            assert_eq!(c.sqhd(), 3);
        }
        other => panic!("{other:?}"),
    }
    let mut cmd = Command::new(0x00, 11);
    cmd.set_nsid(1);
    m.send(&h.capsule(&cmd, &[]));
    match m.recv(&h) {
        Resp::Cqe(c) => assert_eq!((c.status(), c.sqhd()), (Status::SUCCESS, 4)),
        other => panic!("{other:?}"),
    }
}

#[test]
fn backend_pending_counts_io_commands_only() {
    let t = target();
    let mut admin = Mem::new(&t, 180);
    let mut ah = Host::new();
    admin_up(&mut admin, &mut ah, false, false);
    // An outstanding AER executes on the admin queue but is no bdev I/O.
    admin.send(&ah.capsule(&Command::new(0x0c, 77), &[]));
    admin.drain();
    assert!(admin.conn.has_executing());
    assert_eq!(admin.conn.backend_pending(), 0);
}

/// A host that sends commands but never reads its socket: the reactor reads
/// only while `wants_read()`, and that turns false once a bounded amount of
/// response bytes is queued (not at the 16 MiB that slot data may use).
#[test]
fn host_that_never_reads_cannot_grow_the_send_queue() {
    let (_t, _a, mut m, h) = connected_io(190, false);
    let mut batch = Vec::new();
    let mut sent = 0u32;
    let mut cid = 0u16;
    while m.conn.wants_read() && sent < 200_000 {
        batch.clear();
        for _ in 0..100 {
            cid = cid.wrapping_add(1);
            let mut cmd = Command::new(0x00, cid); // Flush: completes at once
            cmd.set_nsid(1);
            batch.extend(h.capsule(&cmd, &[]));
        }
        m.conn.feed(&batch);
        sent += 100;
        assert!(!m.closed(), "{:?}", m.conn.close_reason());
    }
    assert!(!m.conn.wants_read(), "reading stops after {sent} commands");
    let queued = m.conn.output_len();
    assert!(
        queued <= (256 << 10) + 100 * 24,
        "{queued} bytes queued after {sent} unanswered commands"
    );
    // Once the host reads, the connection takes commands again.
    m.drain();
    assert!(m.conn.wants_read());
    let got = h.parse(&mut m.inbox).unwrap();
    assert_eq!(got.len(), sent as usize);
}

/// A null namespace's read sends zeroes from the shared zero buffer, never
/// what the slot's buffer held before (here: a malloc read of a pattern on
/// the same connection), with a correct data digest.
#[test]
fn null_read_sends_zeroes_not_the_slot_buffer() {
    let json = config_json(4420).replace(
        r#"{"method":"bdev_malloc_create","params":{"name":"Malloc1","block_size":512,"num_blocks":2048}}"#,
        r#"{"method":"bdev_malloc_create","params":{"name":"Malloc1","block_size":512,"num_blocks":2048}},
   {"method":"bdev_null_create","params":{"name":"Null0","block_size":512,"num_blocks":2048}}"#,
    );
    let json = json.replacen(
        r#"{"nsid":1,"bdev_name":"Malloc0"}}},"#,
        r#"{"nsid":1,"bdev_name":"Malloc0"}}},
   {"method":"nvmf_subsystem_add_ns","params":{"nqn":"nqn.2024-01.io.nvmfd:default","namespace":{"nsid":2,"bdev_name":"Null0"}}},"#,
        1,
    );
    assert!(json.contains("Null0\"}}}"), "null namespace added: {json}");
    let t = Target::from_config(&TargetConfig::from_json_str(&json).expect("config")).unwrap();
    let mut admin = Mem::new(&t, 90);
    let mut ah = Host::new();
    let cntlid = admin_up(&mut admin, &mut ah, true, true);
    let (mut m, mut h) = io_conn(&t, 91, cntlid, true);
    let data = pattern(92, 64 * 1024);
    assert_eq!(write(&mut m, &mut h, 0, &data, false), Status::SUCCESS);
    for len in [4096usize, 64 * 1024] {
        // The slot buffer now holds the pattern ...
        let (s, d) = read(&mut m, &mut h, 0, len);
        assert_eq!(s, Status::SUCCESS);
        assert!(d == data[..len], "malloc read back");
        // ... and a null read on the same connection sends zeroes.
        let mut cmd = Command::new(0x02, h.cid());
        cmd.set_nsid(2);
        cmd.set_lba_range(0, (len / 512) as u32);
        let (c, d) = exec(&mut m, &h, cmd, Out::None, len as u32);
        assert_eq!(c.status(), Status::SUCCESS);
        assert_eq!(d.len(), len);
        assert!(
            d.iter().all(|&b| b == 0),
            "null read of {len} bytes sent non-zero data"
        );
    }
    assert!(!m.closed());
}

/// Queue placement hands a connected queue to another reactor thread: only
/// while no command executes (an outstanding AER counts), and the moved
/// connection keeps serving on the new thread.
#[test]
fn connection_moves_to_another_thread_only_when_idle() {
    let t = target();
    let mut admin = Mem::new(&t, 200);
    let mut ah = Host::new();
    admin_up(&mut admin, &mut ah, false, false);
    assert!(admin.conn.movable());
    admin.send(&ah.capsule(&Command::new(0x0c, 77), &[]));
    admin.drain();
    assert!(!admin.conn.movable(), "an AER is executing");
    assert!(!admin.conn.adopt_current_thread());

    let (_t, _a, mut m, h) = connected_io(202, false);
    assert!(m.conn.movable());
    std::thread::spawn(move || {
        assert!(m.conn.adopt_current_thread());
        let mut cmd = Command::new(0x00, 5); // Flush
        cmd.set_nsid(1);
        m.send(&h.capsule(&cmd, &[]));
        match m.recv(&h) {
            Resp::Cqe(c) => assert_eq!((c.cid(), c.status()), (5, Status::SUCCESS)),
            other => panic!("{other:?}"),
        }
    })
    .join()
    .unwrap();
}
