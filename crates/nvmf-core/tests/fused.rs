//! Fused Compare and Write in the request engine (any transport):
//! pairing in arrival order (a lone first or second half gets Command
//! Aborted due to Missing Fused Command, reserved FUSE 11b Invalid Field),
//! the statuses of a match, a miscompare and a bad pair, a pair whose
//! Write comes through a fetch (R2T / RDMA READ) while its Compare waits,
//! and the write gate: a compare-and-write waits for writes already in a
//! backend, and writes from other queues wait (parked, not failed) while
//! it runs.

use std::sync::Arc;
use std::time::{Duration, Instant};

use nvmf_config::{BdevKind, TransportType};
use nvmf_core::request::{DataDesc, DataOut, Fabric, RequestEngine, RequestParams, SglKind, Slots};
use nvmf_core::{fused, qos};
use nvmf_core::{PortInfo, Target};
use nvmf_testkit::inproc::{self, rw};
use nvmf_wire::command::{Command, SglDescriptor};
use nvmf_wire::completion::Completion;
use nvmf_wire::fabrics::{ConnectData, CC};
use nvmf_wire::opcode::IoOpcode;
use nvmf_wire::status::Status;
use nvmf_wire::zerocopy::IntoBytes;

const NQN: &str = "nqn.2024-01.io.nvmfd:fused";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-0000000000e2";
/// Keyed SGL Data Block (the transport moves the data).
const KEYED: u8 = 0x40;
/// Data Block, subtype offset (in-capsule data).
const IN_CAPSULE: u8 = 0x01;

/// A fabric that records responses (CID, status, read data) and every
/// completion's dword 0.
#[derive(Default)]
struct Rec {
    done: Vec<(u16, Status, Vec<u8>)>,
    dw0: Vec<(u16, u32)>,
    /// Slots whose host data was asked for (never delivered here).
    fetches: Vec<u16>,
}

impl Fabric for Rec {
    fn describe(&self, sgl: &SglDescriptor) -> DataDesc {
        let id = (sgl.sgl_type() << 4) | sgl.subtype();
        let b = sgl.as_bytes();
        match id {
            KEYED => DataDesc {
                kind: SglKind::Transport,
                len: u32::from_le_bytes([b[8], b[9], b[10], 0]),
            },
            IN_CAPSULE => DataDesc {
                kind: SglKind::InCapsule,
                len: sgl.length(),
            },
            _ => DataDesc {
                kind: SglKind::Unsupported,
                len: sgl.length(),
            },
        }
    }

    fn fetch(&mut self, _: &mut Slots, idx: u16, _: u32) {
        self.fetches.push(idx);
    }

    fn respond(
        &mut self,
        slots: &Slots,
        idx: u16,
        cqe: &Completion,
        data: DataOut,
        _: bool,
    ) -> bool {
        let bytes = match data {
            DataOut::Slot(len) => slots.get(idx).unwrap().data(len as usize).to_vec(),
            DataOut::Zeroes(z) => z.to_vec(),
            DataOut::None => Vec::new(),
        };
        self.done.push((cqe.cid(), cqe.status(), bytes));
        self.dw0.push((cqe.cid(), cqe.dw0()));
        false
    }

    fn respond_unslotted(&mut self, cqe: &Completion) {
        self.done.push((cqe.cid(), cqe.status(), Vec::new()));
    }
}

fn params() -> RequestParams {
    inproc::rdma_request_params(1 << 20, Duration::from_secs(2))
}

fn connect(
    fab: &mut Rec,
    t: &Arc<Target>,
    port: &Arc<PortInfo>,
    qid: u16,
    cntlid: u16,
) -> RequestEngine {
    let mut e = RequestEngine::new(t.clone(), port.clone(), &params());
    let mut cmd = Command::connect(1, qid, 31, 0, 0);
    let mut data = ConnectData::new([9; 16], cntlid, NQN, HOST)
        .as_bytes()
        .to_vec();
    cmd.set_sgl(SglDescriptor::new(IN_CAPSULE, 0, data.len() as u32));
    e.on_command(fab, &cmd, &mut data, true, 0)
        .expect("connect");
    assert_eq!(fab.done.pop().map(|d| d.1), Some(Status::SUCCESS));
    if qid == 0 {
        let cc = Command::property_set(2, CC, false, 0x0046_0001);
        e.on_command(fab, &cc, &mut [], true, 0)
            .expect("property set");
        assert_eq!(fab.done.pop().map(|d| d.1), Some(Status::SUCCESS));
    }
    e
}

fn caw_half(op: IoOpcode, fuse: u8, cid: u16, lba: u64, nlb: u32, sgl: SglDescriptor) -> Command {
    let mut c = rw(op, cid, lba, nlb, sgl);
    c.flags = (c.flags & !0x03) | fuse;
    c
}

fn compare(cid: u16, lba: u64) -> Command {
    caw_half(
        IoOpcode::Compare,
        fused::FUSE_FIRST,
        cid,
        lba,
        1,
        SglDescriptor::new(IN_CAPSULE, 0, 512),
    )
}

fn fused_write(cid: u16, lba: u64) -> Command {
    caw_half(
        IoOpcode::Write,
        fused::FUSE_SECOND,
        cid,
        lba,
        1,
        SglDescriptor::new(IN_CAPSULE, 0, 512),
    )
}

fn write(cid: u16, lba: u64) -> Command {
    rw(
        IoOpcode::Write,
        cid,
        lba,
        1,
        SglDescriptor::new(IN_CAPSULE, 0, 512),
    )
}

fn read(cid: u16, lba: u64) -> Command {
    rw(
        IoOpcode::Read,
        cid,
        lba,
        1,
        SglDescriptor::new(KEYED, 0, 512),
    )
}

fn status_of(fab: &Rec, cid: u16) -> Option<Status> {
    fab.done.iter().find(|d| d.0 == cid).map(|d| d.1)
}

fn setup() -> (Arc<Target>, Rec, RequestEngine, RequestEngine) {
    let t = inproc::target(NQN, TransportType::Rdma, BdevKind::Malloc, 512, 4096);
    let port = inproc::port(TransportType::Rdma, inproc::KEYED_CAPS);
    let mut fab = Rec::default();
    let admin = connect(&mut fab, &t, &port, 0, 0xFFFF);
    let cntlid = admin.queue().controller().unwrap().cntlid();
    let io = connect(&mut fab, &t, &port, 1, cntlid);
    fab.done.clear();
    (t, fab, admin, io)
}

/// Sends `cmd` with `fill` × len as its in-capsule data.
fn send(io: &mut RequestEngine, fab: &mut Rec, cmd: &Command, fill: u8) {
    let mut d = vec![fill; cmd.sgl().length() as usize];
    io.on_command(fab, cmd, &mut d, true, 0).unwrap();
}

fn read_back(io: &mut RequestEngine, fab: &mut Rec, cid: u16, lba: u64) -> Vec<u8> {
    io.on_command(fab, &read(cid, lba), &mut [], true, 0)
        .unwrap();
    let d = fab
        .done
        .iter()
        .find(|d| d.0 == cid)
        .expect("read answered")
        .clone();
    assert_eq!(d.1, Status::SUCCESS);
    fab.done.retain(|d| d.0 != cid);
    d.2
}

#[test]
fn identify_reports_compare_and_write() {
    let (t, _fab, _admin, _io) = setup();
    let _ = t;
    // FUSES bit 0 and ACWU are set in identify.rs; the wire offsets are
    // tested in nvmf-wire. Here: the limit the engine enforces is ACWU + 1.
    assert_eq!(fused::CAW_MAX_BLOCKS, 16);
    assert_eq!(fused::FUSES_COMPARE_AND_WRITE, 1);
}

#[test]
fn a_matching_pair_writes_and_a_miscompare_changes_nothing() {
    let (_t, mut fab, _admin, mut io) = setup();
    send(&mut io, &mut fab, &write(1, 7), 0xAA);
    assert_eq!(status_of(&fab, 1), Some(Status::SUCCESS));

    // Compare AA (matches), write BB.
    send(&mut io, &mut fab, &compare(2, 7), 0xAA);
    assert_eq!(
        status_of(&fab, 2),
        None,
        "the first half waits for its second"
    );
    send(&mut io, &mut fab, &fused_write(3, 7), 0xBB);
    assert_eq!(status_of(&fab, 2), Some(Status::SUCCESS));
    assert_eq!(status_of(&fab, 3), Some(Status::SUCCESS));
    assert_eq!(read_back(&mut io, &mut fab, 10, 7), vec![0xBB; 512]);

    // Compare AA again: the block holds BB now.
    fab.done.clear();
    send(&mut io, &mut fab, &compare(4, 7), 0xAA);
    send(&mut io, &mut fab, &fused_write(5, 7), 0xCC);
    assert_eq!(status_of(&fab, 4), Some(Status::COMPARE_FAILURE.with_dnr()));
    assert_eq!(status_of(&fab, 5), Some(Status::ABORTED_FAILED_FUSED));
    assert_eq!(
        read_back(&mut io, &mut fab, 11, 7),
        vec![0xBB; 512],
        "nothing written"
    );
    assert_eq!(io.in_flight(), 0);
}

#[test]
fn lone_and_bad_halves_get_the_spec_statuses() {
    let (_t, mut fab, _admin, mut io) = setup();
    // A first followed by a plain write: the first is missing its second,
    // the write runs as usual.
    send(&mut io, &mut fab, &compare(1, 3), 0);
    send(&mut io, &mut fab, &write(2, 3), 0x11);
    assert_eq!(status_of(&fab, 1), Some(Status::ABORTED_MISSING_FUSED));
    assert_eq!(status_of(&fab, 2), Some(Status::SUCCESS));
    // A second with no first.
    send(&mut io, &mut fab, &fused_write(3, 3), 0x22);
    assert_eq!(status_of(&fab, 3), Some(Status::ABORTED_MISSING_FUSED));
    // Reserved FUSE 11b.
    let c = caw_half(
        IoOpcode::Write,
        3,
        4,
        3,
        1,
        SglDescriptor::new(IN_CAPSULE, 0, 512),
    );
    send(&mut io, &mut fab, &c, 0x33);
    assert_eq!(status_of(&fab, 4), Some(Status::INVALID_FIELD.with_dnr()));
    // Halves naming different blocks.
    send(&mut io, &mut fab, &compare(5, 3), 0x11);
    send(&mut io, &mut fab, &fused_write(6, 4), 0x44);
    assert_eq!(status_of(&fab, 5), Some(Status::INVALID_FIELD.with_dnr()));
    assert_eq!(status_of(&fab, 6), Some(Status::ABORTED_FAILED_FUSED));
    // A Read as the first half: not a fused operation nvmfd offers.
    let r = caw_half(
        IoOpcode::Read,
        fused::FUSE_FIRST,
        7,
        3,
        1,
        SglDescriptor::new(KEYED, 0, 512),
    );
    io.on_command(&mut fab, &r, &mut [], true, 0).unwrap();
    send(&mut io, &mut fab, &fused_write(8, 3), 0x55);
    assert_eq!(status_of(&fab, 7), Some(Status::INVALID_FIELD.with_dnr()));
    assert_eq!(status_of(&fab, 8), Some(Status::ABORTED_FAILED_FUSED));
    // More blocks than ACWU + 1.
    let n = fused::CAW_MAX_BLOCKS + 1;
    let len = n * 512;
    let c1 = caw_half(
        IoOpcode::Compare,
        fused::FUSE_FIRST,
        9,
        0,
        n,
        SglDescriptor::new(KEYED, 0, len),
    );
    let c2 = caw_half(
        IoOpcode::Write,
        fused::FUSE_SECOND,
        12,
        0,
        n,
        SglDescriptor::new(KEYED, 0, len),
    );
    io.on_command(&mut fab, &c1, &mut [], true, 0).unwrap();
    io.on_command(&mut fab, &c2, &mut [], true, 0).unwrap();
    deliver_fetches(&mut io, &mut fab, 0);
    assert_eq!(status_of(&fab, 9), Some(Status::INVALID_FIELD.with_dnr()));
    assert_eq!(status_of(&fab, 12), Some(Status::ABORTED_FAILED_FUSED));
    // An unknown namespace: both halves get Invalid Namespace (a path or
    // namespace status goes to both, so a host can retry the pair).
    let mut c1 = compare(13, 3);
    c1.set_nsid(9);
    let mut c2 = fused_write(14, 3);
    c2.set_nsid(9);
    send(&mut io, &mut fab, &c1, 0x11);
    send(&mut io, &mut fab, &c2, 0x66);
    let invalid_ns = Status::INVALID_NAMESPACE.with_dnr();
    assert_eq!(status_of(&fab, 13), Some(invalid_ns));
    assert_eq!(status_of(&fab, 14), Some(invalid_ns));
    // Nothing written by any of them.
    assert_eq!(read_back(&mut io, &mut fab, 20, 3), vec![0x11; 512]);
    assert_eq!(read_back(&mut io, &mut fab, 21, 4), vec![0; 512]);
    assert_eq!(io.in_flight(), 0);
}

/// Hands every asked-for fetch its data (`fill`), as the transport would.
fn deliver_fetches(io: &mut RequestEngine, fab: &mut Rec, fill: u8) {
    for idx in std::mem::take(&mut fab.fetches) {
        let slot = io.slots_mut().get_mut(idx).unwrap();
        let len = slot.len as usize;
        slot.data_mut(len).fill(fill);
        slot.received = len as u32;
        io.fetched(fab, idx).unwrap();
    }
}

#[test]
fn a_pair_whose_halves_come_through_fetches_runs_when_both_are_in() {
    let (_t, mut fab, _admin, mut io) = setup();
    send(&mut io, &mut fab, &write(1, 9), 0x5A);
    // Compare in the capsule, Write through a fetch: the Compare is held
    // until the Write's data is in.
    send(&mut io, &mut fab, &compare(2, 9), 0x5A);
    let w = caw_half(
        IoOpcode::Write,
        fused::FUSE_SECOND,
        3,
        9,
        1,
        SglDescriptor::new(KEYED, 0, 512),
    );
    io.on_command(&mut fab, &w, &mut [], true, 0).unwrap();
    assert_eq!(fab.fetches.len(), 1);
    assert_eq!(status_of(&fab, 2), None);
    // Other commands go on meanwhile.
    assert_eq!(read_back(&mut io, &mut fab, 4, 9), vec![0x5A; 512]);
    deliver_fetches(&mut io, &mut fab, 0x6B);
    assert_eq!(status_of(&fab, 2), Some(Status::SUCCESS));
    assert_eq!(status_of(&fab, 3), Some(Status::SUCCESS));
    assert_eq!(read_back(&mut io, &mut fab, 5, 9), vec![0x6B; 512]);
    // A pair whose Write's data arrives damaged: the Write fails with a
    // transport error, so its Compare is aborted (failed fused).
    fab.done.clear();
    send(&mut io, &mut fab, &compare(6, 9), 0x6B);
    let w = caw_half(
        IoOpcode::Write,
        fused::FUSE_SECOND,
        7,
        9,
        1,
        SglDescriptor::new(KEYED, 0, 512),
    );
    io.on_command(&mut fab, &w, &mut [], true, 0).unwrap();
    let idx = fab.fetches.pop().unwrap();
    io.slots_mut().get_mut(idx).unwrap().data_error = true;
    io.fetched(&mut fab, idx).unwrap();
    assert_eq!(status_of(&fab, 7), Some(Status::TRANSIENT_TRANSPORT_ERROR));
    assert_eq!(status_of(&fab, 6), Some(Status::ABORTED_FAILED_FUSED));
    assert_eq!(read_back(&mut io, &mut fab, 8, 9), vec![0x6B; 512]);
    assert_eq!(io.in_flight(), 0);
}

#[test]
fn the_write_gate_orders_a_compare_and_write_against_other_writes() {
    let (t, mut fab, admin, mut io) = setup();
    let cntlid = admin.queue().controller().unwrap().cntlid();
    let port = inproc::port(TransportType::Rdma, inproc::KEYED_CAPS);
    let mut fab2 = Rec::default();
    let mut io2 = connect(&mut fab2, &t, &port, 2, cntlid);
    fab2.done.clear();
    let ns = t
        .subsystem(NQN)
        .unwrap()
        .namespaces()
        .get(1)
        .unwrap()
        .clone();
    let gate = ns.write_gate().clone();
    let parked_before = qos::parked_here();

    send(&mut io, &mut fab, &write(1, 5), 0x01);
    // A write of another queue still in its backend (counted in the gate).
    assert!(gate.enter(7));
    send(&mut io, &mut fab, &compare(2, 5), 0x01);
    send(&mut io, &mut fab, &fused_write(3, 5), 0x02);
    assert!(gate.is_closed(), "the compare-and-write holds the gate");
    assert_eq!(status_of(&fab, 2), None, "it waits for the write in flight");
    assert_eq!(qos::parked_here(), parked_before + 1, "and asks for turns");
    // Meanwhile a write from the other queue is parked, not failed.
    send(&mut io2, &mut fab2, &write(1, 5), 0x03);
    assert!(fab2.done.is_empty(), "{:?}", fab2.done);
    assert_eq!(io2.waiting_for_qos(), 1);
    io.poll(&mut fab, Instant::now()).unwrap();
    assert_eq!(status_of(&fab, 2), None, "still waiting");
    // The write in flight ends: the compare-and-write runs on the next turn.
    gate.leave(7);
    io.poll(&mut fab, Instant::now()).unwrap();
    assert_eq!(status_of(&fab, 2), Some(Status::SUCCESS));
    assert_eq!(status_of(&fab, 3), Some(Status::SUCCESS));
    assert!(!gate.is_closed());
    // A compare-and-write right behind it lets the write it kept waiting
    // go first (writers' turn).
    send(&mut io, &mut fab, &compare(30, 5), 0x03);
    send(&mut io, &mut fab, &fused_write(31, 5), 0x06);
    assert!(!gate.is_closed(), "the waiting write's turn");
    assert_eq!(status_of(&fab, 30), None);
    // The parked write runs on its queue's next turn.
    io2.poll(&mut fab2, Instant::now()).unwrap();
    assert_eq!(
        fab2.done.first().map(|d| (d.0, d.1)),
        Some((1, Status::SUCCESS))
    );
    // Then the compare-and-write, which sees that write's data.
    std::thread::sleep(fused::WRITERS_TURN);
    io.poll(&mut fab, Instant::now()).unwrap();
    assert_eq!(status_of(&fab, 30), Some(Status::SUCCESS));
    assert_eq!(status_of(&fab, 31), Some(Status::SUCCESS));
    assert_eq!(read_back(&mut io, &mut fab, 9, 5), vec![0x06; 512]);
    assert_eq!(gate.in_flight(), 0);
    assert_eq!(qos::parked_here(), parked_before);
    assert_eq!(gate.counts(), (2, 0));

    // A second compare-and-write waits while another holds the gate, and a
    // queue dropped while its compare-and-write waits gives the gate back.
    fab.done.clear();
    fab2.done.clear();
    assert!(gate.enter(7));
    send(&mut io, &mut fab, &compare(20, 5), 0x06);
    send(&mut io, &mut fab, &fused_write(21, 5), 0x04);
    send(&mut io2, &mut fab2, &compare(22, 5), 0x04);
    send(&mut io2, &mut fab2, &fused_write(23, 5), 0x05);
    assert!(gate.is_closed());
    drop(io);
    assert!(
        !gate.is_closed(),
        "the dropped queue's compare-and-write let go"
    );
    gate.leave(7);
    io2.poll(&mut fab2, Instant::now()).unwrap();
    assert_eq!(
        status_of(&fab2, 22),
        Some(Status::COMPARE_FAILURE.with_dnr()),
        "{:?}",
        fab2.done
    );
    assert_eq!(status_of(&fab2, 23), Some(Status::ABORTED_FAILED_FUSED));
    assert_eq!(qos::parked_here(), parked_before);
    assert_eq!(gate.in_flight(), 0);
}
