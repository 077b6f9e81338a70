//! The NVMe/RDMA queue fuzzer: [`RdmaInput`] (an `arbitrary` session) played
//! against up to [`MAX_QUEUES`] `nvmf_rdma::RdmaQueue`s of one in-process
//! target, the harness being both the host and the RDMA device.
//!
//! Each queue starts from an RDMA_CM connect request's private data, parsed
//! with `nvmf_wire::rdma::parse_connect_request` as the port does (a bad one
//! is rejected and no queue exists) and the read depth negotiated from an
//! arbitrary initiator depth; then capsules (Fabrics Connect, Property
//! Set/Get, admin and I/O commands with keyed SGLs into host memory regions,
//! unknown keys or ranges past a region, in-capsule data, raw SQEs, runt and
//! oversized capsules) arrive in the receive buffers the queue posted, or in
//! the buffers of a shared receive queue's `RecvPool`. The device executes
//! the queue's RDMA READs, WRITEs, SENDs and probes in order (automatic) or
//! in any order the input picks (held), fails them, flushes the whole queue
//! pair, delivers completions for `wr_id`s never posted or already
//! completed; the clock advances (`poll`); queues are dropped with work in
//! flight.
//!
//! Invariants (a panic is a finding):
//! - nothing panics;
//! - every work request's local memory lies inside the buffer `region_mut`
//!   gives for it, and a slot buffer a READ or WRITE names is still the same
//!   allocation when the device uses it; the zero buffer is long enough;
//! - no receive buffer posted twice, no two work requests in flight with one
//!   `wr_id`, at most one probe, no receive posted by a queue on a shared
//!   receive queue;
//! - no SEND names a response buffer that another SEND in flight uses, and
//!   the response it carries is not overwritten before the device read it;
//!   response buffers past the queue's slots (twice its entries) carry only
//!   AER completions;
//! - at most twice `entries` commands outstanding (responses whose SEND has
//!   not completed, and the host's next commands) unless the queue is closing,
//!   and RDMA READs in flight never exceed the negotiated read depth;
//! - once the queue asked to close, it posts no READ, WRITE, SEND or probe;
//! - every response names a command the host has outstanding (one response
//!   per command), a SEND with Invalidate names the key of the command it
//!   answers and only when that command asked for it;
//! - `sends_in_flight()` matches the SENDs the device holds; the queue's
//!   buffers keep their size; slot buffers stay within the I/O size;
//! - the shared pool loses no buffer: none held after a call returns, every
//!   buffer idle or posted, none posted twice, also after disconnects;
//! - after every queue is dropped the target has no active controller;
//! - reads return what the writes the host saw complete put there
//!   (`shadow.rs`).
//!
//! `NVMF_FUZZ_TRACE=1` prints every action, work request and response.

use crate::input::{Cid, Data, Lba, Len, Nsid, Pick16, SubNqn};
use crate::shadow::{PendingRead, PendingWrite, Shadow};
use arbitrary::{Arbitrary, Unstructured};
use nvmf_config::{AddressFamily, TargetConfig, TransportType};
use nvmf_core::{PortInfo, Target};
use nvmf_rdma::{
    Local, RdmaQueue, RdmaQueueParams, RecvPool, RecvPost, Region, WorkCompletion, WorkRequest,
};
use nvmf_wire::command::{Command, SglDescriptor};
use nvmf_wire::completion::Completion;
use nvmf_wire::fabrics::{ConnectData as ConnectBlock, CC, CC_EN, CNTLID_DYNAMIC, CSTS, VS};
use nvmf_wire::rdma::{
    negotiate_read_depth, parse_connect_request, RdmaCmRequest, RdmaQueueLimits,
};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use zerocopy::{FromBytes, FromZeros, IntoBytes};

/// Queues one input may drive at once.
pub const MAX_QUEUES: usize = 3;
/// Most actions one case plays.
pub const MAX_RDMA_OPS: usize = 256;

const NVM_NQN: &str = "nqn.2024-01.io.nvmfd:fuzz-rdma";
const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";
const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-00000000f0d1";
const MALLOC_BLOCKS: u64 = 8192;
const NULL_BLOCKS: u64 = 262_144;
const ICD: u32 = 4096;
const MAX_IO: u32 = 128 * 1024;
/// I/O and admin queue depth of the RDMA transport.
const QUEUE_DEPTH: u32 = 128;
/// The device's RDMA READ limit (`max_qp_rd_atom`) and the port's.
const DEVICE_READ_DEPTH: u8 = 16;
/// Capsule bytes (SQE + in-capsule data).
const CAPSULE: usize = 64 + ICD as usize;
/// Largest host memory region the harness registers for one command.
const MR_MAX: usize = 1 << 20;
/// Keep-alive of admin queues (ms).
const KATO_MS: u32 = 30_000;

// ---------------------------------------------------------------------------
// Input
// ---------------------------------------------------------------------------

/// One RDMA fuzz case.
#[derive(Debug, Clone)]
pub struct RdmaInput {
    /// Queue pairs take their receives from one shared receive queue of
    /// `n % 16 + 1` buffers (`None`: each queue posts its own).
    pub srq: Option<u8>,
    pub ops: Vec<ROp>,
}

impl<'a> Arbitrary<'a> for RdmaInput {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        Ok(RdmaInput {
            srq: u.arbitrary()?,
            ops: u
                .arbitrary_iter()?
                .take(MAX_RDMA_OPS)
                .collect::<Result<_, _>>()?,
        })
    }

    /// Actions follow one another until the bytes run out (as `Input`).
    fn arbitrary_take_rest(mut u: Unstructured<'a>) -> arbitrary::Result<Self> {
        let srq = u.arbitrary()?;
        let mut ops = Vec::new();
        while !u.is_empty() && ops.len() < MAX_RDMA_OPS {
            match ROp::arbitrary(&mut u) {
                Ok(op) => ops.push(op),
                Err(_) => break,
            }
        }
        Ok(RdmaInput { srq, ops })
    }
}

/// One action. `q` is taken modulo [`MAX_QUEUES`]; an action on a slot
/// without a queue first accepts one with a good connect request and
/// connects it (slot 0: admin queue, enabled; others: I/O queues of slot
/// 0's controller).
#[derive(Debug, Clone, Arbitrary)]
pub enum ROp {
    /// (Re)accept a queue: CM private data, host initiator depth.
    Accept {
        q: u8,
        cm: CmSpec,
        ird: Ird,
    },
    /// A Fabrics Connect capsule.
    Connect {
        q: u8,
        spec: FConnect,
    },
    Cmd {
        q: u8,
        cmd: RCmd,
    },
    Cmd2 {
        q: u8,
        cmd: RCmd,
    },
    Cmd3 {
        q: u8,
        cmd: RCmd,
    },
    /// A raw SQE with `icd` bytes of in-capsule data, the receive length
    /// as `len` says.
    Capsule {
        q: u8,
        sqe: [u8; 64],
        icd: u16,
        len: CapLen,
    },
    /// The device stops (or resumes) executing this queue's send-queue
    /// work on its own.
    Hold {
        q: u8,
        on: bool,
    },
    /// The device executes (or fails) one send-queue work request in flight.
    Complete {
        q: u8,
        pick: u8,
        ok: bool,
    },
    Complete2 {
        q: u8,
        pick: u8,
        ok: bool,
    },
    /// The device runs everything in flight, in order.
    Run {
        q: u8,
    },
    /// The queue pair goes to the error state: everything in flight
    /// completes flushed.
    Flush {
        q: u8,
    },
    /// A completion for a `wr_id` that is not in flight.
    Bogus {
        q: u8,
        id: BogusId,
        ok: bool,
    },
    /// Advance the clock and poll every queue.
    Tick {
        t: RTick,
    },
    /// Drop the queue (the port tore the connection down).
    Disconnect {
        q: u8,
    },
}

/// The connect request's private data.
#[derive(Debug, Clone, Arbitrary)]
pub enum CmSpec {
    Good(CmReq),
    Good2(CmReq),
    Good3(CmReq),
    Raw(Vec<u8>),
}

#[derive(Debug, Clone, Copy, Arbitrary)]
pub struct CmReq {
    pub qid: Pick16,
    pub hsqsize: Hsq,
    /// HRQSIZE beyond HSQSIZE + 1 (`Raw`: as given).
    pub hrqsize: Hsq,
    pub cntlid: Pick16,
    pub recfmt: u8,
}

#[derive(Debug, Clone, Copy, Arbitrary)]
pub enum Hsq {
    Auto,
    Auto2,
    Small(u8),
    Raw(u16),
}

/// The host's initiator depth.
#[derive(Debug, Clone, Copy, Arbitrary)]
pub enum Ird {
    Auto,
    Auto2,
    Raw(u8),
}

/// Fabrics Connect fields.
#[derive(Debug, Clone, Copy, Arbitrary)]
pub struct FConnect {
    pub qid: Pick16,
    pub sqsize: FSq,
    pub cntlid: Pick16,
    pub subnqn: SubNqn,
    pub data: FData,
    pub kato: u16,
}

/// SQSIZE: the connect request's HSQSIZE, or another.
#[derive(Debug, Clone, Copy, Arbitrary)]
pub enum FSq {
    Match,
    Match2,
    Match3,
    Small(u8),
    Raw(u16),
}

/// Where the 1024-byte Connect data is.
#[derive(Debug, Clone, Copy, Arbitrary)]
pub enum FData {
    InCapsule,
    InCapsule2,
    Keyed,
    Keyed2,
    BadKey,
    Short(u16),
    None,
}

/// One command.
#[derive(Debug, Clone, Arbitrary)]
pub struct RCmd {
    /// Index into [`KINDS`].
    pub op: u8,
    pub cid: Cid,
    pub nsid: Nsid,
    pub slba: Lba,
    /// 0-based block count.
    pub nlb: u8,
    pub sel: u8,
    pub cdw: [u32; 2],
    pub sgl: RSgl,
    pub data: Data,
}

/// The data pointer.
#[derive(Debug, Clone, Copy, Arbitrary)]
pub enum RSgl {
    /// What a host uses: in-capsule writes up to 4 KiB, else a keyed SGL
    /// for a host region of the command's length.
    Auto,
    Auto2,
    Auto3,
    InCapsule(Len),
    Keyed {
        len: Len,
        invalidate: bool,
    },
    /// A key the host never registered.
    BadKey(Len),
    /// A registered region, the address `n` bytes before its end.
    OffEnd(u16),
    Raw([u8; 16]),
}

/// The receive length the device reports for a raw capsule.
#[derive(Debug, Clone, Copy, Arbitrary)]
pub enum CapLen {
    Exact,
    Exact2,
    /// Shorter than an SQE.
    Runt(u8),
    /// Longer than the receive buffer by this much (the device fails it).
    Over(u16),
    /// The completion claims this many bytes whatever was sent.
    Claim(u16),
}

/// A `wr_id` not in flight.
#[derive(Debug, Clone, Copy, Arbitrary)]
pub enum BogusId {
    /// One the queue posted and that already completed.
    Stale(u8),
    /// Kind (high 32 bits, small) and index.
    Made {
        kind: u8,
        idx: u16,
    },
    Raw(u64),
}

#[derive(Debug, Clone, Copy, Arbitrary)]
pub enum RTick {
    Ms(u16),
    Sec(u8),
    /// Long enough for a liveness probe (10 s quiet).
    Idle,
    /// Past the keep-alive timeout.
    PastKato,
}

// ---------------------------------------------------------------------------
// Target
// ---------------------------------------------------------------------------

/// The target configuration: nsid 1 = 4 MiB RAM (512-byte blocks), nsid 2
/// = 1 GiB null (4 KiB blocks), listening over RDMA, plus discovery.
pub fn rdma_target_config() -> &'static TargetConfig {
    static CFG: OnceLock<TargetConfig> = OnceLock::new();
    CFG.get_or_init(|| {
        let l = r#"{"trtype":"RDMA","adrfam":"IPv4","traddr":"192.0.2.1","trsvcid":"4420"}"#;
        let json = format!(
            r#"{{"subsystems":[
 {{"subsystem":"bdev","config":[
   {{"method":"bdev_malloc_create","params":{{"name":"Malloc0","block_size":512,"num_blocks":{MALLOC_BLOCKS}}}}},
   {{"method":"bdev_null_create","params":{{"name":"Null0","block_size":4096,"num_blocks":{NULL_BLOCKS}}}}}]}},
 {{"subsystem":"nvmf","config":[
   {{"method":"nvmf_create_transport","params":{{"trtype":"RDMA","in_capsule_data_size":{ICD},"max_io_size":{MAX_IO},"max_queue_depth":{QUEUE_DEPTH},"max_aq_depth":{QUEUE_DEPTH},"max_io_qpairs_per_ctrlr":4}}}},
   {{"method":"nvmf_create_subsystem","params":{{"nqn":"{NVM_NQN}","allow_any_host":true,"serial_number":"NVMFDFUZZ0002"}}}},
   {{"method":"nvmf_subsystem_add_ns","params":{{"nqn":"{NVM_NQN}","namespace":{{"nsid":1,"bdev_name":"Malloc0"}}}}}},
   {{"method":"nvmf_subsystem_add_ns","params":{{"nqn":"{NVM_NQN}","namespace":{{"nsid":2,"bdev_name":"Null0"}}}}}},
   {{"method":"nvmf_subsystem_add_listener","params":{{"nqn":"{NVM_NQN}","listen_address":{l}}}}},
   {{"method":"nvmf_subsystem_add_listener","params":{{"nqn":"{DISCOVERY_NQN}","listen_address":{l}}}}}
 ]}}]}}"#
        );
        TargetConfig::from_json_str(&json).expect("rdma fuzz target config")
    })
}

fn port() -> Arc<PortInfo> {
    Arc::new(PortInfo {
        trtype: TransportType::Rdma,
        adrfam: AddressFamily::Ipv4,
        traddr: "192.0.2.1".into(),
        trsvcid: "4420".into(),
        peer: "192.0.2.2:50000".parse().expect("peer address"),
        tls: None,
        caps: nvmf_rdma::CAPS,
    })
}

/// What a case reached (replay test, seed checks).
#[derive(Debug, Default, Clone, Copy)]
pub struct RdmaReport {
    /// Connect requests accepted / rejected.
    pub accepted: u32,
    pub rejected: u32,
    pub admin_connects: u32,
    pub io_connects: u32,
    /// Connects refused with Invalid Parameters (the CM check).
    pub refused_connects: u32,
    /// Responses to other commands.
    pub completions: u32,
    pub reads: u32,
    pub writes: u32,
    /// Capsules delivered through the shared pool.
    pub shared_capsules: u32,
    pub probes: u32,
    /// Queues that had asked to close when dropped.
    pub closed: u32,
    /// Most commands outstanding on one queue.
    pub max_in_flight: u32,
    pub verified_blocks: u64,
}

// ---------------------------------------------------------------------------
// Harness state
// ---------------------------------------------------------------------------

/// A host memory region the host registered.
struct Mr {
    addr: u64,
    data: Vec<u8>,
    /// Still usable (not invalidated).
    valid: bool,
}

/// A send-queue work request the device holds.
struct Posted {
    wr: WorkRequest,
    /// The slot buffer's allocation ID when posted (READ/WRITE).
    buf: u64,
    /// The response bytes when posted (SEND).
    cqe: [u8; 16],
}

/// What the host follows of one command.
enum Track {
    Other,
    Connect,
    Aer,
    Writes(Vec<PendingWrite>),
    /// A read into host region `key`.
    Read(PendingRead, u32),
}

struct Sent {
    /// The keyed SGL's key, and whether it asked for invalidation.
    key: Option<(u32, bool)>,
    track: Track,
}

/// One queue and the device's and host's view of it.
struct Queue {
    q: RdmaQueue,
    entries: u16,
    read_depth: u8,
    shared: bool,
    /// The device executes send-queue work only when told.
    hold: bool,
    /// The queue pair is in the error state: everything completes flushed.
    qp_error: bool,
    /// Posted receives, in the order the device fills them.
    recvs: VecDeque<(u64, Local)>,
    /// Send-queue work in flight, in posting order.
    sq: Vec<Posted>,
    /// Capsules the host sent that wait for a receive (with the receive
    /// length the device will report, and whether it fails).
    capsules: VecDeque<(Vec<u8>, Option<u32>, bool)>,
    /// Recently completed `wr_id`s.
    done: VecDeque<u64>,
    outstanding: HashMap<u16, u32>,
    track: HashMap<u16, VecDeque<Sent>>,
    /// Only commands the harness built: CID checks apply.
    tracked: bool,
    /// The device reported a completion for something not in flight.
    lied: bool,
    next_cid: u16,
    /// The queue had asked to close at the end of the last look.
    was_closed: bool,
    /// The queue saw an error completion: it must post nothing more.
    failed: bool,
    /// Response buffers with a SEND in flight.
    busy: HashSet<u16>,
    /// Buffer sizes at creation.
    resp_len: usize,
    recv_len: usize,
    /// Connect data: HSQSIZE of the connect request, when one was made.
    hsqsize: Option<u16>,
    qid: u16,
}

struct Harness {
    target: Arc<Target>,
    port: Arc<PortInfo>,
    queues: [Option<Queue>; MAX_QUEUES],
    pool: Option<RecvPool>,
    /// Pool buffers posted on the SRQ, in the order the device fills them.
    pool_posted: VecDeque<RecvPost>,
    mrs: HashMap<u32, Mr>,
    next_key: u32,
    base: Instant,
    clock: Duration,
    admin_cntlid: Option<u16>,
    shadow: Shadow,
    report: RdmaReport,
}

fn trace() -> bool {
    static T: OnceLock<bool> = OnceLock::new();
    *T.get_or_init(|| std::env::var_os("NVMF_FUZZ_TRACE").is_some_and(|v| v != "0"))
}

fn slot(q: u8) -> usize {
    usize::from(q) % MAX_QUEUES
}

/// Payload bytes distinct per position and command.
fn fill(len: usize, seed: u16) -> Vec<u8> {
    (0..len)
        .map(|i| ((i as u32 ^ (u32::from(seed) << 20)).wrapping_mul(0x9E37_79B1) >> 24) as u8)
        .collect()
}

/// Decodes `bytes` into an [`RdmaInput`] and plays it. Panics when an
/// invariant breaks; `None` when the bytes do not decode.
pub fn run_rdma_bytes(bytes: &[u8]) -> Option<RdmaReport> {
    let input = RdmaInput::arbitrary_take_rest(Unstructured::new(bytes)).ok()?;
    Some(run_rdma_input(&input))
}

/// Plays `input` against a fresh target; panics when an invariant breaks.
pub fn run_rdma_input(input: &RdmaInput) -> RdmaReport {
    let target = Target::from_config(rdma_target_config()).expect("rdma fuzz target");
    let mut h = Harness {
        target: target.clone(),
        port: port(),
        queues: Default::default(),
        pool: input
            .srq
            .map(|n| RecvPool::new(u32::from(n % 16) + 1, CAPSULE)),
        pool_posted: VecDeque::new(),
        mrs: HashMap::new(),
        next_key: 0x100,
        base: Instant::now(),
        clock: Duration::ZERO,
        admin_cntlid: None,
        shadow: Shadow::default(),
        report: RdmaReport::default(),
    };
    h.repost();
    for op in &input.ops {
        if trace() {
            eprintln!("{op:?}");
        }
        h.op(op);
        h.repost();
        for s in 0..MAX_QUEUES {
            h.check(s);
        }
    }
    for s in 0..MAX_QUEUES {
        h.disconnect(s);
    }
    let report = h.report;
    drop(h);
    assert_eq!(
        target.active_controllers(),
        0,
        "controllers left after every queue was dropped"
    );
    report
}

impl Harness {
    fn now(&self) -> Instant {
        self.base + self.clock
    }

    fn now_ns(&self) -> u64 {
        self.clock.as_nanos() as u64
    }

    fn qu(&mut self, s: usize) -> &mut Queue {
        self.queues[s].as_mut().expect("queue")
    }

    /// The pool's idle buffers go back on the SRQ (the port's batched
    /// repost), and the pool's books are checked.
    fn repost(&mut self) {
        let Some(pool) = self.pool.as_mut() else {
            return;
        };
        let mut v = Vec::new();
        pool.take_posts(&mut v);
        for p in &v {
            assert!(
                !self.pool_posted.iter().any(|x| x.wr_id == p.wr_id),
                "shared buffer {:#x} posted twice",
                p.wr_id
            );
            assert!(
                p.offset + p.len as usize <= pool.memory().len(),
                "shared buffer past the pool"
            );
        }
        self.pool_posted.extend(v);
        assert_eq!(pool.held(), 0, "a shared buffer held after the call");
        assert_eq!(
            pool.posted() + pool.idle(),
            pool.count(),
            "a shared buffer is lost"
        );
        assert_eq!(pool.posted(), self.pool_posted.len(), "pool books");
    }

    fn op(&mut self, op: &ROp) {
        match op {
            ROp::Accept { q, cm, ird } => {
                let s = slot(*q);
                self.disconnect(s);
                self.accept(s, cm, *ird);
            }
            ROp::Connect { q, spec } => {
                if let Some(s) = self.live(*q) {
                    self.connect(s, spec);
                }
            }
            ROp::Cmd { q, cmd } | ROp::Cmd2 { q, cmd } | ROp::Cmd3 { q, cmd } => {
                if let Some(s) = self.live(*q) {
                    self.command(s, cmd);
                }
            }
            ROp::Capsule { q, sqe, icd, len } => {
                if let Some(s) = self.live(*q) {
                    let cmd = Command::read_from_bytes(sqe).expect("64 bytes");
                    self.shadow.valid = false;
                    let mut capsule = sqe.to_vec();
                    capsule.extend(fill(usize::from(*icd) % (2 * CAPSULE), cmd.cid()));
                    let (len, fails) = match len {
                        CapLen::Exact | CapLen::Exact2 => (None, false),
                        CapLen::Runt(n) => {
                            capsule.truncate(usize::from(*n) % 64);
                            (None, false)
                        }
                        CapLen::Over(n) => {
                            capsule.resize(CAPSULE + 1 + usize::from(*n) % 256, 0);
                            (None, true)
                        }
                        CapLen::Claim(n) => (Some(u32::from(*n)), false),
                    };
                    let full = capsule.len() >= 64;
                    let c = self.queues[s].as_mut().expect("queue");
                    if full && !fails {
                        c.expect(cmd.cid(), sgl_key(&cmd), Track::Other, &mut self.shadow);
                    }
                    c.capsules.push_back((capsule, len, fails));
                    self.run(s);
                }
            }
            ROp::Hold { q, on } => {
                let s = slot(*q);
                if self.queues[s].is_some() {
                    self.qu(s).hold = *on;
                    self.run(s);
                }
            }
            ROp::Complete { q, pick, ok } | ROp::Complete2 { q, pick, ok } => {
                let s = slot(*q);
                if let Some(c) = self.queues[s].as_ref() {
                    if !c.sq.is_empty() {
                        let i = usize::from(*pick) % c.sq.len();
                        self.execute(s, i, *ok);
                        self.run(s);
                    }
                }
            }
            ROp::Run { q } => {
                let s = slot(*q);
                if self.queues[s].is_some() {
                    let hold = self.qu(s).hold;
                    self.qu(s).hold = false;
                    self.run(s);
                    self.qu(s).hold = hold;
                }
            }
            ROp::Flush { q } => {
                let s = slot(*q);
                if self.queues[s].is_some() {
                    self.qu(s).qp_error = true;
                    self.run(s);
                }
            }
            ROp::Bogus { q, id, ok } => {
                let s = slot(*q);
                if self.queues[s].is_some() {
                    self.bogus(s, *id, *ok);
                }
            }
            ROp::Tick { t } => {
                self.clock += match t {
                    RTick::Ms(n) => Duration::from_millis(u64::from(*n)),
                    RTick::Sec(n) => Duration::from_secs(u64::from(*n % 16)),
                    RTick::Idle => Duration::from_secs(11),
                    RTick::PastKato => Duration::from_secs(31),
                };
                let now = self.now();
                for s in 0..MAX_QUEUES {
                    if let Some(c) = self.queues[s].as_mut() {
                        c.q.poll(now);
                        self.run(s);
                    }
                }
            }
            ROp::Disconnect { q } => self.disconnect(slot(*q)),
        }
    }

    /// The queue in slot `q`, accepted and connected with good values when
    /// there is none (or the old one asked to close: the port drops those).
    /// `None` when even that fails (slot 0's controller is gone).
    fn live(&mut self, q: u8) -> Option<usize> {
        let s = slot(q);
        if self.queues[s]
            .as_ref()
            .is_some_and(|c| c.q.close_reason().is_some())
        {
            self.disconnect(s);
        }
        if s != 0 && self.admin_cntlid.is_none() && self.queues[0].is_none() {
            self.live(0);
        }
        if self.queues[s].is_none() {
            let req = CmReq {
                qid: Pick16::Auto,
                hsqsize: Hsq::Auto,
                hrqsize: Hsq::Auto,
                cntlid: Pick16::Auto,
                recfmt: 0,
            };
            self.accept(s, &CmSpec::Good(req), Ird::Auto);
            self.queues[s].as_ref()?;
            let spec = FConnect {
                qid: Pick16::Auto,
                sqsize: FSq::Match,
                cntlid: Pick16::Auto,
                subnqn: SubNqn::Nvm,
                data: FData::InCapsule,
                kato: 0,
            };
            self.connect(s, &spec);
            if self.queues[s].as_ref().is_some_and(|c| c.qid == 0) {
                let c = self.qu(s);
                let cid = c.cid(Cid::Next);
                let cmd =
                    Command::property_set(cid, CC, false, u64::from(CC_EN | (6 << 16) | (4 << 20)));
                self.send(s, &cmd, &[], None, Track::Other);
            }
        }
        Some(s)
    }

    /// The port's handling of an RDMA_CM connect request.
    fn accept(&mut self, s: usize, cm: &CmSpec, ird: Ird) {
        let io = s != 0 && self.admin_cntlid.is_some();
        let bytes = match cm {
            CmSpec::Good(r) | CmSpec::Good2(r) | CmSpec::Good3(r) => {
                let pick = |p: Pick16, v: u16| match p {
                    Pick16::Raw(r) => r,
                    _ => v,
                };
                let hsq = match r.hsqsize {
                    Hsq::Auto | Hsq::Auto2 => 31,
                    Hsq::Small(n) => u16::from(n),
                    Hsq::Raw(n) => n,
                };
                let hrq = match r.hrqsize {
                    Hsq::Auto | Hsq::Auto2 => hsq.wrapping_add(1),
                    Hsq::Small(n) => hsq.wrapping_add(1).wrapping_add(u16::from(n)),
                    Hsq::Raw(n) => n,
                };
                let mut m = RdmaCmRequest::new_zeroed();
                m.recfmt.set(u16::from(r.recfmt / 250));
                m.qid.set(pick(r.qid, if io { s as u16 } else { 0 }));
                m.hrqsize.set(hrq);
                m.hsqsize.set(hsq);
                let cntlid = if io {
                    self.admin_cntlid.unwrap_or(0)
                } else {
                    0
                };
                m.cntlid.set(pick(r.cntlid, cntlid));
                m.as_bytes().to_vec()
            }
            CmSpec::Raw(b) => b.clone(),
        };
        let l = *self.target.limits_for(TransportType::Rdma);
        let ql = RdmaQueueLimits {
            max_admin_entries: u32::from(l.max_aq_depth),
            max_io_entries: u32::from(l.max_queue_depth),
            max_io_queues: l.max_io_qpairs_per_ctrlr,
        };
        let Ok(req) = parse_connect_request(&bytes, &ql) else {
            self.report.rejected += 1;
            return;
        };
        let host_ird = match ird {
            Ird::Auto | Ird::Auto2 => 16,
            Ird::Raw(n) => n,
        };
        let Ok(read_depth) = negotiate_read_depth(host_ird, DEVICE_READ_DEPTH, DEVICE_READ_DEPTH)
        else {
            self.report.rejected += 1;
            return;
        };
        assert!(read_depth >= 1 && read_depth <= host_ird.min(DEVICE_READ_DEPTH));
        let entries = req.entries().min(u32::from(u16::MAX)) as u16;
        let shared = self.pool.is_some();
        let params = RdmaQueueParams {
            requests: nvmf_rdma::request_params(&self.target, Duration::from_secs(30), 4 << 20),
            entries,
            read_depth,
            shared_receives: shared,
            connect: Some(req),
        };
        let mut q = RdmaQueue::new(self.target.clone(), self.port.clone(), &params);
        q.start();
        let resp_len = q.response_buffers().len();
        let recv_len = q.recv_buffers().len();
        assert!(
            resp_len >= (2 * usize::from(entries) + 1) * 16,
            "fewer response buffers than entries"
        );
        if shared {
            assert_eq!(
                recv_len, 0,
                "a queue on a shared receive queue owns receive buffers"
            );
        } else {
            assert_eq!(recv_len, usize::from(entries) * CAPSULE, "receive buffers");
        }
        if trace() {
            eprintln!("  accepted {req:?} entries {entries} read depth {read_depth}");
        }
        self.report.accepted += 1;
        self.queues[s] = Some(Queue {
            q,
            entries,
            read_depth,
            shared,
            hold: false,
            qp_error: false,
            recvs: VecDeque::new(),
            sq: Vec::new(),
            capsules: VecDeque::new(),
            done: VecDeque::new(),
            outstanding: HashMap::new(),
            track: HashMap::new(),
            tracked: true,
            lied: false,
            next_cid: 1,
            was_closed: false,
            failed: false,
            busy: HashSet::new(),
            resp_len,
            recv_len,
            hsqsize: Some(req.hsqsize),
            qid: req.qid,
        });
        self.run(s);
        if !shared {
            assert_eq!(
                self.qu(s).recvs.len(),
                usize::from(entries),
                "every receive buffer posted at start"
            );
        }
    }

    /// A new host memory region of `len` bytes (capped), filled with `data`.
    fn register(&mut self, data: Vec<u8>) -> (u32, u64) {
        let key = self.next_key;
        self.next_key += 1;
        let addr = u64::from(key) << 24;
        self.mrs.insert(
            key,
            Mr {
                addr,
                data,
                valid: true,
            },
        );
        (key, addr)
    }

    fn connect(&mut self, s: usize, spec: &FConnect) {
        let admin_cntlid = self.admin_cntlid;
        let c = self.qu(s);
        let cid = c.cid(Cid::Next);
        let pick = |p: Pick16, v: u16| match p {
            Pick16::Raw(r) => r,
            _ => v,
        };
        let qid = pick(spec.qid, c.qid);
        let io = qid != 0;
        let sqsize = match spec.sqsize {
            FSq::Match | FSq::Match2 | FSq::Match3 => c.hsqsize.unwrap_or(31),
            FSq::Small(n) => u16::from(n),
            FSq::Raw(n) => n,
        };
        let cntlid = pick(
            spec.cntlid,
            if io {
                admin_cntlid.unwrap_or(CNTLID_DYNAMIC)
            } else {
                CNTLID_DYNAMIC
            },
        );
        let kato = if io {
            0
        } else {
            KATO_MS.max(u32::from(spec.kato))
        };
        let mut cmd = Command::connect(cid, qid, sqsize, 0, kato);
        let subnqn = match spec.subnqn {
            SubNqn::Nvm | SubNqn::Nvm2 | SubNqn::Nvm3 => NVM_NQN,
            SubNqn::Discovery => DISCOVERY_NQN,
            SubNqn::Unknown => "nqn.2024-01.io.nvmfd:nosuch",
            SubNqn::Unterminated | SubNqn::Empty => "",
        };
        let block = ConnectBlock::new([7; 16], cntlid, subnqn, HOSTNQN);
        let mut data = block.as_bytes().to_vec();
        if matches!(spec.subnqn, SubNqn::Unterminated) {
            data[256..512].fill(b'n');
        }
        let mut key = None;
        let icd = match spec.data {
            FData::InCapsule | FData::InCapsule2 => {
                cmd.set_sgl(SglDescriptor::in_capsule(0, 1024));
                data
            }
            FData::Keyed | FData::Keyed2 => {
                let (k, a) = self.register(data);
                key = Some((k, false));
                cmd.set_sgl(SglDescriptor::keyed(a, 1024, k, false));
                Vec::new()
            }
            FData::BadKey => {
                cmd.set_sgl(SglDescriptor::keyed(0x1000, 1024, 0xdead_0000, false));
                Vec::new()
            }
            FData::Short(n) => {
                cmd.set_sgl(SglDescriptor::in_capsule(0, 1024));
                data.truncate(usize::from(n) % 1024);
                data
            }
            FData::None => {
                cmd.set_sgl(SglDescriptor::keyed(0, 0, 0, false));
                Vec::new()
            }
        };
        self.send(s, &cmd, &icd, key, Track::Connect);
    }

    /// Builds and sends one command (see [`KINDS`]).
    fn command(&mut self, s: usize, spec: &RCmd) {
        let c = self.qu(s);
        let cid = c.cid(spec.cid);
        let on_io = c.qid != 0;
        let kind = KINDS[usize::from(spec.op) % KINDS.len()];
        let nsid = match spec.nsid {
            Nsid::Malloc | Nsid::Malloc2 => 1,
            Nsid::Null => 2,
            Nsid::Zero => 0,
            Nsid::All => u32::MAX,
            Nsid::Raw(n) => n,
        };
        let bs = if nsid == 2 { 4096 } else { 512 };
        let slba = match spec.slba {
            Lba::Low(n) | Lba::Low2(n) => u64::from(n & 0x1fff),
            Lba::Raw(n) => n,
        };
        let count = u32::from(spec.nlb) + 1;
        let (sel, cdw) = (spec.sel, spec.cdw);
        let (mut cmd, natural, h2c) = match kind {
            Kind::Read | Kind::Write => {
                let op = if kind == Kind::Read { 0x02 } else { 0x01 };
                let mut cmd = Command::new(op, cid);
                cmd.set_nsid(nsid).set_lba_range(slba, count);
                if kind == Kind::Write && sel & 0x0c == 0x0c {
                    // Second half of a fused Compare and Write (or lone).
                    cmd.set_flags(2);
                }
                (cmd, count * bs, kind == Kind::Write)
            }
            Kind::Compare => {
                // Usually the first half of a fused Compare and Write.
                let mut cmd = Command::new(0x05, cid);
                cmd.set_nsid(nsid).set_lba_range(slba, count);
                cmd.set_flags(if sel & 0x80 != 0 { sel & 3 } else { 1 });
                (cmd, count * bs, true)
            }
            Kind::Flush => {
                let mut cmd = Command::new(0x00, cid);
                cmd.set_nsid(nsid);
                (cmd, 0, false)
            }
            Kind::WriteZeroes => {
                let mut cmd = Command::new(0x08, cid);
                cmd.set_nsid(nsid).set_lba_range(slba, count);
                (cmd, 0, false)
            }
            Kind::Identify => {
                let mut cmd = Command::new(0x06, cid);
                cmd.set_cdw10(u32::from(sel % 4)).set_nsid(nsid);
                (cmd, 4096, false)
            }
            Kind::GetLogPage => {
                let lids = [1u8, 2, 3, 5, 0x70, sel];
                let len = 512 * (1 + u32::from(spec.nlb % 8));
                let mut cmd = Command::new(0x02, cid);
                cmd.set_get_log_page(lids[usize::from(sel) % lids.len()], len, 0)
                    .set_nsid(nsid);
                (cmd, len, false)
            }
            Kind::KeepAlive => (Command::new(0x18, cid), 0, false),
            Kind::Aer => (Command::new(0x0c, cid), 0, false),
            Kind::PropGet => {
                let offs = [0u32, VS, CC, CSTS, cdw[0]];
                let off = offs[usize::from(sel) % offs.len()];
                (Command::property_get(cid, off, sel & 0x80 != 0), 0, false)
            }
            Kind::PropSet => {
                let values = [
                    u64::from(CC_EN | (6 << 16) | (4 << 20)),
                    0,
                    1 << 14,
                    u64::from(cdw[1]),
                ];
                let v = values[usize::from(sel) % values.len()];
                (Command::property_set(cid, CC, false, v), 0, false)
            }
            Kind::Disconnect => (Command::disconnect(cid), 0, false),
            Kind::Raw => {
                let mut cmd = Command::new(cdw[1] as u8, cid);
                cmd.set_nsid(nsid).set_cdw10(cdw[0]).set_cdw12(cdw[1]);
                (cmd, count * 64, cdw[1] & 1 == 1)
            }
        };
        let adjust = |l: Len| match l {
            Len::Auto => natural,
            Len::Plus(d) => natural.wrapping_add(u32::from(d)),
            Len::Minus(d) => natural.saturating_sub(u32::from(d)),
            Len::Raw(v) => v,
        };
        let written = fill(natural as usize, cid);
        let mut key = None;
        let mut icd = Vec::new();
        let mut incapsule = false;
        let mut exact = false;
        match spec.sgl {
            RSgl::Auto | RSgl::Auto2 | RSgl::Auto3 => {
                if natural == 0 {
                    cmd.set_sgl(SglDescriptor::keyed(0, 0, 0, false));
                    exact = true;
                } else if h2c && natural <= ICD {
                    cmd.set_sgl(SglDescriptor::in_capsule(0, natural));
                    icd = written.clone();
                    incapsule = true;
                    exact = true;
                } else {
                    let data = if h2c {
                        written.clone()
                    } else {
                        vec![0xEE; natural as usize]
                    };
                    let (k, a) = self.register(data);
                    let inv = sel & 1 == 1;
                    key = Some((k, inv));
                    cmd.set_sgl(SglDescriptor::keyed(a, natural, k, inv));
                    exact = true;
                }
            }
            RSgl::InCapsule(l) => {
                let n = adjust(l);
                cmd.set_sgl(SglDescriptor::in_capsule(0, n));
                incapsule = true;
                exact = n == natural;
            }
            RSgl::Keyed { len, invalidate } => {
                let n = adjust(len) & 0x00ff_ffff;
                let mut data = fill((n as usize).min(MR_MAX), cid);
                if !h2c {
                    data.fill(0xEE);
                }
                let (k, a) = self.register(data);
                key = Some((k, invalidate));
                cmd.set_sgl(SglDescriptor::keyed(a, n, k, invalidate));
                exact = n == natural;
            }
            RSgl::BadKey(l) => {
                let k = 0xbad0_0000 | u32::from(cid);
                key = Some((k, false));
                cmd.set_sgl(SglDescriptor::keyed(
                    0x2000,
                    adjust(l) & 0x00ff_ffff,
                    k,
                    false,
                ));
            }
            RSgl::OffEnd(n) => {
                let data = fill(natural as usize, cid);
                let (k, a) = self.register(data);
                key = Some((k, false));
                let back = u64::from(n % 4096);
                let addr = (a + u64::from(natural)).saturating_sub(back);
                cmd.set_sgl(SglDescriptor::keyed(addr, natural, k, false));
            }
            RSgl::Raw(b) => {
                cmd.set_sgl(SglDescriptor::read_from_bytes(&b[..]).expect("16 bytes"));
                key = sgl_key(&cmd);
            }
        }
        match spec.data {
            Data::Auto | Data::Auto2 | Data::Auto3 => {
                if incapsule && icd.is_empty() {
                    icd = fill((cmd.sgl().length() as usize).min(2 * CAPSULE), cid);
                }
            }
            Data::None => icd.clear(),
            Data::Len(n) => icd = fill(usize::from(n) % (2 * CAPSULE), cid),
        }
        if !incapsule && !icd.is_empty() {
            exact = false;
        }
        // What the data model follows.
        let now = self.shadow.now();
        let track = match kind {
            Kind::Raw if cmd.opcode() != 0x02 => {
                self.shadow.valid = false;
                Track::Other
            }
            Kind::Aer => Track::Aer,
            Kind::Write | Kind::WriteZeroes if on_io && nsid == 1 => {
                let known = if kind == Kind::WriteZeroes || cmd.fuse() != 0 {
                    // A fused Write lands only if its Compare matched.
                    None
                } else if exact && (!incapsule || icd.len() == natural as usize) {
                    Some(written)
                } else {
                    None
                };
                Track::Writes(vec![PendingWrite {
                    slba,
                    count,
                    data: known,
                    zeroes: kind == Kind::WriteZeroes,
                    sent: now,
                }])
            }
            Kind::Read if on_io && (nsid == 1 || nsid == 2) && exact && !incapsule => match key {
                Some((k, _)) => Track::Read(
                    PendingRead {
                        null: nsid == 2,
                        slba,
                        count,
                        block_size: bs as usize,
                        buf: Vec::new(),
                        sent: now,
                    },
                    k,
                ),
                None => Track::Other,
            },
            _ => Track::Other,
        };
        self.send(s, &cmd, &icd, key, track);
    }

    /// The host sends a capsule (CID outstanding); the device delivers it
    /// when a receive is posted.
    fn send(&mut self, s: usize, cmd: &Command, icd: &[u8], key: Option<(u32, bool)>, t: Track) {
        let c = self.queues[s].as_mut().expect("queue");
        c.expect(cmd.cid(), key, t, &mut self.shadow);
        let mut capsule = cmd.as_bytes().to_vec();
        capsule.extend_from_slice(icd);
        let fails = capsule.len() > CAPSULE;
        if fails {
            // The device cannot place it: the receive fails, no response.
            c.unexpect_last(cmd.cid());
        }
        c.capsules.push_back((capsule, None, fails));
        self.run(s);
    }

    /// The device: delivers capsules while receives are posted and, unless
    /// held, executes the send queue in order, until nothing moves.
    fn run(&mut self, s: usize) {
        for _ in 0..100_000 {
            if self.queues[s].is_none() {
                return;
            }
            self.absorb(s);
            let c = self.qu(s);
            if c.qp_error {
                // Everything in flight completes flushed.
                if !c.sq.is_empty() {
                    self.execute(s, 0, false);
                    continue;
                }
                if let Some((wr_id, _)) = c.recvs.pop_front() {
                    c.done_push(wr_id);
                    c.failed = true;
                    let wc = WorkCompletion {
                        wr_id,
                        ok: false,
                        byte_len: 0,
                    };
                    let now = self.now_ns();
                    self.qu(s).q.on_completion(&wc, now);
                    continue;
                }
                c.capsules.clear();
                return;
            }
            if !c.capsules.is_empty() && self.deliver(s) {
                continue;
            }
            let c = self.qu(s);
            if !c.hold && !c.sq.is_empty() {
                self.execute(s, 0, true);
                continue;
            }
            return;
        }
        panic!("the queue kept posting work");
    }

    /// One capsule into the next posted receive (own or shared). False when
    /// no receive is posted.
    fn deliver(&mut self, s: usize) -> bool {
        let now = self.now_ns();
        let shared = self.qu(s).shared;
        if shared {
            let Some(post) = self.pool_posted.pop_front() else {
                return false;
            };
            let (capsule, claim, fails) = self.qu(s).capsules.pop_front().expect("capsule");
            let pool = self.pool.as_mut().expect("pool");
            let n = capsule.len().min(post.len as usize);
            pool.memory()[post.offset..post.offset + n].copy_from_slice(&capsule[..n]);
            let wc = WorkCompletion {
                wr_id: post.wr_id,
                ok: !fails,
                byte_len: claim.unwrap_or(capsule.len() as u32),
            };
            self.report.shared_capsules += 1;
            let c = self.queues[s].as_mut().expect("queue");
            c.q.on_shared_recv(pool, &wc, now);
            assert_eq!(pool.held(), 0, "on_shared_recv kept a shared buffer");
            if fails {
                c.qp_error = true;
                c.failed = true;
            }
            return true;
        }
        let c = self.qu(s);
        let Some((wr_id, local)) = c.recvs.pop_front() else {
            return false;
        };
        let (capsule, claim, fails) = c.capsules.pop_front().expect("capsule");
        let buf = c.q.region_mut(local.region);
        let n = capsule.len().min(local.len as usize).min(buf.len());
        buf[..n].copy_from_slice(&capsule[..n]);
        c.done_push(wr_id);
        let wc = WorkCompletion {
            wr_id,
            ok: !fails,
            byte_len: claim.unwrap_or(capsule.len() as u32),
        };
        if fails {
            c.qp_error = true;
            c.failed = true;
        }
        c.q.on_completion(&wc, now);
        true
    }

    /// The device executes send-queue work request `i` (`ok`: unless the
    /// memory it names is not there, it succeeds; else it fails).
    fn execute(&mut self, s: usize, i: usize, ok: bool) {
        let now = self.now_ns();
        // RC ordering: WRITEs posted before a SEND are done before it.
        if matches!(self.qu(s).sq[i].wr, WorkRequest::Send { .. }) {
            let mut j = 0;
            let mut k = i;
            while j < k {
                if matches!(self.qu(s).sq[j].wr, WorkRequest::Write { .. }) {
                    self.execute(s, j, ok);
                    if self.queues[s].is_none() {
                        return;
                    }
                    k -= 1;
                } else {
                    j += 1;
                }
            }
            let ok = ok && !self.qu(s).qp_error;
            return self.execute_one(s, k, ok, now);
        }
        let ok = ok && !self.qu(s).qp_error;
        self.execute_one(s, i, ok, now)
    }

    fn execute_one(&mut self, s: usize, i: usize, ok: bool, now: u64) {
        let c = self.queues[s].as_mut().expect("queue");
        let p = c.sq.remove(i);
        let mut ok = ok;
        let wr_id;
        let mut signaled = true;
        match p.wr {
            WorkRequest::Read {
                wr_id: id,
                local,
                remote_addr,
                rkey,
            } => {
                wr_id = id;
                if ok {
                    c.check_same_buffer(&p, local);
                    match host_range(&self.mrs, rkey, remote_addr, local.len) {
                        Some(src) => {
                            let src = src.to_vec();
                            let off = local.offset as usize;
                            c.q.region_mut(local.region)[off..off + src.len()]
                                .copy_from_slice(&src);
                            self.report.reads += 1;
                        }
                        None => ok = false,
                    }
                }
            }
            WorkRequest::Write {
                wr_id: id,
                local,
                remote_addr,
                rkey,
            } => {
                wr_id = id;
                signaled = false;
                if ok {
                    c.check_same_buffer(&p, local);
                    let src = if local.region == Region::Zeroes {
                        vec![0; local.len as usize]
                    } else {
                        let off = local.offset as usize;
                        c.q.region_mut(local.region)[off..off + local.len as usize].to_vec()
                    };
                    match host_range_mut(&mut self.mrs, rkey, remote_addr, local.len) {
                        Some(dst) => {
                            dst.copy_from_slice(&src);
                            self.report.writes += 1;
                        }
                        None => ok = false,
                    }
                }
            }
            WorkRequest::Send {
                wr_id: id,
                local,
                invalidate,
            } => {
                wr_id = id;
                let at = match local.region {
                    Region::Response(at) => at,
                    other => panic!("SEND from {other:?}"),
                };
                c.busy.remove(&at);
                if ok {
                    let now_bytes = c.q.region_mut(local.region)[..16].to_vec();
                    assert!(
                        c.lied || now_bytes == p.cqe,
                        "response buffer {at} overwritten while its SEND was in flight"
                    );
                    let cqe = Completion::read_from_bytes(&p.cqe).expect("16 bytes");
                    if let Some(k) = invalidate {
                        if let Some(mr) = self.mrs.get_mut(&k) {
                            mr.valid = false;
                        }
                    }
                    self.response(s, cqe, invalidate);
                }
            }
            WorkRequest::Probe { wr_id: id } => wr_id = id,
            WorkRequest::Recv { .. } => unreachable!("receives are not on the send queue"),
        }
        let Some(c) = self.queues[s].as_mut() else {
            return;
        };
        c.done_push(wr_id);
        if !ok {
            // Any failure puts the queue pair in the error state.
            c.qp_error = true;
            c.failed = true;
        }
        if signaled || !ok {
            let wc = WorkCompletion {
                wr_id,
                ok,
                byte_len: 0,
            };
            c.q.on_completion(&wc, now);
        }
    }

    /// The host got a response.
    fn response(&mut self, s: usize, cqe: Completion, invalidate: Option<u32>) {
        let c = self.queues[s].as_mut().expect("queue");
        let cid = cqe.cid();
        let status = cqe.status();
        if trace() {
            eprintln!("  <- cid {cid} {status:?} dw0 {:#x}", cqe.dw0());
        }
        if c.tracked && !c.lied {
            assert!(
                c.outstanding.contains_key(&cid),
                "response for CID {cid} that is not outstanding"
            );
        }
        let sent = c.unexpect(cid, invalidate);
        let ok = status.is_success();
        if let Some(k) = invalidate {
            if c.tracked {
                assert!(
                    sent.as_ref().and_then(|x| x.key) == Some((k, true)),
                    "SEND with Invalidate of key {k:#x}, which the command did not ask for"
                );
            }
        }
        let Some(sent) = sent else { return };
        match sent.track {
            Track::Connect => {
                if ok {
                    if c.qid == 0 {
                        self.report.admin_connects += 1;
                        self.admin_cntlid = Some(cqe.dw0() as u16);
                    } else {
                        self.report.io_connects += 1;
                    }
                } else if status == nvmf_wire::status::Status::CONNECT_INVALID_PARAMETERS.with_dnr()
                {
                    self.report.refused_connects += 1;
                }
            }
            Track::Writes(ws) => {
                self.report.completions += 1;
                if ok {
                    for w in &ws {
                        self.shadow.apply(w);
                    }
                } else {
                    for w in &ws {
                        self.shadow.forget(w.slba, w.count);
                    }
                }
            }
            Track::Read(mut r, key) => {
                self.report.completions += 1;
                if ok {
                    let len = r.count as usize * r.block_size;
                    if let Some(mr) = self.mrs.get(&key) {
                        r.buf = mr.data[..len.min(mr.data.len())].to_vec();
                        let busy: Vec<(u64, u32)> = self
                            .queues
                            .iter()
                            .flatten()
                            .flat_map(|q| q.writes())
                            .collect();
                        let overlaps =
                            |lba: u64, (slba, n): (u64, u32)| lba.wrapping_sub(slba) < u64::from(n);
                        self.report.verified_blocks += self
                            .shadow
                            .check_read(&r, |lba| busy.iter().any(|&w| overlaps(lba, w)))
                            as u64;
                    }
                }
            }
            Track::Other | Track::Aer => self.report.completions += 1,
        }
    }

    /// A completion for a `wr_id` that is not in flight.
    fn bogus(&mut self, s: usize, id: BogusId, ok: bool) {
        let now = self.now_ns();
        let c = self.queues[s].as_mut().expect("queue");
        let wr_id = match id {
            BogusId::Stale(i) => match c.done.len() {
                0 => return,
                n => c.done[usize::from(i) % n],
            },
            BogusId::Made { kind, idx } => (u64::from(kind % 9) << 32) | u64::from(idx),
            BogusId::Raw(v) => v,
        };
        if c.sq.iter().any(|p| wr_id_of(&p.wr) == wr_id) || c.recvs.iter().any(|r| r.0 == wr_id) {
            return;
        }
        c.lied = true;
        c.failed |= !ok;
        c.qp_error |= !ok;
        let wc = WorkCompletion {
            wr_id,
            ok,
            byte_len: 64,
        };
        if RecvPool::owns(wr_id) {
            if let Some(pool) = self.pool.as_mut() {
                if pool_posted_has(&self.pool_posted, wr_id) {
                    return;
                }
                let c = self.queues[s].as_mut().expect("queue");
                c.q.on_shared_recv(pool, &wc, now);
                return;
            }
        }
        let c = self.queues[s].as_mut().expect("queue");
        c.q.on_completion(&wc, now);
        self.run(s);
    }

    /// Takes the queue's new work requests, checks them, and hands them to
    /// the device.
    fn absorb(&mut self, s: usize) {
        let c = self.queues[s].as_mut().expect("queue");
        let mut work = Vec::new();
        c.q.take_work(&mut work);
        for wr in work {
            if trace() {
                eprintln!("  [{s}] -> {wr:?}");
                if let WorkRequest::Send { local, .. } = wr {
                    let b = c.q.region_mut(local.region)[..16].to_vec();
                    let cqe = Completion::read_from_bytes(&b).expect("cqe");
                    eprintln!("       cid {} {:?}", cqe.cid(), cqe.status());
                }
            }
            let id = wr_id_of(&wr);
            assert!(
                !c.failed || c.lied,
                "{wr:?} posted after an error completion (the queue pair failed; {:?})",
                c.q.close_reason()
            );
            assert!(
                !(c.was_closed && matches!(wr, WorkRequest::Probe { .. })),
                "liveness probe posted after the queue asked to close ({:?})",
                c.q.close_reason()
            );
            match wr {
                WorkRequest::Recv { wr_id, local } => {
                    assert!(
                        !c.shared,
                        "a queue on a shared receive queue posted a receive"
                    );
                    assert!(
                        matches!(local.region, Region::Recv(i) if i < c.entries),
                        "receive into {:?}",
                        local.region
                    );
                    c.check_bounds(local);
                    assert!(
                        !c.recvs.iter().any(|r| r.0 == wr_id),
                        "receive {wr_id:#x} posted twice"
                    );
                    c.recvs.push_back((wr_id, local));
                    continue;
                }
                WorkRequest::Read { local, .. } => {
                    assert!(
                        matches!(local.region, Region::Slot(_)),
                        "RDMA READ into {:?}",
                        local.region
                    );
                    c.check_bounds(local);
                    let reads =
                        c.sq.iter()
                            .filter(|p| matches!(p.wr, WorkRequest::Read { .. }))
                            .count();
                    // (A made-up completion for a READ that was not in
                    // flight makes the queue believe one ended: no device
                    // does that, so the bound holds only without one.)
                    assert!(
                        reads < usize::from(c.read_depth) || c.lied,
                        "more than {} RDMA READs in flight",
                        c.read_depth
                    );
                }
                WorkRequest::Write { local, .. } => c.check_bounds(local),
                WorkRequest::Send { local, .. } => {
                    c.check_bounds(local);
                    let Region::Response(at) = local.region else {
                        panic!("SEND from {:?}", local.region);
                    };
                    assert!(local.len == 16, "SEND of {} bytes", local.len);
                    assert!(
                        c.busy.insert(at) || c.lied,
                        "response buffer {at} reused while its SEND is in flight"
                    );
                }
                WorkRequest::Probe { .. } => {
                    assert!(
                        !c.sq
                            .iter()
                            .any(|p| matches!(p.wr, WorkRequest::Probe { .. })),
                        "two probes in flight"
                    );
                    self.report.probes += 1;
                }
            }
            assert!(
                c.lied || !c.sq.iter().any(|p| wr_id_of(&p.wr) == id),
                "two work requests in flight with wr_id {id:#x}"
            );
            let mut p = Posted {
                wr,
                buf: 0,
                cqe: [0; 16],
            };
            match wr {
                WorkRequest::Read { local, .. } | WorkRequest::Write { local, .. } => {
                    if let Region::Slot(i) = local.region {
                        p.buf = c.q.slot_buffer_id(i);
                    }
                }
                WorkRequest::Send { local, .. } => {
                    p.cqe.copy_from_slice(&c.q.region_mut(local.region)[..16]);
                    if let Region::Response(at) = local.region {
                        if at >= 2 * c.entries && c.tracked && !c.lied {
                            let cid = Completion::read_from_bytes(&p.cqe).expect("cqe").cid();
                            assert!(
                                c.track
                                    .get(&cid)
                                    .and_then(|v| v.front())
                                    .is_some_and(|t| matches!(t.track, Track::Aer)),
                                "response buffer {at} (past the {} slots) carries the \
                                 completion of CID {cid}, not an AER",
                                2 * c.entries
                            );
                        }
                    }
                }
                _ => {}
            }
            c.sq.push(p);
        }
        c.was_closed = c.q.close_reason().is_some();
    }

    /// The queue-wide invariants after an action.
    fn check(&mut self, s: usize) {
        let Some(c) = self.queues[s].as_mut() else {
            return;
        };
        let in_flight = c.q.in_flight();
        self.report.max_in_flight = self.report.max_in_flight.max(in_flight as u32);
        // A slot stays busy until its response's SEND completed, while the
        // host may already have sent the next command: up to twice the
        // entries, never more.
        assert!(
            in_flight <= 2 * usize::from(c.entries) || c.q.close_reason().is_some(),
            "{in_flight} commands outstanding on a queue of {} entries that is not closing",
            c.entries
        );
        let sends =
            c.sq.iter()
                .filter(|p| matches!(p.wr, WorkRequest::Send { .. }))
                .count();
        assert!(
            c.lied || c.q.sends_in_flight() == sends,
            "sends_in_flight() {} but {sends} SENDs in flight",
            c.q.sends_in_flight()
        );
        assert_eq!(
            c.q.response_buffers().len(),
            c.resp_len,
            "response buffers resized"
        );
        assert_eq!(
            c.q.recv_buffers().len(),
            c.recv_len,
            "receive buffers resized"
        );
        for i in 0..c.entries.max(4) {
            let n = c.q.region_mut(Region::Slot(i)).len();
            assert!(
                n <= 2 * MAX_IO as usize,
                "slot {i} buffer of {n} bytes (I/O size {MAX_IO})"
            );
        }
    }

    /// Drops the queue in slot `s` (the port's teardown): the device
    /// forgets its work.
    fn disconnect(&mut self, s: usize) {
        let Some(c) = self.queues[s].take() else {
            return;
        };
        self.report.closed += u32::from(c.q.close_reason().is_some());
        for w in c.writes() {
            self.shadow.forget(w.0, w.1);
        }
        drop(c);
        self.repost();
    }
}

impl Queue {
    fn cid(&mut self, sel: Cid) -> u16 {
        match sel {
            Cid::Next | Cid::Next2 | Cid::Next3 => {
                for _ in 0..0x10000 {
                    let c = self.next_cid;
                    self.next_cid = self.next_cid.wrapping_add(1);
                    if !self.outstanding.contains_key(&c) {
                        return c;
                    }
                }
                0
            }
            Cid::Reuse(i) => {
                let mut v: Vec<u16> = self.outstanding.keys().copied().collect();
                v.sort_unstable();
                if v.is_empty() {
                    0
                } else {
                    v[usize::from(i) % v.len()]
                }
            }
            Cid::Raw(c) => c,
        }
    }

    /// Command `cid` is sent. A CID already outstanding (a conflict) leaves
    /// which response answers which command open: neither is followed by the
    /// data model (`shadow` turns off).
    fn expect(&mut self, cid: u16, key: Option<(u32, bool)>, track: Track, shadow: &mut Shadow) {
        let mut track = track;
        if self.outstanding.contains_key(&cid) {
            shadow.valid = false;
            for t in self.track.get_mut(&cid).into_iter().flatten() {
                if matches!(t.track, Track::Read(..)) {
                    t.track = Track::Other;
                }
            }
            if matches!(track, Track::Read(..)) {
                track = Track::Other;
            }
        }
        *self.outstanding.entry(cid).or_insert(0) += 1;
        self.track
            .entry(cid)
            .or_default()
            .push_back(Sent { key, track });
    }

    /// The command just sent with this CID never reached the target.
    fn unexpect_last(&mut self, cid: u16) {
        if let Some(n) = self.outstanding.get_mut(&cid) {
            *n -= 1;
            if *n == 0 {
                self.outstanding.remove(&cid);
            }
        }
        if let Some(q) = self.track.get_mut(&cid) {
            q.pop_back();
            if q.is_empty() {
                self.track.remove(&cid);
            }
        }
    }

    /// A command with this CID is done: the one whose keyed SGL asked to
    /// invalidate `invalidate`, else the oldest.
    fn unexpect(&mut self, cid: u16, invalidate: Option<u32>) -> Option<Sent> {
        if let Some(n) = self.outstanding.get_mut(&cid) {
            *n -= 1;
            if *n == 0 {
                self.outstanding.remove(&cid);
            }
        }
        let q = self.track.get_mut(&cid)?;
        let at = invalidate
            .and_then(|k| q.iter().position(|t| t.key == Some((k, true))))
            .unwrap_or(0);
        let t = q.remove(at);
        if q.is_empty() {
            self.track.remove(&cid);
        }
        t
    }

    fn done_push(&mut self, wr_id: u64) {
        if self.done.len() >= 64 {
            self.done.pop_front();
        }
        self.done.push_back(wr_id);
    }

    /// Writes in flight (start, count).
    fn writes(&self) -> Vec<(u64, u32)> {
        self.track
            .values()
            .flatten()
            .flat_map(|t| match &t.track {
                Track::Writes(ws) => ws.iter().map(|w| (w.slba, w.count)).collect(),
                _ => Vec::new(),
            })
            .collect()
    }

    /// `local` lies inside the buffer it names.
    fn check_bounds(&mut self, local: Local) {
        let end = u64::from(local.offset) + u64::from(local.len);
        let cap = match local.region {
            Region::Zeroes => {
                assert!(
                    nvmf_core::backend::zeroes(local.len as usize).is_some(),
                    "{} bytes from the zero buffer",
                    local.len
                );
                return;
            }
            r => self.q.region_mut(r).len() as u64,
        };
        assert!(
            end <= cap,
            "work request past its buffer: {local:?} in a buffer of {cap} bytes"
        );
    }

    /// A READ or WRITE's slot buffer is the one it was posted with.
    fn check_same_buffer(&mut self, p: &Posted, local: Local) {
        if let Region::Slot(i) = local.region {
            assert_eq!(
                self.q.slot_buffer_id(i),
                p.buf,
                "slot {i}'s buffer changed under a work request in flight ({:?})",
                p.wr
            );
        }
        self.check_bounds(local);
    }
}

/// The key of a command's keyed SGL, and whether it asks for invalidation.
fn sgl_key(cmd: &Command) -> Option<(u32, bool)> {
    let d = cmd.sgl();
    (d.sgl_type() == 4).then(|| (d.keyed_key(), d.subtype() == 0xf))
}

fn wr_id_of(wr: &WorkRequest) -> u64 {
    match *wr {
        WorkRequest::Recv { wr_id, .. }
        | WorkRequest::Read { wr_id, .. }
        | WorkRequest::Write { wr_id, .. }
        | WorkRequest::Send { wr_id, .. }
        | WorkRequest::Probe { wr_id } => wr_id,
    }
}

fn pool_posted_has(posted: &VecDeque<RecvPost>, wr_id: u64) -> bool {
    posted.iter().any(|p| p.wr_id == wr_id)
}

/// Host memory `[addr, addr + len)` of region `key`, if registered, valid
/// and covering it (else the device reports a remote access error).
fn host_range(mrs: &HashMap<u32, Mr>, key: u32, addr: u64, len: u32) -> Option<&[u8]> {
    let mr = mrs.get(&key).filter(|m| m.valid)?;
    let off = usize::try_from(addr.checked_sub(mr.addr)?).ok()?;
    mr.data.get(off..off.checked_add(len as usize)?)
}

fn host_range_mut(mrs: &mut HashMap<u32, Mr>, key: u32, addr: u64, len: u32) -> Option<&mut [u8]> {
    let mr = mrs.get_mut(&key).filter(|m| m.valid)?;
    let off = usize::try_from(addr.checked_sub(mr.addr)?).ok()?;
    mr.data.get_mut(off..off.checked_add(len as usize)?)
}

/// Command choices (weighted by repetition).
#[derive(Clone, Copy, PartialEq, Debug)]
enum Kind {
    Read,
    Write,
    Flush,
    WriteZeroes,
    Identify,
    GetLogPage,
    KeepAlive,
    Aer,
    PropGet,
    PropSet,
    Disconnect,
    Raw,
    /// Compare (05h), FUSE first unless the selector says otherwise.
    Compare,
}

/// The opcode table `RCmd::op` indexes (seeds.rs mirrors the indices).
const KINDS: &[Kind] = &[
    Kind::Read,
    Kind::Read,
    Kind::Read,
    Kind::Write,
    Kind::Write,
    Kind::Write,
    Kind::Flush,
    Kind::WriteZeroes,
    Kind::Identify,
    Kind::GetLogPage,
    Kind::KeepAlive,
    Kind::Aer,
    Kind::PropGet,
    Kind::PropSet,
    Kind::Disconnect,
    Kind::Raw,
    Kind::Compare,
];
