//! The NVMe/RDMA queue state machine against a simulated host: the test
//! plays the host's side of the queue pair (posting capsules into the
//! receive buffers in order, serving RDMA READ and WRITE from and into its
//! own memory, receiving SENDs) and the device's completion queue. Checks
//! the work requests the queue asks for, their order and bounds, and the
//! data that ends up in host memory and on the namespace.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use nvmf_config::{BdevKind, TransportType};
use nvmf_core::{PortInfo, Target};
use nvmf_rdma::{RdmaQueue, RdmaQueueParams, Region, WorkCompletion, WorkRequest};
use nvmf_testkit::inproc::{self, rw};
use nvmf_wire::command::{Command, SglDescriptor};
use nvmf_wire::completion::Completion;
use nvmf_wire::fabrics::{ConnectData, CC};
use nvmf_wire::opcode::IoOpcode;
use nvmf_wire::status::Status;
use nvmf_wire::zerocopy::{FromBytes, IntoBytes};

const NQN: &str = "nqn.2024-01.io.nvmfd:rdma";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-0000000000d1";

fn target() -> Arc<Target> {
    inproc::target(NQN, TransportType::Rdma, BdevKind::Malloc, 512, 8192)
}

fn port() -> Arc<PortInfo> {
    inproc::port(TransportType::Rdma, nvmf_rdma::CAPS)
}

fn params(entries: u16, read_depth: u8) -> RdmaQueueParams {
    RdmaQueueParams {
        requests: inproc::rdma_request_params(4 << 20, Duration::from_secs(30)),
        entries,
        read_depth,
    }
}

/// The host side of one queue pair, and the device between them.
struct Host {
    q: RdmaQueue,
    mem: Vec<u8>,
    /// Receive buffers the target posted, in the order the device fills them.
    posted: VecDeque<u64>,
    /// Completions the host received (SENDs), with the key invalidated.
    responses: Vec<(Completion, Option<u32>)>,
    /// Everything the target posted, for order checks.
    log: Vec<WorkRequest>,
    /// Reads left unserved (for depth checks) when `hold_reads` is set.
    held: Vec<WorkRequest>,
    hold_reads: bool,
}

impl Host {
    fn new(t: &Arc<Target>, p: &RdmaQueueParams) -> Host {
        let mut q = RdmaQueue::new(t.clone(), port(), p);
        q.start();
        let mut h = Host {
            q,
            mem: vec![0; 1 << 20],
            posted: VecDeque::new(),
            responses: Vec::new(),
            log: Vec::new(),
            held: Vec::new(),
            hold_reads: false,
        };
        h.run();
        assert_eq!(
            h.posted.len(),
            usize::from(p.entries),
            "every receive buffer posted"
        );
        h
    }

    /// Serves the target's work requests until it has nothing more to post.
    fn run(&mut self) {
        for _ in 0..1000 {
            let mut work = Vec::new();
            self.q.take_work(&mut work);
            if work.is_empty() {
                return;
            }
            let mut done = Vec::new();
            for wr in work {
                self.log.push(wr);
                match wr {
                    WorkRequest::Recv { wr_id, .. } => self.posted.push_back(wr_id),
                    WorkRequest::Read { .. } if self.hold_reads => self.held.push(wr),
                    WorkRequest::Read { .. } => done.push(self.serve(wr)),
                    WorkRequest::Write { .. } => {
                        self.serve(wr);
                    }
                    WorkRequest::Send {
                        wr_id,
                        local,
                        invalidate,
                    } => {
                        let b = self.q.region_mut(local.region)[..16].to_vec();
                        let c = Completion::read_from_bytes(&b).unwrap();
                        self.responses.push((c, invalidate));
                        done.push(WorkCompletion {
                            wr_id,
                            ok: true,
                            byte_len: 0,
                        });
                    }
                }
            }
            for wc in done {
                self.q.on_completion(&wc, 0);
            }
        }
        panic!("the queue kept posting work");
    }

    /// Plays the device for a READ or WRITE.
    fn serve(&mut self, wr: WorkRequest) -> WorkCompletion {
        match wr {
            WorkRequest::Read {
                wr_id,
                local,
                remote_addr,
                ..
            } => {
                let a = remote_addr as usize;
                let n = local.len as usize;
                let src = self.mem[a..a + n].to_vec();
                let off = local.offset as usize;
                self.q.region_mut(local.region)[off..off + n].copy_from_slice(&src);
                WorkCompletion {
                    wr_id,
                    ok: true,
                    byte_len: 0,
                }
            }
            WorkRequest::Write {
                wr_id,
                local,
                remote_addr,
                ..
            } => {
                let a = remote_addr as usize;
                let n = local.len as usize;
                let src = if local.region == Region::Zeroes {
                    vec![0; n]
                } else {
                    let off = local.offset as usize;
                    self.q.region_mut(local.region)[off..off + n].to_vec()
                };
                self.mem[a..a + n].copy_from_slice(&src);
                WorkCompletion {
                    wr_id,
                    ok: true,
                    byte_len: 0,
                }
            }
            _ => unreachable!(),
        }
    }

    /// The host sends a capsule: the device puts it in the next posted
    /// receive buffer.
    fn send(&mut self, cmd: &Command, icd: &[u8]) {
        let wr_id = self.posted.pop_front().expect("a posted receive buffer");
        let i = (wr_id & 0xffff) as u16;
        let buf = self.q.region_mut(Region::Recv(i));
        buf[..64].copy_from_slice(cmd.as_bytes());
        buf[64..64 + icd.len()].copy_from_slice(icd);
        self.q.on_completion(
            &WorkCompletion {
                wr_id,
                ok: true,
                byte_len: (64 + icd.len()) as u32,
            },
            0,
        );
        self.run();
    }

    fn last_status(&mut self, cid: u16) -> Status {
        let (c, _) = self.responses.last().copied().expect("a response");
        assert_eq!(c.cid(), cid);
        c.status()
    }
}

fn keyed(addr: u64, len: u32, key: u32, invalidate: bool) -> SglDescriptor {
    SglDescriptor::keyed(addr, len, key, invalidate)
}

/// Admin Connect (data fetched by RDMA READ, as the Linux host sends it)
/// and controller enable; then an I/O queue Connect with in-capsule data.
fn connected(t: &Arc<Target>, read_depth: u8) -> (Host, Host) {
    let mut a = Host::new(t, &params(32, read_depth));
    let data = ConnectData::new([4; 16], 0xFFFF, NQN, HOST);
    a.mem[0x100..0x100 + 1024].copy_from_slice(data.as_bytes());
    let mut c = Command::connect(1, 0, 31, 0, 0);
    c.set_sgl(keyed(0x100, 1024, 0x11, false));
    a.send(&c, &[]);
    assert_eq!(a.last_status(1), Status::SUCCESS);
    a.send(&Command::property_set(2, CC, false, 0x0046_0001), &[]);
    assert_eq!(a.last_status(2), Status::SUCCESS);
    let cntlid = a.q.queue().controller().unwrap().cntlid();

    let mut io = Host::new(t, &params(32, read_depth));
    let data = ConnectData::new([4; 16], cntlid, NQN, HOST);
    let mut c = Command::connect(1, 1, 31, 0, 0);
    c.set_sgl(SglDescriptor::in_capsule(0, 1024));
    io.send(&c, data.as_bytes());
    assert_eq!(io.last_status(1), Status::SUCCESS);
    (a, io)
}

#[test]
fn writes_are_read_from_host_memory_and_reads_written_back_before_the_response() {
    let t = target();
    let (_a, mut io) = connected(&t, 16);
    for (i, b) in io.mem[0x1000..0x5000].iter_mut().enumerate() {
        *b = (i * 13 + 5) as u8;
    }
    io.log.clear();
    io.send(
        &rw(
            IoOpcode::Write,
            10,
            64,
            32,
            keyed(0x1000, 16384, 0x22, false),
        ),
        &[],
    );
    assert_eq!(io.last_status(10), Status::SUCCESS);
    let kinds: Vec<&str> = io
        .log
        .iter()
        .map(|w| match w {
            WorkRequest::Recv { .. } => "recv",
            WorkRequest::Read { .. } => "read",
            WorkRequest::Write { .. } => "write",
            WorkRequest::Send { .. } => "send",
        })
        .collect();
    let mut sorted = kinds.clone();
    sorted.sort();
    assert_eq!(
        sorted,
        ["read", "recv", "send"],
        "receive reposted, data read, a response"
    );
    let sq: Vec<&str> = kinds.iter().copied().filter(|k| *k != "recv").collect();
    assert_eq!(
        sq,
        ["read", "send"],
        "the data is read before the response goes out"
    );

    io.log.clear();
    io.send(
        &rw(
            IoOpcode::Read,
            11,
            64,
            32,
            keyed(0x10000, 16384, 0x33, true),
        ),
        &[],
    );
    assert_eq!(io.last_status(11), Status::SUCCESS);
    assert_eq!(io.mem[0x10000..0x14000], io.mem[0x1000..0x5000]);
    let write_then_send = io
        .log
        .iter()
        .filter(|w| !matches!(w, WorkRequest::Recv { .. }))
        .collect::<Vec<_>>();
    assert!(matches!(
        write_then_send[0],
        WorkRequest::Write { rkey: 0x33, .. }
    ));
    assert!(matches!(write_then_send[1], WorkRequest::Send { .. }));
    assert_eq!(
        io.responses.last().unwrap().1,
        Some(0x33),
        "the host asked for remote invalidation: SEND with Invalidate of its key"
    );

    // In-capsule write data, read back.
    io.send(
        &rw(
            IoOpcode::Write,
            12,
            200,
            2,
            SglDescriptor::in_capsule(0, 1024),
        ),
        &[0x5Au8; 1024],
    );
    assert_eq!(io.last_status(12), Status::SUCCESS);
    io.send(
        &rw(
            IoOpcode::Read,
            13,
            200,
            2,
            keyed(0x20000, 1024, 0x44, false),
        ),
        &[],
    );
    assert_eq!(io.mem[0x20000..0x20400], [0x5Au8; 1024][..]);
    assert_eq!(io.responses.last().unwrap().1, None);
    assert_eq!(io.q.in_flight(), 0);
    assert_eq!(io.q.sends_in_flight(), 0);
}

#[test]
fn rdma_reads_in_flight_never_exceed_the_read_depth() {
    let t = target();
    let (_a, mut io) = connected(&t, 2);
    io.hold_reads = true;
    for cid in 0..6u16 {
        io.send(
            &rw(
                IoOpcode::Write,
                20 + cid,
                u64::from(cid) * 16,
                16,
                keyed(0x1000, 8192, 7, false),
            ),
            &[],
        );
    }
    assert_eq!(
        io.held.len(),
        2,
        "read depth 2: two READs posted, four waiting"
    );
    for _ in 0..10 {
        if io.held.is_empty() {
            break;
        }
        let wr = io.held.remove(0);
        let wc = io.serve(wr);
        io.q.on_completion(&wc, 0);
        io.run();
        assert!(io.held.len() <= 2);
    }
    let ok = io
        .responses
        .iter()
        .filter(|(c, _)| (20..26).contains(&c.cid()) && c.status() == Status::SUCCESS)
        .count();
    assert_eq!(ok, 6, "every write completed once its data came");
}

#[test]
fn a_failed_work_request_or_a_runt_capsule_closes_the_queue() {
    let t = target();
    let (_a, mut io) = connected(&t, 4);
    let wr_id = *io.posted.front().unwrap();
    io.q.on_completion(
        &WorkCompletion {
            wr_id,
            ok: false,
            byte_len: 0,
        },
        0,
    );
    assert!(io.q.close_reason().is_some());

    let (_a, mut io) = connected(&t, 4);
    let wr_id = io.posted.pop_front().unwrap();
    io.q.on_completion(
        &WorkCompletion {
            wr_id,
            ok: true,
            byte_len: 40,
        },
        0,
    );
    assert_eq!(
        io.q.close_reason(),
        Some("NVMe/RDMA capsule shorter than a command")
    );
}

#[test]
fn a_command_before_connect_closes_the_queue_without_touching_host_memory() {
    let t = target();
    let mut h = Host::new(&t, &params(32, 4));
    h.log.clear();
    h.send(
        &rw(IoOpcode::Read, 1, 0, 1, keyed(0x1000, 512, 9, false)),
        &[],
    );
    assert!(h.q.close_reason().is_some());
    assert!(
        !h.log
            .iter()
            .any(|w| matches!(w, WorkRequest::Read { .. } | WorkRequest::Write { .. })),
        "{:?}",
        h.log
    );
}

/// A queue pair whose work requests fail (retry exceeded on a READ, then the
/// device flushes everything else, a completion seen twice): the queue closes
/// once, posts nothing more (no READ for the writes still waiting, no
/// response to a host that is gone), its send and READ accounting reaches
/// zero, and dropping both queues frees the controller. No panic anywhere.
#[test]
fn error_completions_close_the_queue_once_and_nothing_more_is_posted() {
    let t = target();
    let (a, mut io) = connected(&t, 2);
    assert_eq!(t.active_controllers(), 1);
    io.hold_reads = true;
    for cid in 0..4u16 {
        io.send(
            &rw(
                IoOpcode::Write,
                40 + cid,
                u64::from(cid) * 16,
                16,
                keyed(0x1000, 8192, 7, false),
            ),
            &[],
        );
    }
    assert_eq!(io.held.len(), 2, "two READs posted, two waiting");
    let reads: Vec<u64> = io
        .held
        .drain(..)
        .map(|wr| match wr {
            WorkRequest::Read { wr_id, .. } => wr_id,
            other => panic!("held {other:?}"),
        })
        .collect();
    let fail = |wr_id| WorkCompletion {
        wr_id,
        ok: false,
        byte_len: 0,
    };
    // retry exceeded on the first READ: the host is gone
    io.q.on_completion(&fail(reads[0]), 0);
    let reason = io.q.close_reason();
    assert!(reason.is_some(), "an error completion closes the queue");
    // the device flushes the rest: the other READ, every posted receive,
    // and a completion delivered twice
    io.q.on_completion(&fail(reads[1]), 0);
    io.q.on_completion(&fail(reads[1]), 0);
    for wr_id in io.posted.drain(..).collect::<Vec<_>>() {
        io.q.on_completion(&fail(wr_id), 0);
    }
    assert_eq!(
        io.q.close_reason(),
        reason,
        "closed once, for the first reason"
    );
    io.q.poll(std::time::Instant::now());
    let mut work = Vec::new();
    io.q.take_work(&mut work);
    assert!(
        work.is_empty(),
        "nothing is posted on a failed queue pair: {work:?}"
    );
    assert_eq!(io.q.sends_in_flight(), 0);
    drop(io);
    drop(a);
    assert_eq!(t.active_controllers(), 0, "the controller was freed");
}
