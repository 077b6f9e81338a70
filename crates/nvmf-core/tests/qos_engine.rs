//! QoS in the request engine (any transport): a command over its bdev's
//! rate limit is parked, not failed; the queue cannot move to another
//! thread while one waits; parked commands keep their data (in-capsule
//! data is copied out of the transport's receive buffer, which the
//! transport reuses at once), run in arrival order once tokens return
//! (`poll`, which the reactor calls every time slice while
//! `qos::parked_here` is not zero), and a queue dropped with commands
//! parked takes them off the thread's count.

use std::sync::Arc;
use std::time::{Duration, Instant};

use nvmf_config::{BdevKind, QosLimits, TransportType};
use nvmf_core::qos;
use nvmf_core::request::{DataDesc, DataOut, Fabric, RequestEngine, RequestParams, SglKind, Slots};
use nvmf_core::{PortInfo, Target};
use nvmf_testkit::inproc::{self, rw};
use nvmf_wire::command::{Command, SglDescriptor};
use nvmf_wire::completion::Completion;
use nvmf_wire::fabrics::{ConnectData, CC};
use nvmf_wire::opcode::IoOpcode;
use nvmf_wire::status::Status;
use nvmf_wire::zerocopy::IntoBytes;

const NQN: &str = "nqn.2024-01.io.nvmfd:qos-engine";
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

fn limit(ios: u64) -> QosLimits {
    QosLimits {
        rw_ios_per_sec: ios,
        ..QosLimits::default()
    }
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

#[test]
fn parked_commands_wait_in_order_keep_their_data_and_pin_the_queue() {
    let t = inproc::target(NQN, TransportType::Rdma, BdevKind::Malloc, 512, 4096);
    let port = inproc::port(TransportType::Rdma, inproc::KEYED_CAPS);
    let mut fab = Rec::default();
    let admin = connect(&mut fab, &t, &port, 0, 0xFFFF);
    let cntlid = admin.queue().controller().unwrap().cntlid();
    let mut io = connect(&mut fab, &t, &port, 1, cntlid);
    let parked_before = qos::parked_here();

    // 1000 I/Os a second: one per 1 ms slice.
    t.set_bdev_qos("Ram", &limit(1000));
    // The transport's receive buffer, reused for every capsule.
    let mut rx = vec![0u8; 512];
    for cid in 1..=4u16 {
        rx.fill(cid as u8);
        io.on_command(&mut fab, &write(cid, u64::from(cid)), &mut rx, true, 0)
            .unwrap();
    }
    rx.fill(0xEE); // the transport moved on
                   // A new slice has begun when the read arrives, before any retry: it
                   // still waits behind the parked writes.
    std::thread::sleep(Duration::from_millis(3));
    io.on_command(&mut fab, &read(5, 1), &mut [], true, 0)
        .unwrap();
    assert_eq!(fab.done.len(), 1, "one slice's quota: one command ran");
    assert_eq!(fab.done[0].0, 1);
    assert_eq!(io.waiting_for_qos(), 4, "3 writes and the read behind them");
    assert_eq!(qos::parked_here(), parked_before + 4);
    assert!(
        !io.movable(),
        "a queue with parked commands stays on its thread"
    );
    assert_eq!(io.in_flight(), 4, "parked commands keep their slots");

    let deadline = Instant::now() + Duration::from_secs(5);
    while fab.done.len() < 5 {
        assert!(Instant::now() < deadline, "parked commands never ran");
        std::thread::sleep(Duration::from_millis(1));
        io.poll(&mut fab, Instant::now()).unwrap();
    }
    let order: Vec<u16> = fab.done.iter().map(|d| d.0).collect();
    assert_eq!(order, [1, 2, 3, 4, 5], "arrival order");
    assert!(
        fab.done.iter().all(|d| d.1 == Status::SUCCESS),
        "none failed"
    );
    assert_eq!(fab.done[4].2, vec![1u8; 512], "the read saw write 1's data");
    assert_eq!(qos::parked_here(), parked_before);
    assert!(io.movable());

    // The writes landed with their own data, not the reused buffer's.
    t.set_bdev_qos("Ram", &limit(0));
    fab.done.clear();
    for lba in 2..=4u64 {
        io.on_command(&mut fab, &read(10 + lba as u16, lba), &mut [], true, 0)
            .unwrap();
    }
    for (i, d) in fab.done.iter().enumerate() {
        assert_eq!(d.2, vec![(i + 2) as u8; 512], "LBA {}", i + 2);
    }

    // A queue dropped with commands parked gives them back.
    t.set_bdev_qos("Ram", &limit(1000));
    for cid in 20..24u16 {
        io.on_command(&mut fab, &write(cid, 0), &mut rx, true, 0)
            .unwrap();
    }
    assert!(qos::parked_here() > parked_before);
    drop(io);
    assert_eq!(qos::parked_here(), parked_before);
    t.set_bdev_qos("Ram", &limit(0));
}

/// Abort (admin 08h) of I/O commands: a command parked for QoS tokens is
/// aborted (Command Aborted by Request, its slot freed, the Abort's dword 0
/// bit 0 clear) once its queue polls; one already answered, or on a queue
/// that is not connected, is "not aborted" (bit 0 set).
#[test]
fn an_abort_takes_a_parked_command_and_leaves_the_rest() {
    let t = inproc::target(NQN, TransportType::Rdma, BdevKind::Malloc, 512, 4096);
    let port = inproc::port(TransportType::Rdma, inproc::KEYED_CAPS);
    let mut fab = Rec::default();
    let mut admin = connect(&mut fab, &t, &port, 0, 0xFFFF);
    let cntlid = admin.queue().controller().unwrap().cntlid();
    let mut io = connect(&mut fab, &t, &port, 1, cntlid);
    fab.done.clear();
    fab.dw0.clear();
    let parked_before = qos::parked_here();
    t.set_bdev_qos("Ram", &limit(1000));
    let mut rx = vec![7u8; 512];
    for cid in 1..=3u16 {
        io.on_command(&mut fab, &write(cid, 0), &mut rx, true, 0)
            .unwrap();
    }
    assert_eq!(fab.done.len(), 1, "one ran, two parked");
    let abort = |cid: u16, victim: u16, sqid: u16| {
        let mut c = Command::new(0x08, cid);
        c.set_cdw10((u32::from(victim) << 16) | u32::from(sqid));
        c
    };
    // Not connected: answered at once, not aborted.
    admin
        .on_command(&mut fab, &abort(40, 2, 5), &mut [], true, 0)
        .unwrap();
    assert_eq!(fab.dw0.last(), Some(&(40, 1)));
    // CID 2 (parked) and CID 1 (answered already): wait for the queue.
    admin
        .on_command(&mut fab, &abort(41, 2, 1), &mut [], true, 0)
        .unwrap();
    admin
        .on_command(&mut fab, &abort(42, 1, 1), &mut [], true, 0)
        .unwrap();
    assert!(!fab.dw0.iter().any(|d| d.0 == 41 || d.0 == 42));
    io.poll(&mut fab, Instant::now()).unwrap();
    let st = fab.done.iter().find(|d| d.0 == 2).map(|d| d.1);
    assert_eq!(st, Some(Status::ABORTED_BY_REQUEST), "{:?}", fab.done);
    let deadline = Instant::now() + Duration::from_secs(5);
    while !(fab.dw0.iter().any(|d| d.0 == 41) && fab.dw0.iter().any(|d| d.0 == 42)) {
        assert!(Instant::now() < deadline, "Abort answers never came");
        admin.poll(&mut fab, Instant::now()).unwrap();
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(
        fab.dw0.contains(&(41, 0)),
        "parked command aborted: {:?}",
        fab.dw0
    );
    assert!(
        fab.dw0.contains(&(42, 1)),
        "answered command not aborted: {:?}",
        fab.dw0
    );
    // CID 3 still runs when its tokens come; nothing stays parked.
    while !fab.done.iter().any(|d| d.0 == 3) {
        assert!(Instant::now() < deadline, "CID 3 never ran");
        io.poll(&mut fab, Instant::now()).unwrap();
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(
        fab.done.iter().find(|d| d.0 == 3).map(|d| d.1),
        Some(Status::SUCCESS)
    );
    assert_eq!(qos::parked_here(), parked_before);
    assert_eq!(io.in_flight(), 0);
    t.set_bdev_qos("Ram", &limit(0));
}

/// Abort of commands that are not parked: a write whose data is being
/// fetched is "not aborted"; one waiting behind it for fetch allowance
/// (a buffer wait) is aborted and never fetched.
#[test]
fn an_abort_takes_a_command_waiting_for_its_data_phase_not_one_fetching() {
    let t = inproc::target(NQN, TransportType::Rdma, BdevKind::Malloc, 512, 4096);
    let port = inproc::port(TransportType::Rdma, inproc::KEYED_CAPS);
    let mut fab = Rec::default();
    // One 4 KiB fetch at a time.
    let params = inproc::rdma_request_params(4096, Duration::from_secs(30));
    let mut admin = connect(&mut fab, &t, &port, 0, 0xFFFF);
    let cntlid = admin.queue().controller().unwrap().cntlid();
    let mut io = {
        let mut e = RequestEngine::new(t.clone(), port.clone(), &params);
        let mut cmd = Command::connect(1, 1, 31, 0, 0);
        let mut data = ConnectData::new([9; 16], cntlid, NQN, HOST)
            .as_bytes()
            .to_vec();
        cmd.set_sgl(SglDescriptor::new(IN_CAPSULE, 0, data.len() as u32));
        e.on_command(&mut fab, &cmd, &mut data, true, 0).unwrap();
        e
    };
    fab.done.clear();
    fab.dw0.clear();
    let keyed_write = |cid: u16| {
        rw(
            IoOpcode::Write,
            cid,
            0,
            8,
            SglDescriptor::new(KEYED, 0, 4096),
        )
    };
    io.on_command(&mut fab, &keyed_write(1), &mut [], true, 0)
        .unwrap();
    io.on_command(&mut fab, &keyed_write(2), &mut [], true, 0)
        .unwrap();
    assert_eq!(fab.fetches.len(), 1, "only the first is fetching");
    assert_eq!(
        io.waiting_for_buffer(),
        1,
        "the second waits for its data phase"
    );
    for (abort_cid, victim) in [(50u16, 1u16), (51, 2)] {
        let mut c = Command::new(0x08, abort_cid);
        c.set_cdw10((u32::from(victim) << 16) | 1);
        admin.on_command(&mut fab, &c, &mut [], true, 0).unwrap();
    }
    io.poll(&mut fab, Instant::now()).unwrap();
    assert_eq!(
        fab.done.iter().find(|d| d.0 == 2).map(|d| d.1),
        Some(Status::ABORTED_BY_REQUEST)
    );
    assert!(
        !fab.done.iter().any(|d| d.0 == 1),
        "the fetching write goes on"
    );
    assert_eq!(io.waiting_for_buffer(), 0);
    let deadline = Instant::now() + Duration::from_secs(5);
    while fab.dw0.iter().filter(|d| d.0 >= 50).count() < 2 {
        assert!(Instant::now() < deadline, "Abort answers never came");
        admin.poll(&mut fab, Instant::now()).unwrap();
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(
        fab.dw0.contains(&(50, 1)),
        "fetching: not aborted {:?}",
        fab.dw0
    );
    assert!(fab.dw0.contains(&(51, 0)), "waiting: aborted {:?}", fab.dw0);
    assert_eq!(fab.fetches.len(), 1, "the aborted write was never fetched");
}
