//! The NVMe/RDMA queue state machine against a simulated host: the test
//! plays the host's side of the queue pair (posting capsules into the
//! receive buffers in order, serving RDMA READ and WRITE from and into its
//! own memory, receiving SENDs) and the device's completion queue. Checks
//! the work requests the queue asks for, their order and bounds, and the
//! data that ends up in host memory and on the namespace. With a shared
//! receive queue the test also plays the device's SRQ: capsules land in the
//! next posted buffer of a pool several queues share.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nvmf_config::{BdevKind, TransportType};
use nvmf_core::{PortInfo, Target};
use nvmf_rdma::{
    RdmaQueue, RdmaQueueParams, RecvPool, RecvPost, Region, WorkCompletion, WorkRequest,
};
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
        shared_receives: false,
        connect: None,
    }
}

/// Capsule bytes of the pool (64 + the in-capsule data size of `params`).
const CAPSULE: usize = 64 + 4096;

/// A device's shared receive queue as the test plays it: the pool, and its
/// buffers posted on the SRQ in the order the device fills them.
struct Srq {
    pool: RecvPool,
    posted: VecDeque<RecvPost>,
}

impl Srq {
    fn new(count: u32) -> Rc<RefCell<Srq>> {
        let mut s = Srq {
            pool: RecvPool::new(count, CAPSULE),
            posted: VecDeque::new(),
        };
        s.repost();
        assert_eq!(s.posted.len(), count as usize, "every buffer posted");
        Rc::new(RefCell::new(s))
    }

    /// The caller's batched repost of the buffers given back.
    fn repost(&mut self) {
        let mut v = Vec::new();
        self.pool.take_posts(&mut v);
        self.posted.extend(v);
    }

    /// The device puts a capsule into the next posted buffer (whichever
    /// queue pair it arrives on) and reports the receive completion.
    fn fill(&mut self, capsule: &[u8], ok: bool) -> WorkCompletion {
        let p = self.posted.pop_front().expect("a posted shared buffer");
        self.pool.memory()[p.offset..p.offset + capsule.len()].copy_from_slice(capsule);
        WorkCompletion {
            wr_id: p.wr_id,
            ok,
            byte_len: capsule.len() as u32,
        }
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
    /// SEND completions the device has not reported yet (the host already
    /// has the response) when `hold_sends` is set.
    held_sends: Vec<WorkCompletion>,
    hold_sends: bool,
    /// The shared receive queue the queue pair takes its receives from.
    srq: Option<Rc<RefCell<Srq>>>,
    /// Liveness probes posted and not yet completed (the test completes them).
    probes: Vec<u64>,
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
            held_sends: Vec::new(),
            hold_sends: false,
            srq: None,
            probes: Vec::new(),
        };
        h.run();
        assert_eq!(
            h.posted.len(),
            usize::from(p.entries),
            "every receive buffer posted"
        );
        h
    }

    /// A queue pair on the shared receive queue `srq`: it posts no receive.
    fn shared(t: &Arc<Target>, p: &RdmaQueueParams, srq: &Rc<RefCell<Srq>>) -> Host {
        let p = RdmaQueueParams {
            shared_receives: true,
            ..p.clone()
        };
        let mut q = RdmaQueue::new(t.clone(), port(), &p);
        q.start();
        let mut h = Host {
            q,
            mem: vec![0; 1 << 20],
            posted: VecDeque::new(),
            responses: Vec::new(),
            log: Vec::new(),
            held: Vec::new(),
            hold_reads: false,
            held_sends: Vec::new(),
            hold_sends: false,
            srq: Some(srq.clone()),
            probes: Vec::new(),
        };
        h.run();
        assert!(h.posted.is_empty(), "no receive of its own");
        assert!(
            h.q.recv_buffers().is_empty(),
            "no receive buffer of its own"
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
                    WorkRequest::Probe { wr_id } => self.probes.push(wr_id),
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
                        let wc = WorkCompletion {
                            wr_id,
                            ok: true,
                            byte_len: 0,
                        };
                        if self.hold_sends {
                            self.held_sends.push(wc);
                        } else {
                            done.push(wc);
                        }
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
        if let Some(srq) = self.srq.clone() {
            let mut capsule = cmd.as_bytes().to_vec();
            capsule.extend_from_slice(icd);
            let mut srq = srq.borrow_mut();
            let wc = srq.fill(&capsule, true);
            self.q.on_shared_recv(&mut srq.pool, &wc, 0);
            srq.repost();
            drop(srq);
            self.run();
            return;
        }
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

/// As [`connected`], both queue pairs on one shared receive queue of
/// `buffers` buffers.
fn connected_shared(t: &Arc<Target>, buffers: u32) -> (Host, Host, Rc<RefCell<Srq>>) {
    let srq = Srq::new(buffers);
    let mut a = Host::shared(t, &params(32, 4), &srq);
    let data = ConnectData::new([4; 16], 0xFFFF, NQN, HOST);
    a.mem[0x100..0x100 + 1024].copy_from_slice(data.as_bytes());
    let mut c = Command::connect(1, 0, 31, 0, 0);
    c.set_sgl(keyed(0x100, 1024, 0x11, false));
    a.send(&c, &[]);
    assert_eq!(a.last_status(1), Status::SUCCESS);
    a.send(&Command::property_set(2, CC, false, 0x0046_0001), &[]);
    assert_eq!(a.last_status(2), Status::SUCCESS);
    let cntlid = a.q.queue().controller().unwrap().cntlid();
    let mut io = Host::shared(t, &params(32, 4), &srq);
    let data = ConnectData::new([4; 16], cntlid, NQN, HOST);
    let mut c = Command::connect(1, 1, 31, 0, 0);
    c.set_sgl(SglDescriptor::in_capsule(0, 1024));
    io.send(&c, data.as_bytes());
    assert_eq!(io.last_status(1), Status::SUCCESS);
    (a, io, srq)
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
            WorkRequest::Probe { .. } => "probe",
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

/// Two queue pairs (admin and I/O) on one shared receive queue of 4
/// buffers: every capsule (Connects, in-capsule writes, keyed reads, admin
/// commands in between) is parsed from a pool buffer, each buffer is given
/// back and reposted right after its command, so 4 buffers carry far more
/// commands than that, and neither queue ever posts a receive.
#[test]
fn shared_receive_capsules_run_from_the_pool_and_every_buffer_goes_back() {
    let t = target();
    let (mut a, mut io, srq) = connected_shared(&t, 4);
    for k in 0..12u16 {
        let fill = [k as u8 ^ 0xA5; 1024];
        io.send(
            &rw(
                IoOpcode::Write,
                100 + k,
                u64::from(k) * 2,
                2,
                SglDescriptor::in_capsule(0, 1024),
            ),
            &fill,
        );
        assert_eq!(io.last_status(100 + k), Status::SUCCESS);
        let at = 0x8000 + usize::from(k) * 0x400;
        io.send(
            &rw(
                IoOpcode::Read,
                200 + k,
                u64::from(k) * 2,
                2,
                keyed(at as u64, 1024, 0x55, false),
            ),
            &[],
        );
        assert_eq!(io.last_status(200 + k), Status::SUCCESS);
        assert_eq!(io.mem[at..at + 1024], fill[..], "in-capsule data landed");
        // the admin queue takes its capsules from the same pool
        a.send(&Command::new(0x18, 300 + k), &[]); // Keep Alive
        assert_eq!(a.last_status(300 + k), Status::SUCCESS);
        let s = srq.borrow();
        assert_eq!(s.pool.held(), 0, "no buffer kept after its command");
        assert_eq!(s.pool.posted(), 4, "every buffer posted again");
    }
    for h in [&a, &io] {
        assert!(
            !h.log.iter().any(|w| matches!(w, WorkRequest::Recv { .. })),
            "a queue on a shared receive queue posts no receive"
        );
    }
    assert!(a.q.close_reason().is_none() && io.q.close_reason().is_none());
}

/// A queue pair dies with shared buffers it consumed: the flushed receive
/// closes its queue and gives the buffer back; a runt capsule on another
/// queue does too; the same completion seen again (or a wr_id never
/// posted) is ignored, so no buffer is posted twice; buffers the device
/// took for a queue pair whose completions the caller drains after the
/// queue is gone go back through the pool alone; the other queue keeps
/// working on the same pool.
#[test]
fn a_queue_dying_with_shared_buffers_loses_none_and_posts_none_twice() {
    let t = target();
    let (mut a, mut io, srq) = connected_shared(&t, 4);
    // a capsule in flight for the I/O queue pair when it dies: flushed
    let wc = srq.borrow_mut().fill(&[0u8; 64], false);
    io.q.on_shared_recv(&mut srq.borrow_mut().pool, &wc, 0);
    assert!(
        io.q.close_reason().is_some(),
        "a flushed receive closes the queue"
    );
    assert_eq!(srq.borrow().pool.held(), 0);
    assert_eq!(srq.borrow().pool.idle(), 1, "the flushed buffer came back");
    // the flush delivered twice, and a stale wr_id: nothing changes
    io.q.on_shared_recv(&mut srq.borrow_mut().pool, &wc, 0);
    let stale = WorkCompletion {
        wr_id: wc.wr_id + 1000,
        ok: true,
        byte_len: 64,
    };
    io.q.on_shared_recv(&mut srq.borrow_mut().pool, &stale, 0);
    assert_eq!(srq.borrow().pool.idle(), 1, "given back once");
    srq.borrow_mut().repost();
    assert_eq!(srq.borrow().pool.posted(), 4);
    // two more capsules the device took for the dying queue pair, never
    // delivered to its queue: the caller drains its CQ and gives them back
    let lost: Vec<WorkCompletion> = (0..2)
        .map(|_| srq.borrow_mut().fill(&[0u8; 64], true))
        .collect();
    drop(io);
    {
        let mut s = srq.borrow_mut();
        for wc in &lost {
            let i = s.pool.complete(wc.wr_id).expect("posted");
            s.pool.give_back(i);
        }
        s.repost();
        assert_eq!((s.pool.posted(), s.pool.held()), (4, 0), "none lost");
        assert_eq!(s.posted.len(), 4, "each buffer on the SRQ once");
        let mut ids: Vec<u64> = s.posted.iter().map(|p| p.wr_id).collect();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), 4, "no buffer posted twice");
    }
    // a runt capsule on the admin queue: closed, buffer back
    let mut b = {
        let (b, _io2, _srq2) = connected_shared(&t, 4);
        b
    };
    let s2 = b.srq.clone().unwrap();
    let wc = s2.borrow_mut().fill(&[0u8; 40], true);
    b.q.on_shared_recv(&mut s2.borrow_mut().pool, &wc, 0);
    assert_eq!(
        b.q.close_reason(),
        Some("NVMe/RDMA capsule shorter than a command")
    );
    assert_eq!(s2.borrow().pool.held(), 0);
    // the surviving admin queue still runs on the first pool
    a.send(&Command::new(0x18, 77), &[]);
    assert_eq!(a.last_status(77), Status::SUCCESS);
    assert_eq!(srq.borrow().pool.posted(), 4);
}

impl Host {
    /// A timer tick at `at`, then the work it asked for.
    fn tick(&mut self, at: Instant) {
        self.q.poll(at);
        self.run();
    }

    /// The device completes the oldest probe.
    fn answer_probe(&mut self, ok: bool) {
        let wr_id = self.probes.remove(0);
        self.q.on_completion(
            &WorkCompletion {
                wr_id,
                ok,
                byte_len: 0,
            },
            0,
        );
        self.run();
    }
}

const S: fn(u64) -> Duration = Duration::from_secs;

#[test]
fn a_quiet_queue_is_probed_and_an_answered_probe_keeps_it() {
    let t = target();
    let (_a, mut io) = connected(&t, 4);
    let t0 = Instant::now();
    io.tick(t0);
    io.tick(t0 + Duration::from_millis(9_900));
    assert!(io.probes.is_empty(), "no probe before 10 s of quiet");
    io.tick(t0 + S(10));
    assert_eq!(io.probes.len(), 1, "a probe after 10 s of quiet");
    assert!(matches!(io.log.last(), Some(WorkRequest::Probe { .. })));
    assert!(io.q.probing());
    // one probe at a time; within its deadline the queue stays open
    io.tick(t0 + S(14));
    io.tick(t0 + S(15));
    assert_eq!(io.probes.len(), 1);
    assert_eq!(io.q.close_reason(), None);
    io.answer_probe(true);
    assert!(!io.q.probing());
    assert_eq!(
        io.q.close_reason(),
        None,
        "an answered probe keeps the queue"
    );
    // the answer restarts the quiet clock: the next probe 10 s later
    io.tick(t0 + S(16));
    io.tick(t0 + S(25));
    assert!(io.probes.is_empty());
    io.tick(t0 + S(26));
    assert_eq!(io.probes.len(), 1);
    assert_eq!(io.q.probes(), 2);
    assert!(
        io.responses.iter().all(|(c, _)| c.cid() == 1),
        "no command answered"
    );
}

#[test]
fn a_failed_probe_closes_the_queue() {
    let t = target();
    let (_a, mut io) = connected(&t, 4);
    let t0 = Instant::now();
    io.tick(t0);
    io.tick(t0 + S(10));
    assert_eq!(io.probes.len(), 1);
    io.answer_probe(false);
    assert_eq!(
        io.q.close_reason(),
        Some("liveness probe failed (peer gone)")
    );
    io.tick(t0 + S(30));
    assert!(io.probes.is_empty(), "no probe once closing");
}

#[test]
fn an_unanswered_probe_closes_the_queue_after_its_deadline() {
    let t = target();
    let (mut a, _io) = connected(&t, 4);
    let t0 = Instant::now();
    a.tick(t0);
    a.tick(t0 + S(10));
    assert_eq!(a.probes.len(), 1, "the admin queue is probed too");
    a.tick(t0 + S(15));
    assert_eq!(a.q.close_reason(), None, "still within the 5 s deadline");
    a.tick(t0 + Duration::from_millis(15_100));
    assert_eq!(
        a.q.close_reason(),
        Some("liveness probe not answered in time (peer gone)")
    );
    // the flush of the probe after the disconnect changes nothing
    a.answer_probe(false);
    assert_eq!(
        a.q.close_reason(),
        Some("liveness probe not answered in time (peer gone)")
    );
}

#[test]
fn no_probe_while_commands_complete_or_before_connect() {
    let t = target();
    let (_a, mut io) = connected(&t, 4);
    let t0 = Instant::now();
    io.tick(t0);
    for i in 1..=40u64 {
        let cid = 10 + i as u16;
        io.send(
            &rw(IoOpcode::Read, cid, 0, 8, keyed(0x1000, 4096, 0x22, false)),
            &[],
        );
        assert_eq!(io.last_status(cid), Status::SUCCESS);
        io.tick(t0 + S(i));
    }
    assert!(io.probes.is_empty(), "no probe while I/O flows");
    assert_eq!(io.q.probes(), 0);

    // a queue pair that never sent its Fabrics Connect (the connect timeout's job)
    let mut fresh = Host::new(&t, &params(32, 4));
    fresh.tick(t0);
    fresh.tick(t0 + S(60));
    assert!(fresh.probes.is_empty());

    // probing off
    let (_a, mut io) = connected(&t, 4);
    io.q.set_liveness(nvmf_rdma::Liveness {
        idle: Duration::ZERO,
        deadline: S(5),
    });
    io.tick(t0);
    io.tick(t0 + S(60));
    assert!(io.probes.is_empty());
}

#[test]
fn a_probe_on_a_shared_receive_queue_is_not_taken_for_a_receive() {
    let t = target();
    let (_a, mut io, _srq) = connected_shared(&t, 64);
    let t0 = Instant::now();
    io.tick(t0);
    io.tick(t0 + S(10));
    assert_eq!(io.probes.len(), 1);
    // the port routes completions the pool owns to the pool: a probe's must not be one
    assert!(!RecvPool::owns(io.probes[0]));
    io.answer_probe(true);
    assert_eq!(io.q.close_reason(), None);
}

/// An admin queue connected as in [`connected`], and the controller ID.
fn admin(t: &Arc<Target>) -> (Host, u16) {
    let mut a = Host::new(t, &params(32, 4));
    let data = ConnectData::new([4; 16], 0xFFFF, NQN, HOST);
    let mut c = Command::connect(1, 0, 31, 0, 0);
    c.set_sgl(SglDescriptor::in_capsule(0, 1024));
    a.send(&c, data.as_bytes());
    assert_eq!(a.last_status(1), Status::SUCCESS);
    a.send(&Command::property_set(2, CC, false, 0x0046_0001), &[]);
    assert_eq!(a.last_status(2), Status::SUCCESS);
    let cntlid = a.q.queue().controller().unwrap().cntlid();
    (a, cntlid)
}

/// An I/O queue accepted for the RDMA_CM request `req` (its entries from
/// HSQSIZE, as the port sizes it).
fn io_for(t: &Arc<Target>, req: nvmf_wire::rdma::ConnectRequest) -> Host {
    let p = RdmaQueueParams {
        entries: req.hsqsize + 1,
        connect: Some(req),
        ..params(2, 4)
    };
    Host::new(t, &p)
}

#[test]
fn the_fabrics_connect_must_match_the_rdma_cm_request() {
    // Issue 23 finding 1: a host asks for HSQSIZE 1 in the CM request (the
    // queue is sized for 2 commands) and then Connects with SQSIZE 127.
    let t = target();
    let (_a, cntlid) = admin(&t);
    let req = nvmf_wire::rdma::ConnectRequest {
        qid: 1,
        hrqsize: 2,
        hsqsize: 1,
        cntlid,
    };
    let data = ConnectData::new([4; 16], cntlid, NQN, HOST);
    let refused = Status::CONNECT_INVALID_PARAMETERS.with_dnr();
    // SQSIZE above the request's HSQSIZE.
    let mut io = io_for(&t, req);
    io.send(&Command::connect(1, 1, 127, 0, 0), data.as_bytes());
    assert_eq!(
        io.last_status(1),
        refused,
        "SQSIZE 127 on an HSQSIZE 1 queue"
    );
    assert!(!io.q.queue().is_connected());
    // Another QID than the request's.
    io.send(&Command::connect(2, 2, 1, 0, 0), data.as_bytes());
    assert_eq!(
        io.last_status(2),
        refused,
        "QID 2 on a queue requested as QID 1"
    );
    // Another controller than the request named.
    let mut other = req;
    other.cntlid = cntlid.wrapping_add(7);
    let mut io2 = io_for(&t, other);
    io2.send(&Command::connect(3, 1, 1, 0, 0), data.as_bytes());
    assert_eq!(
        io2.last_status(3),
        refused,
        "CNTLID differs from the request's"
    );
    // The matching Connect is taken.
    io.send(&Command::connect(4, 1, 1, 0, 0), data.as_bytes());
    assert_eq!(io.last_status(4), Status::SUCCESS);
    assert_eq!(io.q.queue().depth(), 2);
}

#[test]
fn a_host_over_the_queues_response_buffers_is_disconnected_not_a_panic() {
    // Issue 23 finding 1, without the CM check (connect: None): the queue
    // was sized for 2 commands, the Connect said 128. Before the engine
    // capped its slots at the transport's `slots_for`, the 11th
    // outstanding command indexed past the response buffers (a panic on
    // the reactor) and the 3rd..10th overwrote the buffers of AER answers.
    let t = target();
    let (_a, cntlid) = admin(&t);
    let mut io = Host::new(&t, &params(2, 4));
    let data = ConnectData::new([4; 16], cntlid, NQN, HOST);
    io.send(&Command::connect(1, 1, 127, 0, 0), data.as_bytes());
    assert_eq!(io.last_status(1), Status::SUCCESS);
    io.hold_reads = true;
    for cid in 0..16u16 {
        if io.q.close_reason().is_some() {
            break;
        }
        io.send(
            &rw(
                IoOpcode::Write,
                100 + cid,
                u64::from(cid) * 16,
                16,
                keyed(0x1000, 8192, 7, false),
            ),
            &[],
        );
    }
    // Whatever is held completes without touching a buffer that is not
    // the slot's own (the READs still waiting for read depth follow).
    io.hold_reads = false;
    for _ in 0..32 {
        let Some(wr) = io.held.pop() else { break };
        let wc = io.serve(wr);
        io.q.on_completion(&wc, 0);
        io.run();
    }
    assert!(
        io.q.close_reason().is_some(),
        "a host over the queue's size is a protocol fault"
    );
    for (c, _) in &io.responses {
        assert!(c.cid() == 1 || (100..116).contains(&c.cid()));
    }
}

#[test]
fn a_cid_is_the_hosts_again_once_its_response_is_sent() {
    // Seen with Linux 6.12's nvme-rdma over soft-RoCE: the host has our
    // response (and reuses its CID) before the device reports our SEND
    // complete. The slot stays busy until then, but its CID may not: the
    // old code answered "command ID already in use" and closed the queue.
    let t = target();
    let (_a, mut io) = connected(&t, 4);
    io.hold_sends = true;
    for round in 0..3u64 {
        // As many commands as the queue holds, one after the other with
        // the same CID, every response still in flight.
        for i in 0..31u64 {
            io.send(
                &rw(
                    IoOpcode::Read,
                    7,
                    round * 64 + i,
                    1,
                    keyed(0x2000, 512, 9, false),
                ),
                &[],
            );
            assert_eq!(
                io.last_status(7),
                Status::SUCCESS,
                "round {round} command {i}"
            );
        }
        assert_eq!(io.held_sends.len(), 31);
        assert!(io.q.close_reason().is_none(), "{:?}", io.q.close_reason());
        // The device reports the SENDs late; the slots are freed then.
        for wc in std::mem::take(&mut io.held_sends) {
            io.q.on_completion(&wc, 0);
        }
        io.run();
    }
    assert!(io.q.close_reason().is_none());
}
