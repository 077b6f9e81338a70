//! Plays one [`Input`] against a fresh in-process target and checks the
//! invariants after every action:
//!
//! - nothing panics (the transport and the core);
//! - everything the target writes decodes as target-role PDUs (host-side
//!   decoder, with the digests the ICResp announced; data digests correct),
//!   the ICResp comes first and a C2HTermReq is the last PDU;
//! - every CapsuleResp, R2T and C2HData names a CID the host has outstanding
//!   (checked while the host has sent only harness-built PDUs);
//! - `output()` makes progress whenever `has_output()`, and `recv_buf()`
//!   always offers room;
//! - the buffered output and the receive buffer stay below bounds computed
//!   from the transport limits;
//! - a connection that asked to be closed stays closed and queues nothing
//!   more;
//! - once every connection is dropped, the target has no active controller;
//! - reads return what the writes the host saw complete put there
//!   (`shadow.rs`), a successful read returns exactly its length, and the
//!   null namespace reads zeroes;
//! - zero-copy sends (`nvmf_tcp::zerocopy`, on for some connections, see
//!   `ZcMode::pick`): a `MSG_ZEROCOPY` call's bytes are read from the slot
//!   buffers only when the model's kernel reports the call done (late, out
//!   of order, merged ranges, some copied) and must be what was sent then
//!   (no slot released early); the host parses only the stream up to the
//!   first unreported call; `zc_outstanding()` follows the reports; with
//!   everything reported and no output queued, no slot stays parked.
//!
//! The reactor is simulated faithfully: it reads only while `wants_read()`,
//! stops reading once `close_reason()` is set, calls `poll` after each read
//! and on timer ticks (a fake clock), and writes output with partial writes.

use crate::input::*;
use crate::shadow::{PendingRead, PendingWrite, Shadow, BS};
use nvmf_config::{AddressFamily, TargetConfig, TransportType};
use nvmf_core::{PortInfo, Target};
use nvmf_tcp::{Connection, SendKind, TcpParams};
use nvmf_wire::command::{Command, SglDescriptor};
use nvmf_wire::digest::crc32c;
use nvmf_wire::fabrics::{ConnectData as ConnectBlock, CC, CC_EN, CNTLID_DYNAMIC, CSTS, NSSR, VS};
use nvmf_wire::pdu::{
    append_data_digest, decode, encode_capsule_cmd, encode_h2c_data_header, encode_ic_req,
    encode_term_req, DecodeOpts, Decoded, EncodeOpts, Pdu, Role, DATA_LAST, DDGSTF, HDGSTF,
};
use std::collections::{HashMap, VecDeque};
use std::io::IoSlice;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use zerocopy::{FromBytes, IntoBytes};

/// The NVM subsystem every case talks to.
pub const NVM_NQN: &str = "nqn.2024-01.io.nvmfd:fuzz";
const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";
const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-00000000f022";
const OTHER_HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:99999999-0000-0000-0000-00000000f022";

/// Namespace 1: 4 MiB RAM disk, 512-byte blocks.
const MALLOC_BLOCKS: u64 = 8192;
/// Namespace 2: 1 GiB null disk, 4 KiB blocks.
const NULL_BLOCKS: u64 = 262_144;
const ICD: u32 = 4096;
const MAX_IO: u32 = 128 * 1024;
const QUEUE_DEPTH: u32 = 32;

/// nvmf-tcp stops reading while this much output is queued (its
/// `TX_HIGH_WATER`); keep in step with the transport.
const TX_HIGH_WATER: usize = 16 << 20;
/// Largest receive buffer: the largest acceptable PDU (data limit
/// max(MAXH2CDATA, in-capsule size, 8 KiB admin) + header, padding,
/// digests) rounded up to a power of two.
const RX_BOUND: usize = 256 * 1024;
/// Largest queued output: the high-water mark, plus what one read's worth
/// of commands can add (each 72-byte command at most ~220 bytes of headers),
/// plus every slot's read data.
const OUT_BOUND: usize =
    TX_HIGH_WATER + 4 * RX_BOUND + (QUEUE_DEPTH as usize + 4) * MAX_IO as usize;

/// The target configuration (SPDK JSON form) every case starts from.
pub fn target_config() -> &'static TargetConfig {
    static CFG: OnceLock<TargetConfig> = OnceLock::new();
    CFG.get_or_init(|| {
        let l = r#"{"trtype":"TCP","adrfam":"IPv4","traddr":"127.0.0.1","trsvcid":"4420"}"#;
        let json = format!(
            r#"{{"subsystems":[
 {{"subsystem":"bdev","config":[
   {{"method":"bdev_malloc_create","params":{{"name":"Malloc0","block_size":512,"num_blocks":{MALLOC_BLOCKS}}}}},
   {{"method":"bdev_null_create","params":{{"name":"Null0","block_size":4096,"num_blocks":{NULL_BLOCKS}}}}}]}},
 {{"subsystem":"nvmf","config":[
   {{"method":"nvmf_create_transport","params":{{"trtype":"TCP","in_capsule_data_size":{ICD},"max_io_size":{MAX_IO},"max_queue_depth":{QUEUE_DEPTH},"max_io_qpairs_per_ctrlr":4}}}},
   {{"method":"nvmf_create_subsystem","params":{{"nqn":"{NVM_NQN}","allow_any_host":true,"serial_number":"NVMFDFUZZ0001","ana_reporting":true}}}},
   {{"method":"nvmf_subsystem_add_ns","params":{{"nqn":"{NVM_NQN}","namespace":{{"nsid":1,"bdev_name":"Malloc0"}}}}}},
   {{"method":"nvmf_subsystem_add_ns","params":{{"nqn":"{NVM_NQN}","namespace":{{"nsid":2,"bdev_name":"Null0"}}}}}},
   {{"method":"nvmf_subsystem_add_listener","params":{{"nqn":"{NVM_NQN}","listen_address":{l}}}}},
   {{"method":"nvmf_subsystem_listener_set_ana_state","params":{{"nqn":"{NVM_NQN}","listen_address":{l},"ana_state":"non_optimized","anagrpid":2}}}},
   {{"method":"nvmf_subsystem_add_listener","params":{{"nqn":"{DISCOVERY_NQN}","listen_address":{l}}}}}
 ]}}]}}"#
        );
        TargetConfig::from_json_str(&json).expect("fuzz target config")
    })
}

fn port() -> Arc<PortInfo> {
    Arc::new(PortInfo {
        trtype: TransportType::Tcp,
        adrfam: AddressFamily::Ipv4,
        traddr: "127.0.0.1".into(),
        trsvcid: "4420".into(),
        peer: "127.0.0.1:50000".parse().expect("peer address"),
        tls: None,
        caps: nvmf_core::TransportCaps::MESSAGE_BASED,
    })
}

/// The one place a connection is built: adapt here when
/// `Connection::new` / `TcpParams` change.
fn new_connection(
    target: &Arc<Target>,
    port: &Arc<PortInfo>,
    c2h_success: bool,
    zc: Option<ZcMode>,
) -> Connection {
    let mut params = TcpParams::new(target.limits(), c2h_success);
    if let Some(m) = zc {
        params.zerocopy_threshold = Some(m.threshold);
        params.zerocopy_always = m.always;
    }
    Connection::new(target.clone(), port.clone(), &params)
}

/// How a connection sends with `MSG_ZEROCOPY` (`nvmf_tcp::zerocopy`), if
/// at all: derived from the slot and the socket chunk size the input chose
/// (the input format stays as it was, old corpora replay).
#[derive(Debug, Clone, Copy)]
struct ZcMode {
    threshold: usize,
    always: bool,
    /// Which reports say the kernel copied after all.
    copied: Copied,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Copied {
    /// About one report in eight.
    Some,
    /// Every report (loopback): `auto` turns zero-copy off after
    /// `COPIED_TO_STOP` calls in a row unless `always`.
    All,
}

impl ZcMode {
    /// Whole-buffer socket I/O (the default queues of most cases): slots
    /// 1 and 3 zero-copy from 512 bytes (every read of a block or more),
    /// slots 0 and 2 from 4 KiB. `Chunk::Whole2`: from 4 KiB. `Chunk::Bytes(n)`: by `n % 4`,
    /// from 512 bytes with every call reported copied (turns off), from
    /// 4 KiB the same with `always`, or off; partial writes split a slot
    /// over several calls.
    fn pick(s: usize, chunk: Chunk) -> Option<ZcMode> {
        let m = |threshold, always, copied| {
            Some(ZcMode {
                threshold,
                always,
                copied,
            })
        };
        match chunk {
            Chunk::Whole if s % 2 == 1 => m(512, false, Copied::Some),
            Chunk::Whole => m(4096, false, Copied::Some),
            Chunk::Whole2 => m(4096, false, Copied::Some),
            Chunk::Bytes(n) => match n % 4 {
                1 => m(512, false, Copied::All),
                2 => m(4096, true, Copied::All),
                3 => m(512, false, Copied::Some),
                _ => None,
            },
        }
    }
}

/// A zero-copy send call the model's kernel has not reported done. Its
/// bytes went into the host's stream as a placeholder at `at`; they are
/// read from the slot buffers (`slices`) only when the call is reported,
/// as the kernel may read them until then.
///
/// Safety of the raw pointers: they point into the connection's slot
/// buffers (or the static zero buffer), which a correct `Connection`
/// neither frees nor reuses before the call is reported done through
/// `zc_completed` (that is the property checked here). The harness reads
/// them only while the `Connection` is alive (reports happen in
/// `zc_report`; `close` discards unreported calls before the connection
/// is dropped), and writes nothing through them. A `Connection` that
/// released a slot early would make the late read see other bytes (or,
/// under ASan in the libFuzzer build, a freed buffer): the comparison
/// with the bytes seen at call time, then the host's PDU parsing and read
/// verification fail.
struct ZcCall {
    seq: u32,
    /// Offset in the stream of everything the target wrote (`produced`).
    at: usize,
    slices: Vec<(*const u8, usize)>,
    /// The bytes as they were when the call was made.
    snapshot: Vec<u8>,
}

/// The fake kernel's side of zero-copy sends on one connection.
struct ZcModel {
    mode: ZcMode,
    /// Unreported calls, in call order (ascending `seq`).
    calls: VecDeque<ZcCall>,
    /// The number of the next call (the kernel numbers from 0 per socket).
    next: u32,
    /// Drives report timing and order (deterministic per case).
    rng: u64,
    /// Zero-copy was turned off by a report (`zc_completed` returned true).
    off: bool,
}

impl ZcModel {
    fn new(mode: ZcMode, seed: u64) -> ZcModel {
        ZcModel {
            mode,
            calls: VecDeque::new(),
            next: 0,
            rng: seed,
            off: false,
        }
    }

    /// splitmix64.
    fn rand(&mut self) -> u64 {
        self.rng = self.rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// What `Connection::zc_outstanding` must say: calls from the first
    /// unreported one on (calls reported out of order above it still
    /// count: the tracker's watermark has not passed them).
    fn outstanding(&self) -> u32 {
        self.calls
            .front()
            .map_or(0, |c| self.next.wrapping_sub(c.seq))
    }
}

/// What a case reached (for the replay test and seed selection).
#[derive(Debug, Default, Clone, Copy)]
pub struct Report {
    /// Successful admin / I/O Connects.
    pub admin_connects: u32,
    pub io_connects: u32,
    /// Responses (CapsuleResp or C2HData SUCCESS) of non-Connect commands.
    pub completions: u32,
    pub r2ts: u32,
    pub c2h: u32,
    /// C2HTermReqs received.
    pub terms: u32,
    /// ICResps that enabled a header or data digest.
    pub digests: u32,
    /// H2CData payloads placed straight into a slot buffer (transport stats).
    pub direct_h2c: u64,
    /// Connections that had asked to be closed when dropped.
    pub closed: u32,
    /// Blocks of successful reads compared with known content.
    pub verified_blocks: u64,
    /// Halves of fused operations answered Compare Failure, Command
    /// Aborted due to Failed Fused Command or Missing Fused Command.
    pub fused_failures: u32,
    /// Zero-copy send calls made, and those reported copied (transport
    /// stats of the dropped connections).
    pub zc_calls: u64,
    pub zc_copied: u64,
}

/// Plays `input` against a fresh target; panics when an invariant breaks.
pub fn run_input(input: &Input) -> Report {
    let target = Target::from_config(target_config()).expect("fuzz target");
    let mut h = Harness {
        target: target.clone(),
        port: port(),
        c2h_success: input.c2h_success,
        conns: Default::default(),
        base: Instant::now(),
        clock: Duration::ZERO,
        admin_cntlid: None,
        report: Report::default(),
        shadow: Shadow::default(),
        opens: 0,
    };
    for op in &input.ops {
        h.op(op);
    }
    // The kernel reports every zero-copy call still outstanding; a host
    // that is reading gets the rest (then nothing may stay parked).
    for s in 0..MAX_CONNS {
        if let Some(c) = h.conns[s].as_mut() {
            if c.zc_report(true) && c.reading {
                h.drain(s, usize::MAX);
            }
            h.check(s);
        }
    }
    for s in 0..MAX_CONNS {
        h.close(s);
    }
    let report = h.report;
    drop(h);
    assert_eq!(
        target.active_controllers(),
        0,
        "controllers left after every connection was dropped"
    );
    report
}

struct Harness {
    target: Arc<Target>,
    port: Arc<PortInfo>,
    c2h_success: bool,
    conns: [Option<Conn>; MAX_CONNS],
    base: Instant,
    clock: Duration,
    /// CNTLID of the last successful admin Connect.
    admin_cntlid: Option<u16>,
    report: Report,
    shadow: Shadow,
    /// Connections opened so far (seeds each one's zero-copy model).
    opens: u64,
}

/// An outstanding R2T as the host saw it.
#[derive(Debug, Clone, Copy)]
struct R2t {
    cccid: u16,
    ttag: u16,
    /// Next offset to send.
    sent: u32,
    end: u32,
}

/// One connection and the fake host's view of it.
struct Conn {
    c: Connection,
    /// Host bytes not yet read by the target.
    pending: Vec<u8>,
    /// Bytes written by the target, not yet parsed.
    inbox: Vec<u8>,
    dopts: DecodeOpts,
    eo: EncodeOpts,
    maxh2cdata: u32,
    icresp: bool,
    term_seen: bool,
    /// Read output after each action.
    reading: bool,
    /// Socket read/write size.
    chunk: usize,
    /// Only harness-built PDUs were sent: CID checks apply.
    tracked: bool,
    outstanding: HashMap<u16, u32>,
    /// Connect CIDs and their QID.
    connects: HashMap<u16, u16>,
    r2ts: Vec<R2t>,
    next_cid: u16,
    /// Bytes written by the target so far.
    produced: usize,
    /// produced + queued output when the close was first seen.
    closed_total: Option<usize>,
    /// Whether the queue is an admin queue (until an I/O Connect succeeds).
    admin: bool,
    /// What the data model follows of each command in flight, by CID, in
    /// the order sent (a CID may be reused once its command completed).
    /// With each, the FUSE bits it was sent with.
    track: HashMap<u16, VecDeque<(Track, u8)>>,
    /// A capsule went out with a byte flipped (`Mangle::Byte`): its FUSE
    /// bits or CID may not be what the model sent.
    mangled: bool,
    /// Zero-copy sends, when on for this connection.
    zc: Option<ZcModel>,
}

/// What the data model follows of one command.
enum Track {
    Other,
    /// A Reservation Acquire: once one succeeds, reads and writes may meet
    /// Reservation Conflict.
    Acquire,
    /// Blocks of namespace 1 it changes.
    Writes(Vec<PendingWrite>),
    Read(PendingRead),
}

/// `NVMF_FUZZ_TRACE=1`: print every action and every PDU from the target.
fn trace() -> bool {
    static T: OnceLock<bool> = OnceLock::new();
    *T.get_or_init(|| std::env::var_os("NVMF_FUZZ_TRACE").is_some_and(|v| v != "0"))
}

/// A PDU from the target, owned.
#[allow(clippy::enum_variant_names)]
#[derive(Debug)]
enum Resp {
    IcResp {
        hdgst: bool,
        ddgst: bool,
        maxh2cdata: u32,
    },
    Cqe {
        cid: u16,
        ok: bool,
        dw0: u32,
        /// Status field (shown by the trace).
        #[allow(dead_code)]
        status: u16,
    },
    C2H {
        cccid: u16,
        success: bool,
        ddok: bool,
        datao: u32,
        data: Vec<u8>,
    },
    R2t {
        cccid: u16,
        ttag: u16,
        r2to: u32,
        r2tl: u32,
    },
    Term {
        fes: u16,
    },
}

impl Conn {
    fn new(c: Connection, chunk: Chunk, zc: Option<ZcModel>) -> Conn {
        let mut dopts = DecodeOpts::new(Role::Host);
        dopts.max_data_len = 1 << 24;
        Conn {
            c,
            pending: Vec::new(),
            inbox: Vec::new(),
            dopts,
            eo: EncodeOpts::new(false, false),
            maxh2cdata: 4096,
            icresp: false,
            term_seen: false,
            reading: true,
            chunk: match chunk {
                Chunk::Whole | Chunk::Whole2 => usize::MAX,
                Chunk::Bytes(n) => usize::from(n).max(1),
            },
            tracked: true,
            outstanding: HashMap::new(),
            connects: HashMap::new(),
            r2ts: Vec::new(),
            next_cid: 1,
            produced: 0,
            closed_total: None,
            admin: true,
            track: HashMap::new(),
            mangled: false,
            zc,
        }
    }

    fn closed(&self) -> bool {
        self.c.close_reason().is_some()
    }

    fn cid(&mut self, sel: Cid) -> u16 {
        match sel {
            Cid::Next | Cid::Next2 | Cid::Next3 => {
                // Skip CIDs still outstanding (a careful host).
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

    fn send_cid(&mut self, cid: u16) {
        *self.outstanding.entry(cid).or_insert(0) += 1;
    }

    fn done_cid(&mut self, cid: u16, what: &str) {
        match self.outstanding.get_mut(&cid) {
            Some(n) => {
                *n -= 1;
                if *n == 0 {
                    self.outstanding.remove(&cid);
                }
            }
            None => assert!(
                !self.tracked,
                "{what} for CID {cid} that is not outstanding"
            ),
        }
    }

    /// Command `cid` completed (`ok`: successfully): update the data model
    /// or check the read. `others`: writes in flight elsewhere.
    fn finish(
        &mut self,
        cid: u16,
        ok: bool,
        status: u16,
        shadow: &mut Shadow,
        others: &[(u64, u32)],
        rep: &mut Report,
    ) {
        let Some(q) = self.track.get_mut(&cid) else {
            return;
        };
        let (t, fuse) = q.pop_front().map_or((None, 0), |(t, f)| (Some(t), f));
        if q.is_empty() {
            self.track.remove(&cid);
        }
        let st = nvmf_wire::status::Status::from_field(status);
        // Command Aborted due to Failed / Missing Fused Command only for a
        // half of a fused operation.
        let fused_status = matches!((st.sct, st.sc), (0, 0x09) | (0, 0x0a));
        assert!(
            fuse != 0 || !fused_status || self.mangled,
            "fused-command status {st:?} on CID {cid}, sent with FUSE 00b"
        );
        if fuse != 0 && (fused_status || (st.sct, st.sc) == (2, 0x85)) {
            rep.fused_failures += 1;
        }
        match &t {
            Some(Track::Acquire) if ok => shadow.reserved = true,
            Some(Track::Writes(_) | Track::Read(_)) => assert!(
                shadow.reserved || (st.sct, st.sc) != (0, 0x83),
                "Reservation Conflict on CID {cid} though no Reservation Acquire ever succeeded"
            ),
            _ => {}
        }
        if let Some(Track::Writes(ws)) = &t {
            if ok {
                for w in ws {
                    shadow.apply(w);
                }
            }
        }
        if let Some(Track::Read(r)) = t {
            if ok {
                let overlaps =
                    |lba: u64, (slba, n): (u64, u32)| lba.wrapping_sub(slba) < u64::from(n);
                let mine: Vec<(u64, u32)> = self.writes().map(|w| (w.slba, w.count)).collect();
                rep.verified_blocks += shadow.check_read(&r, |lba| {
                    others.iter().chain(&mine).any(|&w| overlaps(lba, w))
                }) as u64;
            }
        }
    }

    /// Every write in flight.
    fn writes(&self) -> impl Iterator<Item = &PendingWrite> {
        self.track.values().flatten().flat_map(|(t, _)| match t {
            Track::Writes(ws) => ws.as_slice(),
            _ => &[],
        })
    }

    /// The oldest command in flight with this CID (the one the target is
    /// working on).
    fn front(&mut self, cid: u16) -> Option<&mut Track> {
        self.track
            .get_mut(&cid)
            .and_then(|q| q.front_mut())
            .map(|(t, _)| t)
    }

    /// One write of at most `max` (and the chunk size) bytes of output;
    /// returns how many were written. A zero-copy call's bytes go into the
    /// host's stream as a placeholder, filled when it is reported.
    fn write_call(&mut self, max: usize) -> usize {
        let want = max.min(self.chunk);
        let mut took = Vec::new();
        let mut slices = Vec::new();
        let zc = {
            let mut iov = [IoSlice::new(&[]); 16];
            let (n, kind) = if self.zc.is_some() {
                self.c.output_split(&mut iov)
            } else {
                (self.c.output(&mut iov), SendKind::Copy { more: false })
            };
            assert!(n > 0, "has_output() but output() gave no iovecs");
            for sl in &iov[..n] {
                let t = (want - took.len()).min(sl.len());
                took.extend_from_slice(&sl[..t]);
                slices.push((sl.as_ptr(), t));
                if took.len() == want {
                    break;
                }
            }
            kind == SendKind::ZeroCopy
        };
        assert!(!took.is_empty(), "output() gave only empty iovecs");
        let n = took.len();
        if zc {
            let z = self.zc.as_mut().expect("zero-copy model");
            assert!(!z.off, "a zero-copy call after zero-copy was turned off");
            self.c.consume_output_zc(n);
            let seq = z.next;
            z.next = z.next.wrapping_add(1);
            z.calls.push_back(ZcCall {
                seq,
                at: self.produced,
                slices,
                snapshot: took,
            });
            assert_eq!(
                self.c.zc_outstanding(),
                z.outstanding(),
                "zc_outstanding() after call {seq}"
            );
            self.inbox.resize(self.inbox.len() + n, 0);
        } else {
            self.c.consume_output(n);
            self.inbox.extend_from_slice(&took);
        }
        self.produced += n;
        n
    }

    /// The model's kernel reports some unreported zero-copy calls done:
    /// one range of consecutive calls picked at random (out of order),
    /// unless it holds the last few back for now (`all`: everything, in
    /// random ranges). Their bytes are read from the slot buffers now and
    /// land in the host's stream. Returns whether it reported anything.
    fn zc_report(&mut self, all: bool) -> bool {
        let base = self.produced - self.inbox.len();
        let Some(z) = self.zc.as_mut() else {
            return false;
        };
        let mut any = false;
        loop {
            if z.calls.is_empty() {
                break;
            }
            let hold = if all { 0 } else { (z.rand() % 4) as usize };
            if z.calls.len() <= hold {
                break;
            }
            let r = z.rand();
            let i = (r % z.calls.len() as u64) as usize;
            let most = 1 + ((r >> 16) % 4) as usize;
            let mut j = i;
            while j + 1 < z.calls.len()
                && j + 1 - i < most
                && z.calls[j + 1].seq == z.calls[j].seq.wrapping_add(1)
            {
                j += 1;
            }
            let (lo, hi) = (z.calls[i].seq, z.calls[j].seq);
            let copied = match z.mode.copied {
                Copied::All => true,
                Copied::Some => (r >> 24) % 8 == 0,
            };
            for call in z.calls.drain(i..=j) {
                let mut at = call.at - base;
                let mut late = Vec::with_capacity(call.snapshot.len());
                for &(p, len) in &call.slices {
                    // SAFETY: see `ZcCall`: the Connection is alive and has
                    // not been told call `seq` is done, so a correct one
                    // still holds these buffers unchanged.
                    let b = unsafe { std::slice::from_raw_parts(p, len) };
                    late.extend_from_slice(b);
                }
                assert!(
                    late == call.snapshot,
                    "the bytes of zero-copy call {} changed before the kernel reported it \
                     done: a slot it carried was released early",
                    call.seq
                );
                self.inbox[at..at + late.len()].copy_from_slice(&late);
                at += late.len();
                debug_assert!(at <= self.inbox.len());
            }
            if trace() {
                eprintln!("  zero-copy calls {lo}..={hi} reported done (copied: {copied})");
            }
            if self.c.zc_completed(lo, hi, copied) {
                assert!(
                    !z.mode.always && z.mode.copied == Copied::All,
                    "zero-copy turned off though the kernel did not copy every call"
                );
                z.off = true;
            }
            assert_eq!(
                self.c.zc_outstanding(),
                z.outstanding(),
                "zc_outstanding() after reporting {lo}..={hi}"
            );
            any = true;
            if !all {
                break;
            }
        }
        any
    }

    /// Decodes every complete PDU the target wrote, up to the first byte
    /// of a zero-copy call not reported yet (the host cannot have it).
    fn parse(&mut self) -> Vec<Resp> {
        let mut out = Vec::new();
        let mut off = 0;
        let limit = match self.zc.as_ref().and_then(|z| z.calls.front()) {
            Some(call) => call.at - (self.produced - self.inbox.len()),
            None => self.inbox.len(),
        };
        loop {
            let res = match decode(&self.inbox[off..limit], &self.dopts) {
                Err(e) => panic!(
                    "target output does not decode as a target PDU: {e:?} (bytes {:02x?})",
                    &self.inbox[off..(off + 32).min(limit)]
                ),
                Ok(Decoded::Incomplete { .. }) => break,
                Ok(Decoded::Pdu { len, pdu }) => {
                    off += len;
                    owned(&pdu)
                }
            };
            if trace() {
                eprintln!("  <- {res:?}");
            }
            assert!(!self.term_seen, "a PDU followed the C2HTermReq");
            match res {
                Resp::IcResp {
                    hdgst,
                    ddgst,
                    maxh2cdata,
                } => {
                    assert!(!self.icresp, "second ICResp");
                    assert!(
                        maxh2cdata >= 4096 && maxh2cdata % 4 == 0,
                        "bad MAXH2CDATA {maxh2cdata}"
                    );
                    self.icresp = true;
                    self.dopts.hdgst = hdgst;
                    self.dopts.ddgst = ddgst;
                    self.eo = EncodeOpts::new(hdgst, ddgst);
                    self.maxh2cdata = maxh2cdata;
                }
                Resp::Term { fes } => {
                    assert!((1..=6).contains(&fes), "C2HTermReq FES {fes}");
                    self.term_seen = true;
                }
                _ => assert!(self.icresp, "PDU before the ICResp"),
            }
            out.push(res);
        }
        self.inbox.drain(..off);
        out
    }
}

fn owned(p: &Pdu<'_>) -> Resp {
    match *p {
        Pdu::IcResp(r) => Resp::IcResp {
            hdgst: r.hdgst_enabled(),
            ddgst: r.ddgst_enabled(),
            maxh2cdata: r.maxh2cdata(),
        },
        Pdu::CapsuleResp(r) => Resp::Cqe {
            cid: r.cqe.cid(),
            ok: r.cqe.status().is_success(),
            dw0: r.cqe.dw0(),
            status: r.cqe.status().to_field(),
        },
        Pdu::C2HData {
            hdr,
            data,
            data_digest_ok,
        } => Resp::C2H {
            cccid: hdr.cccid(),
            success: hdr.success(),
            ddok: data_digest_ok,
            datao: hdr.datao(),
            data: data.to_vec(),
        },
        Pdu::R2T(r) => Resp::R2t {
            cccid: r.cccid(),
            ttag: r.ttag(),
            r2to: r.r2to(),
            r2tl: r.r2tl(),
        },
        Pdu::C2HTermReq { hdr, .. } => Resp::Term { fes: hdr.fes() },
        ref other => panic!("target sent a host-to-controller PDU: {other:?}"),
    }
}

/// Flips what `m` says in one encoded PDU. Returns whether bytes other
/// than digests may have changed (CID checks no longer apply).
fn mangle_pdu(pdu: &mut [u8], m: Mangle) -> bool {
    if pdu.len() < 8 {
        return false;
    }
    let (flags, hlen) = (pdu[1], usize::from(pdu[2]));
    match m {
        Mangle::HeaderDigest if flags & HDGSTF != 0 && pdu.len() >= hlen + 4 => {
            pdu[hlen] ^= 0x01;
            false
        }
        Mangle::DataDigest if flags & DDGSTF != 0 => {
            let n = pdu.len();
            pdu[n - 1] ^= 0x80;
            false
        }
        Mangle::Byte { pos, xor } if xor != 0 => {
            let n = pdu.len();
            pdu[usize::from(pos) % n] ^= xor;
            true
        }
        _ => false,
    }
}

/// Overwrites a little-endian header field of one encoded PDU and fixes
/// its header digest.
fn patch(pdu: &mut [u8], at: usize, bytes: &[u8]) {
    pdu[at..at + bytes.len()].copy_from_slice(bytes);
    let hlen = usize::from(pdu[2]);
    if pdu[1] & HDGSTF != 0 && pdu.len() >= hlen + 4 {
        let d = crc32c(&pdu[..hlen]);
        pdu[hlen..hlen + 4].copy_from_slice(&d.to_le_bytes());
    }
}

/// Payload bytes: byte `i` of a transfer at offset `at` of command `seed`
/// (distinct per position, so misplaced data shows in a read-back).
fn fill_at(at: usize, len: usize, seed: u16) -> Vec<u8> {
    (at..at + len)
        .map(|i| ((i as u32 ^ (u32::from(seed) << 20)).wrapping_mul(0x9E37_79B1) >> 24) as u8)
        .collect()
}

fn fill(len: usize, seed: u16) -> Vec<u8> {
    fill_at(0, len, seed)
}

/// Opcode choices (weighted by repetition).
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Identify,
    GetLogPage,
    GetFeatures,
    SetFeatures,
    KeepAlive,
    Aer,
    Abort,
    PropGet,
    PropSet,
    Disconnect,
    Auth,
    RawAdmin,
    Read,
    Write,
    Flush,
    WriteZeroes,
    Dsm,
    /// Reservation Register, Acquire, Release or Report.
    Reservation,
    /// Compare (05h, host data) or Verify (0Ch), by the selector's bit 0.
    CompareVerify,
    /// Copy (19h): 1-4 source ranges near SLBA to SLBA + 4096.
    Copy,
    RawIo,
    Fabrics,
}

const ADMIN_KINDS: &[Kind] = &[
    Kind::Identify,
    Kind::Identify,
    Kind::Identify,
    Kind::GetLogPage,
    Kind::GetLogPage,
    Kind::GetFeatures,
    Kind::SetFeatures,
    Kind::KeepAlive,
    Kind::Aer,
    Kind::Aer,
    Kind::Abort,
    Kind::PropGet,
    Kind::PropSet,
    Kind::Disconnect,
    Kind::Auth,
    Kind::RawAdmin,
    Kind::Read,
    Kind::Write,
];

const IO_KINDS: &[Kind] = &[
    Kind::Read,
    Kind::Read,
    Kind::Read,
    Kind::Read,
    Kind::Write,
    Kind::Write,
    Kind::Write,
    Kind::Write,
    Kind::Flush,
    Kind::WriteZeroes,
    Kind::Dsm,
    Kind::Dsm,
    Kind::RawIo,
    Kind::Fabrics,
    Kind::Identify,
    Kind::Reservation,
    Kind::CompareVerify,
    Kind::Copy,
];

fn block_size(nsid: u32) -> u32 {
    if nsid == 2 {
        4096
    } else {
        512
    }
}

impl Harness {
    fn now(&self) -> Instant {
        self.base + self.clock
    }

    fn op(&mut self, op: &Op) {
        if trace() {
            eprintln!("{op:?}");
        }
        match op {
            Op::Open { conn, setup, chunk } => {
                let s = slot(*conn);
                self.close(s);
                self.open(s, setup, *chunk);
            }
            Op::IcReq { conn, ic, split } => {
                let s = self.live(*conn);
                self.icreq(s, ic, *split);
            }
            Op::Connect {
                conn,
                io,
                spec,
                split,
            } => {
                let s = self.live(*conn);
                self.connect(s, *io, spec, *split);
            }
            Op::Admin {
                conn,
                cmd,
                split,
                mangle,
            } => {
                let s = self.live(*conn);
                self.command(s, cmd, true, *split, *mangle);
            }
            Op::Io {
                conn,
                cmd,
                split,
                mangle,
            }
            | Op::Io2 {
                conn,
                cmd,
                split,
                mangle,
            } => {
                let s = self.live(*conn);
                self.command(s, cmd, false, *split, *mangle);
            }
            Op::RawSqe {
                conn,
                sqe,
                data_len,
                split,
            } => {
                let s = self.live(*conn);
                let cmd = Command::read_from_bytes(sqe).expect("64 bytes");
                // It may write anywhere.
                self.shadow.valid = false;
                let data = fill(usize::from(*data_len) % (2 * ICD as usize + 64), cmd.cid());
                self.capsule(s, &cmd, &data, *split, Mangle::None);
            }
            Op::H2c {
                conn,
                h2c,
                split,
                mangle,
            } => {
                let s = self.live(*conn);
                self.h2c(s, h2c, *split, *mangle);
            }
            Op::Raw { conn, bytes } => {
                let s = self.live(*conn);
                let c = self.conn(s);
                c.tracked = false;
                c.pending.extend_from_slice(bytes);
                self.deliver(s, 0);
            }
            Op::TermReq {
                conn,
                fes,
                fei,
                quoted,
            } => {
                let s = self.live(*conn);
                let mut v = Vec::new();
                let q = vec![0x04; usize::from(*quoted) % 140];
                encode_term_req(&mut v, Role::Host, *fes, *fei, &q);
                self.emit(s, v, Split::Whole, Mangle::None);
            }
            Op::Flush { conn } => {
                let s = slot(*conn);
                if self.conns[s].is_some() {
                    self.deliver(s, 0);
                }
            }
            Op::Read { conn, max } => {
                let s = slot(*conn);
                if self.conns[s].is_some() {
                    self.drain(s, usize::from(*max));
                    self.check(s);
                }
            }
            Op::SetReading { conn, on } => {
                let s = slot(*conn);
                if self.conns[s].is_some() {
                    self.conn(s).reading = *on;
                    if *on {
                        self.drain(s, usize::MAX);
                    }
                    self.check(s);
                }
            }
            Op::Tick { ms } => {
                self.clock += match ms {
                    Tick::Ms(n) => Duration::from_millis(u64::from(*n)),
                    Tick::Sec(n) => Duration::from_secs(u64::from(*n % 16)),
                    Tick::PastKato => Duration::from_secs(31),
                };
                let now = self.now();
                for s in 0..MAX_CONNS {
                    if let Some(c) = self.conns[s].as_mut() {
                        // Time passed: the kernel is done with every
                        // zero-copy call made so far.
                        c.zc_report(true);
                        c.c.poll(now);
                        if c.reading {
                            self.drain(s, usize::MAX);
                        }
                        self.check(s);
                    }
                }
            }
            Op::Drop { conn } => self.close(slot(*conn)),
        }
    }

    fn conn(&mut self, s: usize) -> &mut Conn {
        self.conns[s].as_mut().expect("live connection")
    }

    /// The connection in slot `conn`, opened (or reopened, when the old one
    /// was closed: the reactor drops those) with the default handshake: an
    /// enabled admin queue in slot 0, I/O queues of its controller in the
    /// others (slot 0 is brought up first when needed).
    fn live(&mut self, conn: u8) -> usize {
        let s = slot(conn);
        if self.conns[s].as_ref().is_some_and(|c| c.closed()) {
            self.close(s);
        }
        if s != 0 && self.admin_cntlid.is_none() && self.conns[0].is_none() {
            // An I/O queue needs a controller: bring up slot 0 first.
            self.live(0);
        }
        if self.conns[s].is_none() {
            let ic = IcSpec {
                hdgst: false,
                ddgst: false,
                pfv: Small16::Zero,
                hpda: Small8::Zero,
                maxr2t: 0,
            };
            let connect = ConnectSpec {
                sqsize: SqSize::Typical,
                kato: Kato::Default,
                cattr: Cattr::None,
                subnqn: SubNqn::Nvm,
                hostnqn: HostNqn::Default,
                cntlid: Pick16::Auto,
                qid: Pick16::Auto,
                recfmt: Small16::Zero,
                data: ConnectData::InCapsule,
            };
            let setup = if s == 0 || self.admin_cntlid.is_none() {
                Setup::Admin {
                    ic,
                    connect,
                    enable: true,
                }
            } else {
                Setup::Io { ic, connect }
            };
            self.open(s, &setup, Chunk::Whole);
        }
        s
    }

    /// Drops the connection in slot `s` (the socket closes).
    fn close(&mut self, s: usize) {
        if self.conns[s].is_some() {
            self.check(s);
            if let Some(mut c) = self.conns[s].take() {
                // Unreported zero-copy calls: their bytes are never read
                // (the host's view of a dropped connection does not
                // matter), and never after the Connection is gone.
                if let Some(z) = c.zc.as_mut() {
                    z.calls.clear();
                }
                let stats = c.c.stats();
                self.report.direct_h2c += stats.direct_h2c;
                self.report.zc_calls += stats.zc_calls;
                self.report.zc_copied += stats.zc_copied;
                self.report.closed += u32::from(c.closed());
                // Writes whose outcome the host never learned.
                for w in c.writes() {
                    self.shadow.forget(w.slba, w.count);
                }
            }
        }
    }

    fn open(&mut self, s: usize, setup: &Setup, chunk: Chunk) {
        let mode = ZcMode::pick(s, chunk);
        let c = new_connection(&self.target, &self.port, self.c2h_success, mode);
        self.opens += 1;
        let seed = self.opens << 8 | s as u64;
        let zc = mode.map(|m| ZcModel::new(m, seed));
        self.conns[s] = Some(Conn::new(c, chunk, zc));
        match setup {
            Setup::Bare => {}
            Setup::IcOnly(ic) => self.icreq(s, ic, Split::Whole),
            Setup::Admin {
                ic,
                connect,
                enable,
            } => {
                self.icreq(s, ic, Split::Whole);
                self.connect(s, false, connect, Split::Whole);
                if *enable && !self.conn(s).closed() {
                    let c = self.conn(s);
                    let cid = c.cid(Cid::Next);
                    let cc = CC_EN | (6 << 16) | (4 << 20);
                    let cmd = Command::property_set(cid, CC, false, u64::from(cc));
                    self.capsule(s, &cmd, &[], Split::Whole, Mangle::None);
                }
            }
            Setup::Io { ic, connect } => {
                self.icreq(s, ic, Split::Whole);
                self.connect(s, true, connect, Split::Whole);
            }
        }
    }

    fn icreq(&mut self, s: usize, ic: &IcSpec, split: Split) {
        let mut v = Vec::new();
        encode_ic_req(&mut v, 0, ic.hdgst, ic.ddgst, ic.maxr2t);
        if let Small16::Raw(p) = ic.pfv {
            v[8..10].copy_from_slice(&p.to_le_bytes());
        }
        if let Small8::Raw(h) = ic.hpda {
            v[10] = h;
        }
        self.emit(s, v, split, Mangle::None);
    }

    fn connect(&mut self, s: usize, io: bool, spec: &ConnectSpec, split: Split) {
        let admin_cntlid = self.admin_cntlid;
        let c = self.conn(s);
        let cid = c.cid(Cid::Next);
        let auto = |p: Pick16, v: u16| match p {
            Pick16::Raw(r) => r,
            _ => v,
        };
        let qid = auto(spec.qid, if io { s.max(1) as u16 } else { 0 });
        let cntlid = auto(
            spec.cntlid,
            if io {
                admin_cntlid.unwrap_or(CNTLID_DYNAMIC)
            } else {
                CNTLID_DYNAMIC
            },
        );
        let sqsize = match spec.sqsize {
            SqSize::Typical | SqSize::Typical2 => 31,
            SqSize::Small(n) => u16::from(n),
            SqSize::Zero => 0,
            SqSize::Raw(n) => n,
        };
        let kato = match spec.kato {
            Kato::Default | Kato::Default2 => {
                if qid == 0 {
                    30_000
                } else {
                    0
                }
            }
            Kato::Zero => 0,
            Kato::Ms(n) => u32::from(n),
            Kato::Raw(n) => n,
        };
        let cattr = match spec.cattr {
            Cattr::None | Cattr::None2 => 0,
            Cattr::DisableSqFlow => nvmf_wire::fabrics::CATTR_DISABLE_SQ_FLOW_CONTROL,
            Cattr::Raw(v) => v,
        };
        let mut cmd = Command::connect(cid, qid, sqsize, cattr, kato);
        if let Small16::Raw(r) = spec.recfmt {
            let v = (cmd.cdw10() & !0xffff) | u32::from(r);
            cmd.set_cdw10(v);
        }
        let subnqn = match spec.subnqn {
            SubNqn::Nvm | SubNqn::Nvm2 | SubNqn::Nvm3 => NVM_NQN,
            SubNqn::Discovery => DISCOVERY_NQN,
            SubNqn::Unknown => "nqn.2024-01.io.nvmfd:nosuch",
            SubNqn::Unterminated | SubNqn::Empty => "",
        };
        let hostnqn = match spec.hostnqn {
            HostNqn::Default | HostNqn::Default2 => HOSTNQN,
            HostNqn::Other => OTHER_HOSTNQN,
            HostNqn::Empty | HostNqn::Unterminated => "",
        };
        // The other host NQN is another host (another host identifier: a
        // registrant of its own for reservations).
        let hostid = if hostnqn == OTHER_HOSTNQN {
            [8; 16]
        } else {
            [7; 16]
        };
        let mut data = ConnectBlock::new(hostid, cntlid, subnqn, hostnqn)
            .as_bytes()
            .to_vec();
        if let SubNqn::Unterminated = spec.subnqn {
            data[256..512].fill(b'a');
        }
        if let HostNqn::Unterminated = spec.hostnqn {
            data[512..768].fill(b'h');
        }
        c.connects.insert(cid, qid);
        let (sgl, data) = match spec.data {
            ConnectData::InCapsule | ConnectData::InCapsule2 | ConnectData::InCapsule3 => {
                (SglDescriptor::in_capsule(0, 1024), data)
            }
            ConnectData::Transport => (SglDescriptor::transport(1024), Vec::new()),
            ConnectData::Short(n) => {
                data.truncate(usize::from(n) % 1024);
                (SglDescriptor::in_capsule(0, 1024), data)
            }
            ConnectData::None => (SglDescriptor::in_capsule(0, 1024), Vec::new()),
        };
        cmd.set_sgl(sgl);
        self.capsule(s, &cmd, &data, split, Mangle::None);
        if let ConnectData::Transport = spec.data {
            self.answer_r2t(s, cid);
        }
    }

    /// Builds and sends one command from `spec`.
    fn command(&mut self, s: usize, spec: &CmdSpec, admin: bool, split: Split, mangle: Mangle) {
        let c = self.conn(s);
        let cid = c.cid(spec.cid);
        let kinds = if admin { ADMIN_KINDS } else { IO_KINDS };
        let kind = kinds[usize::from(spec.op) % kinds.len()];
        let nsid = match spec.nsid {
            Nsid::Malloc | Nsid::Malloc2 => 1,
            Nsid::Null => 2,
            Nsid::Zero => 0,
            Nsid::All => u32::MAX,
            Nsid::Raw(n) => n,
        };
        let slba = match spec.slba {
            Lba::Low(n) | Lba::Low2(n) => u64::from(n & 0x1fff),
            Lba::Raw(n) => n,
        };
        let nlb = u32::from(spec.nlb);
        let sel = spec.sel;
        let cdw = spec.cdw;
        // (command, natural transfer length, extra data built here)
        let mut data_override: Option<Vec<u8>> = None;
        let mut dsm_ranges = Vec::new();
        let (mut cmd, natural) = match kind {
            Kind::Identify => {
                let mut cmd = Command::new(0x06, cid);
                let cns = if sel >= 0xf0 {
                    cdw[0]
                } else {
                    u32::from(sel % 0x20)
                };
                cmd.set_cdw10(cns).set_nsid(nsid);
                (cmd, 4096)
            }
            Kind::GetLogPage => {
                let lids = [1u8, 2, 3, 4, 5, 0x0C, 0x70, 0x80, sel];
                let lid = lids[usize::from(sel) % lids.len()];
                let len = 512 * (1 + (nlb % 8));
                let off = if sel & 0x80 != 0 {
                    u64::from(cdw[1])
                } else {
                    0
                };
                let mut cmd = Command::new(0x02, cid);
                cmd.set_get_log_page(lid, len, off).set_nsid(nsid);
                (cmd, len)
            }
            Kind::GetFeatures | Kind::SetFeatures => {
                let fids = [1u8, 2, 5, 6, 7, 8, 0x0b, 0x0f, 0x81, 0x82, 0x83, sel];
                let fid = u32::from(fids[usize::from(sel) % fids.len()]);
                let (op, save) = if kind == Kind::GetFeatures {
                    (0x0a, (cdw[0] & 0x7) << 8)
                } else {
                    (0x09, cdw[0] & (1 << 31))
                };
                let mut cmd = Command::new(op, cid);
                cmd.set_cdw10(fid | save).set_cdw11(cdw[1]).set_nsid(nsid);
                let natural = if fid == 0x81 { 16 } else { 0 };
                (cmd, natural)
            }
            Kind::KeepAlive => (Command::new(0x18, cid), 0),
            Kind::Aer => (Command::new(0x0c, cid), 0),
            Kind::Abort => {
                let victim = c.cid(Cid::Reuse(spec.nlb));
                let sqid = if sel & 1 != 0 { cdw[0] & 0xffff } else { 0 };
                let mut cmd = Command::new(0x08, cid);
                cmd.set_cdw10((u32::from(victim) << 16) | sqid);
                (cmd, 0)
            }
            Kind::PropGet => {
                let offs = [0u32, VS, CC, CSTS, NSSR, cdw[0]];
                let off = offs[usize::from(sel) % offs.len()];
                (Command::property_get(cid, off, sel & 0x80 != 0), 0)
            }
            Kind::PropSet => {
                let offs = [CC, CC, CC, CSTS, NSSR, 0, cdw[0]];
                let off = offs[usize::from(sel) % offs.len()];
                let values = [
                    u64::from(CC_EN | (6 << 16) | (4 << 20)),
                    1u64 << 14,
                    0,
                    u64::from(cdw[1]) | (u64::from(cdw[2]) << 32),
                ];
                let v = values[usize::from(spec.nlb) % values.len()];
                (Command::property_set(cid, off, sel & 0x80 != 0, v), 0)
            }
            Kind::Disconnect => (Command::disconnect(cid), 0),
            Kind::Auth | Kind::Fabrics => {
                let mut cmd = Command::new(0x7f, cid);
                let fct = if kind == Kind::Auth {
                    if sel & 1 == 0 {
                        5
                    } else {
                        6
                    }
                } else {
                    sel
                };
                cmd.set_fctype(fct);
                cmd.set_cdw10(cdw[0]).set_cdw11(cdw[1]);
                (cmd, nlb * 16)
            }
            Kind::RawAdmin | Kind::RawIo => {
                let mut cmd = Command::new(cdw[5] as u8, cid);
                cmd.set_nsid(nsid)
                    .set_cdw10(cdw[0])
                    .set_cdw11(cdw[1])
                    .set_cdw12(cdw[2])
                    .set_cdw13(cdw[3])
                    .set_cdw14(cdw[4])
                    .set_cdw15(cdw[5]);
                (cmd, nlb * 64)
            }
            Kind::Read | Kind::Write => {
                let op = if kind == Kind::Read { 0x02 } else { 0x01 };
                let mut cmd = Command::new(op, cid);
                cmd.set_nsid(nsid).set_lba_range(slba, nlb + 1);
                if sel & 0xc0 == 0xc0 {
                    cmd.set_cdw12(cmd.cdw12() | (cdw[0] & 0xffff_0000));
                }
                if sel & 0x0c == 0x0c {
                    // The second half of a fused Compare and Write (with a
                    // FUSE-first Compare just before it, or lone).
                    cmd.set_flags(2);
                }
                (cmd, (nlb + 1) * block_size(nsid))
            }
            Kind::Reservation => {
                // Register 0Dh, Report 0Eh, Acquire 11h, Release 15h; actions,
                // types and keys from a small set (so they meet), sometimes raw.
                let ops = [0x0du8, 0x0d, 0x11, 0x11, 0x15, 0x0e];
                let op = ops[usize::from(sel) % ops.len()];
                let keys = [1u64, 2, 0, u64::from(cdw[1])];
                let k = |i: u32| keys[(cdw[2] >> (2 * i)) as usize % keys.len()];
                let cdw10 = if sel >= 0xf0 {
                    cdw[0]
                } else {
                    // action 2:0 (0..=2), IEKEY 3, type 15:8 (1..=6), CPTPL 31:30
                    ((cdw[0] & 3) % 3)
                        | (cdw[0] & 8)
                        | ((1 + (cdw[0] >> 8) % 6) << 8)
                        | (cdw[0] & (3 << 30))
                };
                let mut cmd = Command::new(op, cid);
                cmd.set_nsid(nsid).set_cdw10(cdw10).set_cdw11(!cdw[3] & 1);
                let natural = match op {
                    0x0e => {
                        cmd.set_cdw10(nlb * 16 + 15);
                        (nlb + 1) * 64
                    }
                    0x15 => {
                        data_override = Some(k(0).to_le_bytes().to_vec());
                        8
                    }
                    _ => {
                        let mut d = k(0).to_le_bytes().to_vec();
                        d.extend_from_slice(&k(1).to_le_bytes());
                        data_override = Some(d);
                        16
                    }
                };
                (cmd, natural)
            }
            Kind::CompareVerify => {
                let compare = sel & 1 == 0;
                let mut cmd = Command::new(if compare { 0x05 } else { 0x0c }, cid);
                cmd.set_nsid(nsid).set_lba_range(slba, nlb + 1);
                if sel & 0x80 != 0 {
                    // Sometimes fused: first (a Compare and Write if a
                    // FUSE-second Write comes next), second or reserved.
                    cmd.set_flags((sel >> 1) & 3);
                }
                let natural = if compare {
                    (nlb + 1) * block_size(nsid)
                } else {
                    0
                };
                (cmd, natural)
            }
            Kind::Copy => {
                let nr = u32::from(sel % 4);
                let sdlba = slba.wrapping_add(4096);
                let mut cmd = Command::new(0x19, cid);
                cmd.set_nsid(nsid)
                    .set_cdw10(sdlba as u32)
                    .set_cdw11((sdlba >> 32) as u32)
                    .set_cdw12(if sel & 0x80 != 0 { cdw[2] } else { nr });
                let mut d = Vec::with_capacity(32 * (nr as usize + 1));
                for i in 0..=nr {
                    d.extend_from_slice(&[0u8; 8]);
                    d.extend_from_slice(&slba.wrapping_add(u64::from(i) * 64).to_le_bytes());
                    d.extend_from_slice(&(nlb as u16).to_le_bytes());
                    d.extend_from_slice(&[0u8; 14]);
                }
                data_override = Some(d);
                (cmd, 32 * (nr + 1))
            }
            Kind::Flush => {
                let mut cmd = Command::new(0x00, cid);
                cmd.set_nsid(nsid);
                (cmd, 0)
            }
            Kind::WriteZeroes => {
                let mut cmd = Command::new(0x08, cid);
                cmd.set_nsid(nsid).set_lba_range(slba, nlb + 1);
                (cmd, 0)
            }
            Kind::Dsm => {
                let nr = u32::from(sel % 4);
                let mut cmd = Command::new(0x09, cid);
                let attr = if sel & 0x80 != 0 { cdw[1] } else { 1 << 2 };
                cmd.set_nsid(nsid).set_cdw10(nr).set_cdw11(attr);
                let mut d = Vec::with_capacity(16 * (nr as usize + 1));
                for i in 0..=nr {
                    d.extend_from_slice(&0u32.to_le_bytes());
                    d.extend_from_slice(&(nlb + 1).to_le_bytes());
                    d.extend_from_slice(&slba.wrapping_add(u64::from(i) * 256).to_le_bytes());
                }
                data_override = Some(d.clone());
                dsm_ranges = d;
                (cmd, 16 * (nr + 1))
            }
        };
        if let Small8::Raw(f) = spec.flags {
            cmd.set_flags(f);
        }
        let adjust = |l: Len| match l {
            Len::Auto => natural,
            Len::Plus(d) => natural.wrapping_add(u32::from(d)),
            Len::Minus(d) => natural.saturating_sub(u32::from(d)),
            Len::Raw(v) => v,
        };
        let icd = if c.admin { 8192 } else { ICD };
        // Direction from the opcode (FCTYPE for Fabrics), as the transport does.
        let dirbits = if cmd.opcode() == 0x7f {
            cmd.fctype() & 3
        } else {
            cmd.opcode() & 3
        };
        let h2c_dir = dirbits == 1;
        let (sgl, incapsule) = match spec.sgl {
            Sgl::Auto | Sgl::Auto2 | Sgl::Auto3 => {
                if h2c_dir && natural <= icd {
                    (SglDescriptor::in_capsule(0, natural), true)
                } else {
                    (SglDescriptor::transport(natural), false)
                }
            }
            Sgl::InCapsule(l) => (SglDescriptor::in_capsule(0, adjust(l)), true),
            Sgl::Transport(l) => (SglDescriptor::transport(adjust(l)), false),
            Sgl::Raw(b) => {
                let d = nvmf_wire::command::SglDescriptor::read_from_bytes(&b[..]).expect("16");
                (d, false)
            }
        };
        cmd.set_sgl(sgl);
        let sgl_len = cmd.sgl().length() as usize;
        let data = match spec.data {
            Data::Auto | Data::Auto2 | Data::Auto3 => {
                if incapsule && h2c_dir && sgl_len <= 2 * icd as usize {
                    match data_override {
                        Some(mut d) => {
                            d.resize(sgl_len, 0);
                            d
                        }
                        None => fill(sgl_len, cid),
                    }
                } else {
                    Vec::new()
                }
            }
            Data::None => Vec::new(),
            Data::Len(n) => fill(usize::from(n) % (2 * icd as usize + 64), cid),
        };
        let now = self.shadow.now();
        let c = self.conn(s);
        let on_io = !c.admin;
        let count = nlb + 1;
        let mut track = Track::Other;
        match kind {
            Kind::RawIo if on_io && !matches!(cmd.opcode(), 0x00 | 0x02) => {
                self.shadow.valid = false;
            }
            Kind::RawAdmin if cmd.opcode() >= 0x80 => self.shadow.valid = false,
            Kind::Write | Kind::WriteZeroes if on_io && nsid == 1 => {
                let len = count as usize * BS;
                let known = if kind == Kind::WriteZeroes || cmd.fuse() != 0 {
                    // A fused Write lands only if its Compare matched.
                    None
                } else if incapsule && sgl_len == len && data.len() == len {
                    Some(data.clone())
                } else if !incapsule && sgl_len == len && !matches!(spec.sgl, Sgl::Raw(_)) {
                    // Filled in by the H2CData PDUs.
                    Some(vec![0; len])
                } else {
                    None
                };
                let w = PendingWrite {
                    slba,
                    count,
                    data: known,
                    zeroes: kind == Kind::WriteZeroes,
                    sent: now,
                };
                track = Track::Writes(vec![w]);
            }
            Kind::Dsm if on_io && nsid == 1 && !(incapsule && data == dsm_ranges) => {
                // The ranges the target reads are not the ones built here
                // (other data, or sent through R2T): it may deallocate anything.
                self.shadow.valid = false;
            }
            Kind::Dsm if on_io && nsid == 1 => {
                // Deallocated blocks: content unknown once it completes.
                let mut ws = Vec::new();
                for i in 0..=u64::from(sel % 4) {
                    let w = PendingWrite {
                        slba: slba.wrapping_add(i * 256),
                        count,
                        data: None,
                        zeroes: false,
                        sent: now,
                    };
                    ws.push(w);
                }
                track = Track::Writes(ws);
            }
            Kind::Reservation if cmd.opcode() == 0x11 => track = Track::Acquire,
            Kind::Copy if on_io && nsid == 1 => {
                if sel & 0x80 != 0 || !(incapsule && data.len() >= 32 * (usize::from(sel % 4) + 1))
                {
                    // Ranges or their count not the ones built here.
                    self.shadow.valid = false;
                } else {
                    // The destination's content: unknown once it completes.
                    let w = PendingWrite {
                        slba: slba.wrapping_add(4096),
                        count: (nlb + 1) * (u32::from(sel % 4) + 1),
                        data: None,
                        zeroes: false,
                        sent: now,
                    };
                    track = Track::Writes(vec![w]);
                }
            }
            Kind::Read if on_io && (nsid == 1 || nsid == 2) => {
                let bs = block_size(nsid) as usize;
                if sgl_len == count as usize * bs {
                    let r = PendingRead {
                        null: nsid == 2,
                        slba,
                        count,
                        block_size: bs,
                        buf: Vec::new(),
                        sent: now,
                    };
                    track = Track::Read(r);
                }
            }
            _ => {}
        }
        self.capsule_tracked(s, &cmd, &data, split, mangle, track);
        if spec.answer_r2t {
            self.answer_r2t(s, cid);
        }
    }

    /// Encodes and sends a command capsule; the CID becomes outstanding.
    fn capsule(&mut self, s: usize, cmd: &Command, data: &[u8], split: Split, mangle: Mangle) {
        self.capsule_tracked(s, cmd, data, split, mangle, Track::Other);
    }

    fn capsule_tracked(
        &mut self,
        s: usize,
        cmd: &Command,
        data: &[u8],
        split: Split,
        mangle: Mangle,
        track: Track,
    ) {
        let c = self.conn(s);
        c.mangled |= matches!(mangle, Mangle::Byte { .. });
        c.track
            .entry(cmd.cid())
            .or_default()
            .push_back((track, cmd.fuse()));
        let mut v = Vec::new();
        encode_capsule_cmd(&mut v, &c.eo, cmd, data);
        c.send_cid(cmd.cid());
        self.emit(s, v, split, mangle);
    }

    /// Correct H2CData for every R2T recorded for `cid`.
    fn answer_r2t(&mut self, s: usize, cid: u16) {
        let c = self.conn(s);
        if c.closed() {
            return;
        }
        let Some(i) = c.r2ts.iter().position(|r| r.cccid == cid) else {
            return;
        };
        let spec = H2cSpec {
            pick: i as u8,
            pieces: 0,
            size: Piece::Max,
            fault: H2cFault::None,
        };
        if i < 256 {
            self.h2c(s, &spec, Split::Whole, Mangle::None);
        }
    }

    fn h2c(&mut self, s: usize, spec: &H2cSpec, split: Split, mangle: Mangle) {
        let c = self.conn(s);
        let (idx, mut r) = if c.r2ts.is_empty() {
            let r = R2t {
                cccid: c.next_cid.wrapping_sub(1),
                ttag: u16::from(spec.pick),
                sent: 0,
                end: 4096,
            };
            (None, r)
        } else {
            let i = usize::from(spec.pick) % c.r2ts.len();
            (Some(i), c.r2ts[i])
        };
        let max = c.maxh2cdata.max(1);
        let piece = match spec.size {
            Piece::Max | Piece::Max2 => max,
            Piece::Bytes(n) => (u32::from(n) % max).max(1),
        };
        let limit = if spec.pieces == 0 {
            usize::MAX
        } else {
            usize::from(spec.pieces)
        };
        let mut bytes = Vec::new();
        let mut first_end = None;
        let mut n = 0;
        let mut faulty = false;
        while r.sent < r.end && n < limit && bytes.len() < (4 << 20) {
            let mut len = piece.min(r.end - r.sent);
            let mut h = (r.cccid, r.ttag, r.sent);
            let mut last = r.sent + len == r.end;
            let mut datal_patch = None;
            if n == 0 {
                faulty = true;
                match spec.fault {
                    H2cFault::Ttag(t) => h.1 = t,
                    H2cFault::Cccid(v) => h.0 = v,
                    H2cFault::Datao(d) => h.2 = h.2.wrapping_add(d as i32 as u32),
                    H2cFault::Datal(d) => datal_patch = Some(len.wrapping_add(d as i32 as u32)),
                    H2cFault::FlipLast => last = !last,
                    H2cFault::OverMax => len = max.saturating_add(4),
                    H2cFault::Empty => len = 0,
                    _ => faulty = false,
                }
            }
            let start = bytes.len();
            let flags = if last { DATA_LAST } else { 0 };
            let at = encode_h2c_data_header(&mut bytes, &c.eo, h.0, h.1, h.2, len, flags);
            let payload = fill_at(h.2 as usize, len as usize, h.0);
            // What the write with this CID will hold, if it succeeds.
            if let Some(Track::Writes(ws)) = c.front(h.0) {
                for w in ws {
                    let fits = w
                        .data
                        .as_ref()
                        .is_some_and(|d| h.2 as usize + payload.len() <= d.len());
                    let clean = n > 0 || !faulty;
                    match (&mut w.data, clean && fits) {
                        (Some(d), true) => {
                            d[h.2 as usize..h.2 as usize + payload.len()].copy_from_slice(&payload)
                        }
                        _ => w.data = None,
                    }
                }
            }
            bytes.extend_from_slice(&payload);
            append_data_digest(&mut bytes, &c.eo, at);
            if let Some(dl) = datal_patch {
                patch(&mut bytes[start..], 16, &dl.to_le_bytes());
            }
            if n == 0 {
                first_end = Some(bytes.len());
            }
            r.sent += len.min(r.end - r.sent);
            n += 1;
        }
        let mangled = match first_end {
            Some(e) => mangle_pdu(&mut bytes[..e], mangle),
            None => false,
        };
        if let Some(i) = idx {
            if faulty || r.sent >= r.end {
                c.r2ts.remove(i);
            } else {
                c.r2ts[i] = r;
            }
        }
        if mangled {
            self.untrack(s);
        }
        self.emit(s, bytes, split, Mangle::None);
    }

    /// A corrupted PDU went to connection `s`: its CIDs are no longer
    /// followed, and the data model stops at once, before the answers to the
    /// corrupted command arrive (a flipped byte may turn a read of an unwritten
    /// block into a read of a written one: found by the fuzzer in CI).
    fn untrack(&mut self, s: usize) {
        self.conn(s).tracked = false;
        self.shadow.valid = false;
    }

    /// Queues `bytes` (one or more PDUs) for the target and delivers them.
    fn emit(&mut self, s: usize, mut bytes: Vec<u8>, split: Split, mangle: Mangle) {
        if mangle_pdu(&mut bytes, mangle) {
            self.untrack(s);
        }
        let c = self.conn(s);
        let hold = match split {
            Split::Hold(n) => usize::from(n) % (bytes.len() + 1),
            _ => 0,
        };
        c.pending.extend_from_slice(&bytes);
        self.deliver(s, hold);
    }

    /// The reactor's read side: feed pending bytes (all but the last
    /// `hold`) while the connection wants to read, then poll, then write.
    fn deliver(&mut self, s: usize, hold: usize) {
        let now = self.now();
        let c = self.conn(s);
        let goal = c.pending.len().saturating_sub(hold);
        let mut fed = 0;
        while fed < goal && !c.closed() && c.c.wants_read() {
            let buf = c.c.recv_buf();
            assert!(!buf.is_empty(), "recv_buf() offers no room");
            assert!(
                buf.len() <= RX_BOUND,
                "receive buffer grew to {} bytes",
                buf.len()
            );
            let n = buf.len().min(goal - fed).min(c.chunk);
            buf[..n].copy_from_slice(&c.pending[fed..fed + n]);
            c.c.on_recv(n);
            fed += n;
        }
        c.pending.drain(..fed);
        c.c.poll(now);
        if c.reading {
            self.drain(s, usize::MAX);
        }
        self.check(s);
    }

    /// The reactor's write side: up to `max` bytes of output, in writes of
    /// the connection's chunk size; the host parses what arrived. With
    /// zero-copy, calls of slot data only are made with `MSG_ZEROCOPY`
    /// (`output_split`): their bytes reach the host when the model's
    /// kernel reports them done (`Conn::zc_report`, interleaved with the
    /// writes, late and out of order), which may release slots and queue
    /// more output.
    fn drain(&mut self, s: usize, max: usize) {
        let mut admin_cntlid = None;
        // Writes in flight on the other connections (reads skip their blocks).
        let others: Vec<(u64, u32)> = self
            .conns
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != s)
            .filter_map(|(_, c)| c.as_ref())
            .flat_map(|c| c.writes().map(|w| (w.slba, w.count)))
            .collect();
        let rep = &mut self.report;
        let shadow = &mut self.shadow;
        {
            let c = self.conns[s].as_mut().expect("live connection");
            let mut got = 0;
            loop {
                let mut progress = false;
                if c.c.has_output() && got < max {
                    let n = c.write_call(max - got);
                    got += n;
                    progress = true;
                }
                progress |= c.zc_report(false);
                if !progress {
                    break;
                }
            }
            for r in c.parse() {
                match r {
                    Resp::Cqe {
                        cid,
                        ok,
                        dw0,
                        status,
                    } => {
                        c.done_cid(cid, "CapsuleResp");
                        match c.connects.remove(&cid) {
                            Some(0) if ok => {
                                admin_cntlid = Some(dw0 as u16);
                                rep.admin_connects += 1;
                                c.admin = true;
                            }
                            Some(_) if ok => {
                                rep.io_connects += 1;
                                c.admin = false;
                            }
                            Some(_) => {}
                            None => rep.completions += 1,
                        }
                        c.r2ts.retain(|r| r.cccid != cid);
                        c.finish(cid, ok, status, shadow, &others, rep);
                    }
                    Resp::C2H {
                        cccid,
                        success,
                        ddok,
                        datao,
                        data,
                    } => {
                        assert!(ddok, "C2HData with a wrong data digest");
                        rep.c2h += 1;
                        if let Some(Track::Read(r)) = c.front(cccid) {
                            let end = datao as usize + data.len();
                            if r.buf.len() < end {
                                r.buf.resize(end, 0);
                            }
                            r.buf[datao as usize..end].copy_from_slice(&data);
                        }
                        if success {
                            rep.completions += 1;
                            c.done_cid(cccid, "C2HData SUCCESS");
                            c.finish(cccid, true, 0, shadow, &others, rep);
                        } else {
                            assert!(
                                !c.tracked || c.outstanding.contains_key(&cccid),
                                "C2HData for CID {cccid} that is not outstanding"
                            );
                        }
                    }
                    Resp::R2t {
                        cccid,
                        ttag,
                        r2to,
                        r2tl,
                    } => {
                        assert!(
                            !c.tracked || c.outstanding.contains_key(&cccid),
                            "R2T for CID {cccid} that is not outstanding"
                        );
                        assert!(r2tl > 0, "R2T asking for no data");
                        rep.r2ts += 1;
                        c.r2ts.push(R2t {
                            cccid,
                            ttag,
                            sent: r2to,
                            end: r2to.saturating_add(r2tl),
                        });
                    }
                    Resp::IcResp { hdgst, ddgst, .. } => {
                        if hdgst || ddgst {
                            rep.digests += 1;
                        }
                    }
                    Resp::Term { .. } => rep.terms += 1,
                }
            }
        }
        if admin_cntlid.is_some() {
            self.admin_cntlid = admin_cntlid;
        }
    }

    /// Invariants of one connection at an action boundary.
    fn check(&mut self, s: usize) {
        let c = self.conns[s].as_mut().expect("live connection");
        if !c.tracked {
            // Raw or corrupted PDUs may have written anything.
            self.shadow.valid = false;
        }
        let queued = c.c.output_len();
        assert!(
            queued <= OUT_BOUND,
            "{queued} bytes of output queued (bound {OUT_BOUND})"
        );
        let total = c.produced + queued;
        match (c.c.close_reason(), c.closed_total) {
            (Some(_), None) => c.closed_total = Some(total),
            (Some(_), Some(t)) => assert_eq!(t, total, "output queued after the close"),
            (None, Some(_)) => panic!("a closed connection reopened"),
            (None, None) => {}
        }
        if c.term_seen {
            assert!(c.closed(), "C2HTermReq sent but the connection stays open");
        }
        if let Some(z) = c.zc.as_mut() {
            assert_eq!(c.c.zc_outstanding(), z.outstanding(), "zc_outstanding()");
            // Every call reported and the output written: nothing parked
            // (a slot finished by a copying call after its zero-copy call
            // was reported is released at once; fixed after this model
            // found it).
            if z.calls.is_empty() && !c.c.has_output() {
                assert_eq!(
                    c.c.zc_parked(),
                    0,
                    "slots parked with every zero-copy call reported and no output queued"
                );
            }
            // Every command the host sent was answered and its output
            // written and reported: no slot may still be held (a slot
            // leaked by the zero-copy bookkeeping shows here).
            if c.tracked
                && !c.mangled
                && c.c.close_reason().is_none()
                && c.pending.is_empty()
                && c.outstanding.is_empty()
                && z.calls.is_empty()
                && !c.c.has_output()
            {
                assert_eq!(
                    c.c.in_flight(),
                    0,
                    "slots held with every command answered and every zero-copy call reported"
                );
            }
        }
    }
}

fn slot(conn: u8) -> usize {
    usize::from(conn) % MAX_CONNS
}
