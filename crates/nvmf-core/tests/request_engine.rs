//! The request engine as a transport other than NVMe/TCP sees it: a fabric
//! whose host data is addressed by keyed SGL descriptors (the NVMe/RDMA
//! model) and moved by the transport itself. "Host memory" here is a byte
//! array the fabric reads (for fetches, like RDMA READ) and writes (for
//! read data, like RDMA WRITE). Checks that the engine asks the transport
//! for exactly the data phase each command needs, executes with the fetched
//! data, hands read data and the completion over in order, bounds
//! outstanding fetches, and times out a fetch in the transport's words.

use std::sync::Arc;
use std::time::{Duration, Instant};

use nvmf_config::{BdevKind, TransportType};
use nvmf_core::request::{
    DataDesc, DataOut, Fabric, FaultKind, RequestEngine, RequestParams, RequestState, SglKind,
    Slots,
};
use nvmf_core::{PortInfo, Target};
use nvmf_testkit::inproc::{self, rw};
use nvmf_wire::command::{Command, SglDescriptor};
use nvmf_wire::completion::Completion;
use nvmf_wire::fabrics::{ConnectData, CC};
use nvmf_wire::opcode::IoOpcode;
use nvmf_wire::status::Status;
use nvmf_wire::zerocopy::IntoBytes;

const NQN: &str = "nqn.2024-01.io.nvmfd:engine";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-0000000000e1";
/// Keyed SGL Data Block, subtype address (NVMe/RDMA).
const KEYED: u8 = 0x40;
/// Data Block, subtype offset (in-capsule data).
const IN_CAPSULE: u8 = 0x01;

fn target() -> Arc<Target> {
    inproc::target(NQN, TransportType::Rdma, BdevKind::Malloc, 512, 4096)
}

fn port() -> Arc<PortInfo> {
    inproc::port(TransportType::Rdma, inproc::KEYED_CAPS)
}

fn params(max_fetch_bytes: u32) -> RequestParams {
    inproc::rdma_request_params(max_fetch_bytes, Duration::from_secs(2))
}

/// A keyed SGL: address, 24-bit length, key (low byte only, enough here).
fn keyed(addr: u64, len: u32, key: u8) -> SglDescriptor {
    SglDescriptor::new(KEYED, addr, len | (u32::from(key) << 24))
}

/// What the test fabric was asked to do, in order.
#[derive(Debug, PartialEq, Eq)]
enum Op {
    Fetch {
        cid: u16,
        addr: u64,
        len: u32,
    },
    Respond {
        cid: u16,
        data: usize,
        status: Status,
    },
}

/// An RDMA-like fabric over a byte array of "host memory".
struct KeyedFabric {
    host: Vec<u8>,
    ops: Vec<Op>,
}

impl KeyedFabric {
    fn new() -> KeyedFabric {
        KeyedFabric {
            host: vec![0; 1 << 20],
            ops: Vec::new(),
        }
    }
}

impl Fabric for KeyedFabric {
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

    fn fetch(&mut self, slots: &mut Slots, idx: u16, len: u32) {
        let slot = slots.get_mut(idx).expect("slot");
        let addr = slot.cmd.sgl().address();
        let cid = slot.cmd.cid();
        self.ops.push(Op::Fetch { cid, addr, len });
        // The "RDMA READ": host memory into the slot buffer. Completion is
        // reported later by the test (`fetched`).
        let a = addr as usize;
        slot.data_mut(len as usize)
            .copy_from_slice(&self.host[a..a + len as usize]);
    }

    fn respond(
        &mut self,
        slots: &Slots,
        idx: u16,
        cqe: &Completion,
        data: DataOut,
        _sq_flow_disabled: bool,
    ) -> bool {
        let slot = slots.get(idx).expect("slot");
        let addr = slot.cmd.sgl().address() as usize;
        let n = match data {
            DataOut::None => 0,
            DataOut::Slot(len) => {
                // The "RDMA WRITE" of read data, then the response SEND.
                let len = len as usize;
                self.host[addr..addr + len].copy_from_slice(slot.data(len));
                len
            }
            DataOut::Zeroes(z) => {
                self.host[addr..addr + z.len()].fill(0);
                z.len()
            }
        };
        self.ops.push(Op::Respond {
            cid: cqe.cid(),
            data: n,
            status: cqe.status(),
        });
        false
    }

    fn respond_unslotted(&mut self, cqe: &Completion) {
        self.ops.push(Op::Respond {
            cid: cqe.cid(),
            data: 0,
            status: cqe.status(),
        });
    }
}

fn connect(
    fab: &mut KeyedFabric,
    t: &Arc<Target>,
    p: &RequestParams,
    qid: u16,
    cntlid: u16,
) -> RequestEngine {
    let mut e = RequestEngine::new(t.clone(), port(), p);
    let mut cmd = Command::connect(1, qid, 31, 0, 0);
    let mut data = ConnectData::new([9; 16], cntlid, NQN, HOST)
        .as_bytes()
        .to_vec();
    cmd.set_sgl(SglDescriptor::new(IN_CAPSULE, 0, data.len() as u32));
    e.on_command(fab, &cmd, &mut data, true, 0)
        .expect("connect");
    let Some(Op::Respond { status, .. }) = fab.ops.pop() else {
        panic!("no connect response")
    };
    assert_eq!(status, Status::SUCCESS, "connect qid {qid}");
    if qid == 0 {
        // Enable the controller (CC.EN, 64-byte SQEs, 16-byte CQEs).
        let cc = Command::property_set(2, CC, false, 0x0046_0001);
        e.on_command(fab, &cc, &mut [], true, 0)
            .expect("property set");
        assert!(
            matches!(fab.ops.pop(), Some(Op::Respond { status, .. }) if status == Status::SUCCESS)
        );
    }
    e
}

#[test]
fn keyed_write_is_fetched_then_executed_and_read_back() {
    let t = target();
    let p = params(1 << 20);
    let mut fab = KeyedFabric::new();
    let admin = connect(&mut fab, &t, &p, 0, 0xFFFF);
    let cntlid = admin.queue().controller().unwrap().cntlid();
    let mut io = connect(&mut fab, &t, &p, 1, cntlid);

    // Host buffer at 0x1000 holds 8 KiB of pattern; write it to LBA 16.
    for (i, b) in fab.host[0x1000..0x3000].iter_mut().enumerate() {
        *b = (i * 7 + 3) as u8;
    }
    let w = rw(IoOpcode::Write, 10, 16, 16, keyed(0x1000, 8192, 0x5a));
    io.on_command(&mut fab, &w, &mut [], true, 0).unwrap();
    assert_eq!(
        fab.ops.pop(),
        Some(Op::Fetch {
            cid: 10,
            addr: 0x1000,
            len: 8192
        }),
        "a keyed write asks the transport for the host's data first"
    );
    assert_eq!(io.fetches_outstanding(), 1);
    let idx = (0..4)
        .find(|&i| io.slots().get(i).map(|s| s.state) == Some(RequestState::AwaitingHostData));
    let idx = idx.expect("a slot awaits the host's data");
    io.fetched(&mut fab, idx).unwrap();
    assert_eq!(io.fetches_outstanding(), 0);
    assert_eq!(
        fab.ops.pop(),
        Some(Op::Respond {
            cid: 10,
            data: 0,
            status: Status::SUCCESS
        })
    );

    // Read it back into host memory at 0x8000.
    let r = rw(IoOpcode::Read, 11, 16, 16, keyed(0x8000, 8192, 0x5b));
    io.on_command(&mut fab, &r, &mut [], true, 0).unwrap();
    assert_eq!(
        fab.ops.pop(),
        Some(Op::Respond {
            cid: 11,
            data: 8192,
            status: Status::SUCCESS
        })
    );
    assert_eq!(fab.host[0x8000..0xA000], fab.host[0x1000..0x3000]);
    assert_eq!(io.in_flight(), 0);

    // In-capsule write data (the descriptor's length, the capsule's bytes).
    let mut icd = vec![0xC3u8; 512];
    let w = rw(
        IoOpcode::Write,
        12,
        40,
        0,
        SglDescriptor::new(IN_CAPSULE, 0, 512),
    );
    io.on_command(&mut fab, &w, &mut icd, true, 0).unwrap();
    assert!(
        matches!(fab.ops.pop(), Some(Op::Respond { cid: 12, status, .. }) if status == Status::SUCCESS)
    );
    let r = rw(IoOpcode::Read, 13, 40, 1, keyed(0x20000, 512, 1));
    io.on_command(&mut fab, &r, &mut [], true, 0).unwrap();
    assert_eq!(fab.host[0x20000..0x20200], vec![0xC3u8; 512][..]);

    // A damaged transfer fails with a transient transport error, not executed.
    let w = rw(IoOpcode::Write, 14, 0, 1, keyed(0x1000, 512, 2));
    io.on_command(&mut fab, &w, &mut [], true, 0).unwrap();
    let idx = (0..32)
        .find(|&i| io.slots().get(i).map(|s| s.state) == Some(RequestState::AwaitingHostData))
        .unwrap();
    io.slots_mut().get_mut(idx).unwrap().data_error = true;
    io.fetched(&mut fab, idx).unwrap();
    assert!(
        matches!(fab.ops.pop(), Some(Op::Respond { cid: 14, status, .. }) if status == Status::TRANSIENT_TRANSPORT_ERROR)
    );
}

#[test]
fn fetches_are_bounded_and_time_out_in_the_transports_words() {
    let t = target();
    // Room for one 64 KiB fetch at a time.
    let p = params(65536);
    let mut fab = KeyedFabric::new();
    let admin = connect(&mut fab, &t, &p, 0, 0xFFFF);
    let cntlid = admin.queue().controller().unwrap().cntlid();
    let mut io = connect(&mut fab, &t, &p, 1, cntlid);
    let start = Instant::now();
    io.poll(&mut fab, start).unwrap();
    for cid in 0..3u16 {
        let w = rw(
            IoOpcode::Write,
            cid,
            u64::from(cid) * 128,
            127,
            keyed(0, 65536, 3),
        );
        io.on_command(&mut fab, &w, &mut [], true, 0).unwrap();
    }
    let fetches = fab
        .ops
        .iter()
        .filter(|o| matches!(o, Op::Fetch { .. }))
        .count();
    assert_eq!(fetches, 1, "one fetch at a time within max_fetch_bytes");
    assert_eq!(io.waiting_for_buffer(), 2);
    // The host never delivers: the queue closes after the timeout, named
    // as the transport names it.
    io.poll(&mut fab, start + Duration::from_millis(1500))
        .unwrap();
    assert_eq!(io.close_reason(), None);
    io.poll(&mut fab, start + Duration::from_millis(2600))
        .unwrap();
    assert_eq!(io.close_reason(), Some("RDMA READ timeout"));
}

#[test]
fn sequence_and_command_id_faults_are_the_transports_to_report() {
    let t = target();
    let p = params(1 << 20);
    let mut fab = KeyedFabric::new();
    let mut e = RequestEngine::new(t.clone(), port(), &p);
    let r = rw(IoOpcode::Read, 1, 0, 1, keyed(0, 512, 1));
    let f = e.on_command(&mut fab, &r, &mut [], true, 0).unwrap_err();
    assert_eq!(f.kind, FaultKind::Sequence, "{f:?}");
    assert!(
        fab.ops.is_empty(),
        "nothing fetched or answered before Connect"
    );

    let admin = connect(&mut fab, &t, &p, 0, 0xFFFF);
    let cntlid = admin.queue().controller().unwrap().cntlid();
    let mut io = connect(&mut fab, &t, &p, 1, cntlid);
    let w = rw(IoOpcode::Write, 7, 0, 1, keyed(0, 512, 1));
    io.on_command(&mut fab, &w, &mut [], true, 0).unwrap();
    let again = rw(IoOpcode::Write, 7, 8, 1, keyed(0, 512, 1));
    let f = io
        .on_command(&mut fab, &again, &mut [], true, 0)
        .unwrap_err();
    assert_eq!(f.kind, FaultKind::CommandId);
    // An SGL the transport does not take: SGL Descriptor Type Invalid.
    let bad = rw(IoOpcode::Read, 8, 0, 1, SglDescriptor::new(0x5A, 0, 512));
    io.on_command(&mut fab, &bad, &mut [], true, 0).unwrap();
    assert!(
        matches!(fab.ops.last(), Some(Op::Respond { cid: 8, status, .. }) if *status == Status::SGL_INVALID_DESCRIPTOR_TYPE.with_dnr())
    );
}

/// Completes `cmd` with in-capsule `data` on `e` and returns its status.
fn in_capsule_status(
    e: &mut RequestEngine,
    fab: &mut KeyedFabric,
    cmd: &Command,
    data: &mut [u8],
) -> Status {
    e.on_command(fab, cmd, data, true, 0).unwrap();
    match fab.ops.pop() {
        Some(Op::Respond { status, .. }) => status,
        other => panic!("expected a response, got {other:?}"),
    }
}

#[test]
fn in_capsule_data_is_checked_against_the_queues_own_limit() {
    let t = target();
    // The admin queue takes more in-capsule data than the I/O queues (as
    // NVMe/TCP's 8 KiB admin minimum does).
    let p = RequestParams {
        admin_in_capsule_data_size: 8192,
        ..params(1 << 20)
    };
    let mut fab = KeyedFabric::new();
    let mut admin = connect(&mut fab, &t, &p, 0, 0xFFFF);
    let cntlid = admin.queue().controller().unwrap().cntlid();
    let mut io = connect(&mut fab, &t, &p, 1, cntlid);

    let w = |cid, len, offset| {
        rw(
            IoOpcode::Write,
            cid,
            0,
            len / 512,
            SglDescriptor::new(IN_CAPSULE, offset, len),
        )
    };
    let mut icd = vec![0x3Cu8; 8192];
    assert_eq!(
        in_capsule_status(&mut io, &mut fab, &w(20, 4096, 0), &mut icd[..4096]),
        Status::SUCCESS
    );
    assert_eq!(
        in_capsule_status(&mut io, &mut fab, &w(21, 4096, 16), &mut icd[..4096]),
        Status::SGL_OFFSET_INVALID.with_dnr()
    );
    assert_eq!(
        in_capsule_status(&mut io, &mut fab, &w(22, 8192, 0), &mut icd[..8192]),
        Status::SGL_DATA_LENGTH_INVALID.with_dnr(),
        "more than the I/O queue's limit, though within the admin queue's"
    );
    assert_eq!(
        in_capsule_status(&mut io, &mut fab, &w(23, 4096, 0), &mut icd[..2048]),
        Status::SGL_DATA_LENGTH_INVALID.with_dnr(),
        "the capsule holds less than the descriptor says"
    );
    assert_eq!(io.in_flight(), 0);

    // On the admin queue, 6000 bytes pass the transport check (the
    // command itself is then the core's to judge); 9000 do not.
    let set_features = |cid, len| {
        let mut c = Command::new(0x09, cid);
        c.set_sgl(SglDescriptor::new(IN_CAPSULE, 0, len));
        c
    };
    let s = in_capsule_status(
        &mut admin,
        &mut fab,
        &set_features(30, 6000),
        &mut icd[..6000],
    );
    assert_ne!(s, Status::SGL_DATA_LENGTH_INVALID.with_dnr());
    assert_eq!(
        in_capsule_status(
            &mut admin,
            &mut fab,
            &set_features(31, 9000),
            &mut vec![0; 9000]
        ),
        Status::SGL_DATA_LENGTH_INVALID.with_dnr()
    );
}
