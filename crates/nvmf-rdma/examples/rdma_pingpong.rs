//! Two-sided check of nvmf-rdma over a real (or soft-RoCE) RDMA link, run between two testbed
//! guests by nvmf-interop's `tests/rdma_verbs.rs`:
//!
//! ```text
//! rdma_pingpong --server ADDR:PORT [--timeout S]
//! rdma_pingpong --client ADDR:PORT [--timeout S]
//! ```
//!
//! The client first connects with a wrong private data and expects the server's reject (with
//! the server's reject private data), then connects with the right one. The server takes its
//! receives from a shared receive queue (posted as one batch); the client from its QP. It exposes a source
//! buffer through its memory region's rkey and a destination buffer through a type 2 memory
//! window, and SENDs their addresses and keys. The server RDMA READs the source, RDMA WRITEs
//! the source with every byte XORed with 0x5a into the destination, then (in the same post)
//! SENDs "done" with invalidate of the window's rkey. The client checks the data, the
//! invalidated rkey and the private data of both sides. The server then checks the window is
//! really gone (an RDMA WRITE under its rkey fails with a remote access error) and
//! disconnects; both exit 0 after printing `PASS`. Every wait is bounded by `--timeout` (default 60 s) in all.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nvmf_rdma::{
    available, next_rkey, Access, AsyncEvent, CmEvent, CmEventKind, CmId, Completion,
    CompletionQueue, ConnParam, Device, EventChannel, MemoryRegion, MemoryWindow, ProtectionDomain,
    QpCaps, RecvWr, SendOp, SendWr, Sge, SharedReceiveQueue, WcOpcode,
};

const HELLO: &[u8] = b"nvmf-rdma pingpong v1";
const BAD_HELLO: &[u8] = b"not the right hello";
const ACCEPT: &[u8] = b"accept:nvmf-rdma";
const REJECT: &[u8] = b"reject:bad private data";
const DATA_LEN: usize = 4096;
const MSG_LEN: usize = 64;
const LISTENER: u64 = 1;
const CONN: u64 = 2;
/// `IBV_WC_WR_FLUSH_ERR`
const IBV_WC_WR_FLUSH_ERR: u32 = 5;
/// `IBV_WC_REM_ACCESS_ERR`
const IBV_WC_REM_ACCESS_ERR: u32 = 10;
/// Receives the server posts (in one batch).
const RECVS: usize = 4;

type Res<T> = Result<T, String>;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut role = None;
    let mut timeout = Duration::from_secs(60);
    let mut i = 0;
    while i < args.len() {
        match (args[i].as_str(), args.get(i + 1)) {
            ("--server", Some(a)) | ("--client", Some(a)) => {
                let addr: SocketAddr = match a.parse() {
                    Ok(x) => x,
                    Err(e) => return usage(&format!("bad address {a}: {e}")),
                };
                role = Some((args[i] == "--server", addr));
                i += 2;
            }
            ("--timeout", Some(s)) => {
                match s.parse::<u64>() {
                    Ok(n) if n > 0 => timeout = Duration::from_secs(n),
                    _ => return usage(&format!("bad --timeout {s}")),
                }
                i += 2;
            }
            (other, _) => return usage(&format!("unexpected argument {other}")),
        }
    }
    let Some((server, addr)) = role else {
        return usage("--server or --client is required");
    };
    if let Err(e) = available() {
        eprintln!("rdma_pingpong: {e}");
        return ExitCode::from(2);
    }
    let deadline = Instant::now() + timeout;
    let r = if server {
        run_server(addr, deadline)
    } else {
        run_client(addr, deadline)
    };
    match r {
        Ok(()) => {
            println!("PASS");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("rdma_pingpong: FAIL: {e}");
            ExitCode::FAILURE
        }
    }
}

fn usage(why: &str) -> ExitCode {
    eprintln!(
        "rdma_pingpong: {why}\nusage: rdma_pingpong --server|--client ADDR:PORT [--timeout S]"
    );
    ExitCode::from(2)
}

/// The next CM event (bounded by the deadline).
fn next_cm(ch: &EventChannel, deadline: Instant, what: &str) -> Res<CmEvent> {
    let ev = nvmf_rdma::client::wait_event(ch, deadline, what)?;
    println!(
        "cm event {:?} status {} token {} private data {} bytes",
        ev.kind,
        ev.status,
        ev.token,
        ev.private_data.len()
    );
    Ok(ev)
}

/// Waits for the CM event `kind` on `token`; any other event is an error.
fn expect_cm(ch: &EventChannel, deadline: Instant, kind: CmEventKind, token: u64) -> Res<CmEvent> {
    let ev = next_cm(ch, deadline, &format!("{kind:?}"))?;
    if ev.kind != kind || ev.token != token {
        return Err(format!(
            "expected {kind:?} on {token}, got {:?} (status {}) on {}",
            ev.kind, ev.status, ev.token
        ));
    }
    Ok(ev)
}

/// The next successful completion.
fn next_wc(cq: &CompletionQueue, deadline: Instant, what: &str) -> Res<Completion> {
    let c = next_wc_any(cq, deadline, what)?;
    if !c.is_ok() {
        return Err(format!(
            "{what}: work request {} failed: {} (vendor error {})",
            c.wr_id(),
            c.status_str(),
            c.vendor_err()
        ));
    }
    Ok(c)
}

/// The next completion, failed or not: poll, arm, poll again, sleep on the channel fd (the
/// reactor pattern).
fn next_wc_any(cq: &CompletionQueue, deadline: Instant, what: &str) -> Res<Completion> {
    let mut wc = [Completion::default(); 1];
    loop {
        if cq.poll(&mut wc).map_err(|e| e.to_string())? == 1 {
            break;
        }
        cq.arm().map_err(|e| e.to_string())?;
        if cq.poll(&mut wc).map_err(|e| e.to_string())? == 1 {
            break;
        }
        nvmf_rdma::client::wait_readable(cq.fd(), deadline, what)?;
        cq.drain_events().map_err(|e| e.to_string())?;
    }
    let c = wc[0];
    println!("completion {c:?}");
    Ok(c)
}

/// The device's pending asynchronous events (QP errors and the like), bounded.
fn drain_async(dev: &Device) -> Res<Vec<AsyncEvent>> {
    dev.async_fd().map_err(|e| e.to_string())?;
    let mut v = Vec::new();
    while v.len() < 64 {
        match dev.next_async_event().map_err(|e| e.to_string())? {
            Some(ev) => v.push(ev),
            None => break,
        }
    }
    println!("async events: {v:?}");
    Ok(v)
}

/// A page-aligned, zeroed, registered buffer; the memory outlives the registration (the
/// region is dropped first).
struct Buf {
    mr: Option<MemoryRegion>,
    mem: *mut u8,
    len: usize,
}

impl Buf {
    fn new(pd: &Arc<ProtectionDomain>, len: usize, access: Access) -> Res<Buf> {
        let layout = std::alloc::Layout::from_size_align(len, 4096).map_err(|e| e.to_string())?;
        // SAFETY: non-zero size.
        let mem = unsafe { std::alloc::alloc_zeroed(layout) };
        if mem.is_null() {
            return Err("out of memory".into());
        }
        // SAFETY: `mem` stays allocated until Drop, after the region is deregistered.
        let mr = unsafe { MemoryRegion::new(pd, mem, len, access) }.map_err(|e| {
            // SAFETY: allocated above with `layout`.
            unsafe { std::alloc::dealloc(mem, layout) };
            e.to_string()
        })?;
        Ok(Buf {
            mr: Some(mr),
            mem,
            len,
        })
    }
    fn mr(&self) -> &MemoryRegion {
        self.mr.as_ref().expect("registered")
    }
    fn bytes(&self, off: usize, len: usize) -> &[u8] {
        assert!(off + len <= self.len);
        // SAFETY: in bounds; the device is not writing here while we look (completion seen).
        unsafe { std::slice::from_raw_parts(self.mem.add(off), len) }
    }
    fn bytes_mut(&mut self, off: usize, len: usize) -> &mut [u8] {
        assert!(off + len <= self.len);
        // SAFETY: as above.
        unsafe { std::slice::from_raw_parts_mut(self.mem.add(off), len) }
    }
    fn sge(&self, off: usize, len: usize) -> Sge {
        self.mr().sge(off, len as u32)
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        self.mr = None;
        let layout = std::alloc::Layout::from_size_align(self.len, 4096).expect("layout");
        // SAFETY: allocated in new with this layout; no registration left.
        unsafe { std::alloc::dealloc(self.mem, layout) };
    }
}

/// The client's request: where the source and destination are.
struct Request {
    seed: u32,
    src_addr: u64,
    src_rkey: u32,
    dst_addr: u64,
    dst_rkey: u32,
    len: u32,
}

impl Request {
    fn encode(&self, out: &mut [u8]) {
        out[..4].copy_from_slice(b"PING");
        out[4..8].copy_from_slice(&self.seed.to_le_bytes());
        out[8..16].copy_from_slice(&self.src_addr.to_le_bytes());
        out[16..20].copy_from_slice(&self.src_rkey.to_le_bytes());
        out[20..28].copy_from_slice(&self.dst_addr.to_le_bytes());
        out[28..32].copy_from_slice(&self.dst_rkey.to_le_bytes());
        out[32..36].copy_from_slice(&self.len.to_le_bytes());
    }
    fn decode(b: &[u8]) -> Res<Request> {
        if b.len() < 36 || &b[..4] != b"PING" {
            return Err(format!(
                "bad request message {:02x?}",
                &b[..b.len().min(36)]
            ));
        }
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
        Ok(Request {
            seed: u32_at(4),
            src_addr: u64_at(8),
            src_rkey: u32_at(16),
            dst_addr: u64_at(20),
            dst_rkey: u32_at(28),
            len: u32_at(32),
        })
    }
}

fn pattern(seed: u32, i: usize) -> u8 {
    (seed as usize)
        .wrapping_mul(31)
        .wrapping_add(i.wrapping_mul(7)) as u8
}

fn caps() -> QpCaps {
    QpCaps {
        send_depth: 16,
        recv_depth: 16,
        send_sge: 1,
        recv_sge: 1,
        max_inline: 64,
    }
}

fn run_server(addr: SocketAddr, deadline: Instant) -> Res<()> {
    let ch = EventChannel::new().map_err(|e| e.to_string())?;
    let listener = ch.create_id(LISTENER).map_err(|e| e.to_string())?;
    listener.listen(addr, 4).map_err(|e| e.to_string())?;
    let port = listener.local_port().map_err(|e| e.to_string())?;
    if addr.port() != 0 && port != addr.port() {
        return Err(format!(
            "listening on port {port}, asked for {}",
            addr.port()
        ));
    }
    println!("listening on {} port {port}", addr.ip());
    let mut rejected = 0;
    // one bad request (rejected), then the good one; bounded
    let mut conn = loop {
        let ev = next_cm(&ch, deadline, "a connection request")?;
        if ev.kind != CmEventKind::ConnectRequest || ev.token != LISTENER {
            return Err(format!(
                "expected ConnectRequest on the listener, got {ev:?}"
            ));
        }
        let req = ev.request.expect("ConnectRequest carries its id");
        println!(
            "connect request: private data {:?}, responder resources {}, initiator depth {}",
            String::from_utf8_lossy(&ev.private_data),
            ev.responder_resources,
            ev.initiator_depth
        );
        if !ev.private_data.starts_with(HELLO) {
            req.reject(REJECT).map_err(|e| e.to_string())?;
            rejected += 1;
            println!("rejected a request with a wrong private data");
            if rejected > 3 {
                return Err("more than 3 bad connection requests".into());
            }
            continue;
        }
        break (req, ev.responder_resources, ev.initiator_depth);
    };
    if rejected != 1 {
        return Err(format!(
            "expected 1 rejected request before the good one, saw {rejected}"
        ));
    }
    let (ref mut id, rr, idepth) = conn;
    id.set_token(CONN);
    if listener.device().is_some() && addr.ip().is_unspecified() {
        return Err("a wildcard listener is bound to a device".into());
    }
    let peer = id.peer_addr().ok_or("the connection has no peer address")?;
    let local = id
        .local_addr()
        .ok_or("the connection has no local address")?;
    println!(
        "connection from peer {} port {} to {} port {}",
        peer.ip().to_canonical(),
        peer.port(),
        local.ip().to_canonical(),
        local.port()
    );
    let dev = id.device().ok_or("the connection has no device")?;
    let limits = dev.limits().map_err(|e| e.to_string())?;
    println!("device limits {limits:?}");
    if limits.max_qp_rd_atom == 0 || limits.max_qp_wr < caps().send_depth {
        return Err(format!("implausible device limits {limits:?}"));
    }
    // grant at most what the device can serve (the NVMe/RDMA target's READ depth bound)
    let max_rd = limits.max_qp_rd_atom.min(255) as u8;
    let max_init = limits.max_qp_init_rd_atom.min(255) as u8;
    let pd = ProtectionDomain::new(dev).map_err(|e| e.to_string())?;
    let cq = CompletionQueue::new(dev, 64).map_err(|e| e.to_string())?;
    // the server takes its receives from a shared receive queue
    let srq = SharedReceiveQueue::new(&pd, 16).map_err(|e| e.to_string())?;
    let got = id
        .create_qp_with(&pd, &cq, &cq, Some(&srq), caps())
        .map_err(|e| e.to_string())?;
    println!(
        "qp {} caps {got:?}, srq depth {}",
        id.qp_num().unwrap_or(0),
        srq.depth()
    );
    // RECVS receive slots of MSG_LEN, the reply, then the data (read into, transformed in
    // place); the receives go in as one batch (the first one takes the client's request, the
    // others are flushed when the connection ends)
    let (reply, data) = (RECVS * MSG_LEN, (RECVS + 1) * MSG_LEN);
    let mut buf = Buf::new(&pd, data + DATA_LEN, Access::LOCAL_WRITE)?;
    let recvs: Vec<RecvWr> = (0..RECVS)
        .map(|i| RecvWr {
            wr_id: 10 + i as u64,
            sge: buf.sge(i * MSG_LEN, MSG_LEN),
        })
        .collect();
    match id.post_recv(&recvs[..1]) {
        Err(e) if e.to_string().contains("shared receive queue") => {}
        other => return Err(format!("a receive posted to a QP on an SRQ: {other:?}")),
    }
    srq.post_recv(&recvs).map_err(|e| e.to_string())?;
    id.accept(&ConnParam {
        private_data: ACCEPT,
        responder_resources: rr.min(max_rd),
        initiator_depth: idepth.min(max_init),
        ..ConnParam::default()
    })
    .map_err(|e| e.to_string())?;
    expect_cm(&ch, deadline, CmEventKind::Established, CONN)?;

    let c = next_wc(&cq, deadline, "the client's request")?;
    if c.wr_id() != 10 || c.opcode() != WcOpcode::Recv {
        return Err(format!("expected the receive (wr 10), got {c:?}"));
    }
    let req = Request::decode(buf.bytes(0, c.byte_len() as usize))?;
    if req.len as usize != DATA_LEN {
        return Err(format!(
            "request for {} bytes, expected {DATA_LEN}",
            req.len
        ));
    }
    id.post_send(&[SendWr {
        wr_id: 20,
        op: SendOp::RdmaRead {
            remote_addr: req.src_addr,
            rkey: req.src_rkey,
        },
        local: &[buf.sge(data, DATA_LEN)],
        signaled: true,
        inline: false,
    }])
    .map_err(|e| e.to_string())?;
    let c = next_wc(&cq, deadline, "the RDMA READ")?;
    if c.wr_id() != 20 || c.opcode() != WcOpcode::RdmaRead || c.byte_len() as usize != DATA_LEN {
        return Err(format!(
            "expected the RDMA READ of {DATA_LEN} bytes (wr 20), got {c:?}"
        ));
    }
    for (i, b) in buf.bytes_mut(data, DATA_LEN).iter_mut().enumerate() {
        if *b != pattern(req.seed, i) {
            return Err(format!(
                "RDMA READ: byte {i} is {b:#x}, the client wrote {:#x}",
                pattern(req.seed, i)
            ));
        }
        *b ^= 0x5a;
    }
    buf.bytes_mut(reply, 4).copy_from_slice(b"done");
    // WRITE (unsignaled) and SEND with invalidate (signaled) in one post: one doorbell; the
    // SEND completes after the WRITE (ordering on an RC QP)
    let write_sge = [buf.sge(data, DATA_LEN)];
    let send_sge = [buf.sge(reply, 4)];
    id.post_send(&[
        SendWr {
            wr_id: 30,
            op: SendOp::RdmaWrite {
                remote_addr: req.dst_addr,
                rkey: req.dst_rkey,
            },
            local: &write_sge,
            signaled: false,
            inline: false,
        },
        SendWr {
            wr_id: 31,
            op: SendOp::SendWithInvalidate { rkey: req.dst_rkey },
            local: &send_sge,
            signaled: true,
            inline: true,
        },
    ])
    .map_err(|e| e.to_string())?;
    let c = next_wc(&cq, deadline, "the SEND with invalidate")?;
    if c.wr_id() != 31 || c.opcode() != WcOpcode::Send {
        return Err(format!("expected the SEND (wr 31), got {c:?}"));
    }
    // the window is invalidated now: a WRITE under its rkey must fail at the client
    id.post_send(&[SendWr {
        wr_id: 32,
        op: SendOp::RdmaWrite {
            remote_addr: req.dst_addr,
            rkey: req.dst_rkey,
        },
        local: &[buf.sge(data, 16)],
        signaled: true,
        inline: false,
    }])
    .map_err(|e| e.to_string())?;
    // the QP goes to the error state: the other receives are flushed around this completion
    let mut c = next_wc_any(&cq, deadline, "the WRITE under the invalidated rkey")?;
    for _ in 0..RECVS {
        if c.wr_id() == 32 {
            break;
        }
        if !(11..10 + RECVS as u64).contains(&c.wr_id()) || c.status() != IBV_WC_WR_FLUSH_ERR {
            return Err(format!(
                "expected the WRITE (wr 32) or flushed receives, got {c:?}"
            ));
        }
        c = next_wc_any(&cq, deadline, "the WRITE under the invalidated rkey")?;
    }
    if c.wr_id() != 32 || c.status() != IBV_WC_REM_ACCESS_ERR {
        return Err(format!(
            "a WRITE under the invalidated rkey {:#x} ended with {} ({c:?}), expected a remote \
             access error",
            req.dst_rkey,
            c.status_str()
        ));
    }
    println!(
        "a WRITE under the invalidated rkey {:#x} failed as it must: {}",
        req.dst_rkey,
        c.status_str()
    );
    drain_async(&dev)?;
    id.disconnect().map_err(|e| e.to_string())?;
    expect_cm(&ch, deadline, CmEventKind::Disconnected, CONN)?;
    println!("served: read {DATA_LEN} bytes, wrote them back transformed, sent with invalidate of rkey {:#x}", req.dst_rkey);
    drop(conn);
    Ok(())
}

fn run_client(addr: SocketAddr, deadline: Instant) -> Res<()> {
    let ch = EventChannel::new().map_err(|e| e.to_string())?;
    // 1. a wrong private data: the server must reject it, with its reason
    {
        let mut id = ch.create_id(CONN).map_err(|e| e.to_string())?;
        let (pd, cq) = resolve(&ch, &id, addr, deadline)?;
        id.create_qp(&pd, &cq, &cq, caps())
            .map_err(|e| e.to_string())?;
        id.connect(&ConnParam {
            private_data: BAD_HELLO,
            ..ConnParam::default()
        })
        .map_err(|e| e.to_string())?;
        let ev = next_cm(&ch, deadline, "the reject")?;
        if ev.kind != CmEventKind::Rejected {
            return Err(format!("a wrong private data was not rejected: {ev:?}"));
        }
        if !ev.private_data.starts_with(REJECT) {
            return Err(format!(
                "reject private data {:?}, expected {:?}",
                String::from_utf8_lossy(&ev.private_data),
                String::from_utf8_lossy(REJECT)
            ));
        }
        println!(
            "rejected as expected (status {}): {:?}",
            ev.status,
            String::from_utf8_lossy(REJECT)
        );
    }
    // 2. the right one
    let mut id = ch.create_id(CONN).map_err(|e| e.to_string())?;
    let (pd, cq) = resolve(&ch, &id, addr, deadline)?;
    let got = id
        .create_qp(&pd, &cq, &cq, caps())
        .map_err(|e| e.to_string())?;
    println!("qp {} caps {got:?}", id.qp_num().unwrap_or(0));
    // [0, MSG) request, [MSG, 2 MSG) reply receive, [2 MSG, +DATA) source, then destination
    let (src, dst) = (2 * MSG_LEN, 2 * MSG_LEN + DATA_LEN);
    let mut buf = Buf::new(
        &pd,
        2 * MSG_LEN + 2 * DATA_LEN,
        Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE | Access::MW_BIND,
    )?;
    let seed = std::process::id() ^ 0x9e37_79b9;
    for (i, b) in buf.bytes_mut(src, DATA_LEN).iter_mut().enumerate() {
        *b = pattern(seed, i);
    }
    id.post_recv(&[RecvWr {
        wr_id: 10,
        sge: buf.sge(MSG_LEN, MSG_LEN),
    }])
    .map_err(|e| e.to_string())?;
    id.connect(&ConnParam {
        private_data: HELLO,
        responder_resources: 4,
        initiator_depth: 4,
        ..ConnParam::default()
    })
    .map_err(|e| e.to_string())?;
    let ev = expect_cm(&ch, deadline, CmEventKind::Established, CONN)?;
    if !ev.private_data.starts_with(ACCEPT) {
        return Err(format!(
            "accept private data {:?}, expected {:?}",
            String::from_utf8_lossy(&ev.private_data),
            String::from_utf8_lossy(ACCEPT)
        ));
    }
    // the destination goes out through a memory window the server will invalidate
    let mw = MemoryWindow::new(&pd).map_err(|e| e.to_string())?;
    let mw_rkey = next_rkey(mw.rkey());
    id.post_send(&[SendWr {
        wr_id: 40,
        op: SendOp::BindMw {
            mw: &mw,
            mr: buf.mr(),
            rkey: mw_rkey,
            addr: buf.mr().addr() + dst as u64,
            len: DATA_LEN as u64,
            access: Access::REMOTE_WRITE,
        },
        local: &[],
        signaled: true,
        inline: false,
    }])
    .map_err(|e| e.to_string())?;
    let c = next_wc(&cq, deadline, "the memory window bind")?;
    if c.wr_id() != 40 || c.opcode() != WcOpcode::BindMw {
        return Err(format!("expected the bind (wr 40), got {c:?}"));
    }
    Request {
        seed,
        src_addr: buf.mr().addr() + src as u64,
        src_rkey: buf.mr().rkey(),
        dst_addr: buf.mr().addr() + dst as u64,
        dst_rkey: mw_rkey,
        len: DATA_LEN as u32,
    }
    .encode(buf.bytes_mut(0, MSG_LEN));
    id.post_send(&[SendWr {
        wr_id: 50,
        op: SendOp::Send,
        local: &[buf.sge(0, 36)],
        signaled: true,
        inline: false,
    }])
    .map_err(|e| e.to_string())?;
    let mut got_send = false;
    let mut reply = None;
    for _ in 0..2 {
        let c = next_wc(&cq, deadline, "the request's SEND and the reply")?;
        match (c.wr_id(), c.opcode()) {
            (50, WcOpcode::Send) => got_send = true,
            (10, WcOpcode::Recv) => reply = Some(c),
            _ => return Err(format!("unexpected completion {c:?}")),
        }
    }
    let reply = reply.ok_or("no reply")?;
    if !got_send {
        return Err("no completion for the request's SEND".into());
    }
    if buf.bytes(MSG_LEN, reply.byte_len() as usize) != b"done" {
        return Err(format!(
            "reply {:?}",
            buf.bytes(MSG_LEN, reply.byte_len() as usize)
        ));
    }
    if reply.invalidated_rkey() != Some(mw_rkey) {
        return Err(format!(
            "the reply invalidated {:?}, expected the window's rkey {mw_rkey:#x}",
            reply.invalidated_rkey()
        ));
    }
    for (i, b) in buf.bytes(dst, DATA_LEN).iter().enumerate() {
        if *b != pattern(seed, i) ^ 0x5a {
            return Err(format!(
                "RDMA WRITE: byte {i} is {b:#x}, expected {:#x}",
                pattern(seed, i) ^ 0x5a
            ));
        }
    }
    println!("checked: {DATA_LEN} bytes read and written back, rkey {mw_rkey:#x} invalidated by the server's SEND");
    // the server probes the invalidated window, then disconnects
    expect_cm(&ch, deadline, CmEventKind::Disconnected, CONN)?;
    drain_async(&id.device().ok_or("the connection has no device")?)?;
    drop(mw);
    drop(id);
    drop(buf);
    Ok(())
}

/// Address and route resolution (event-driven; the first ARP over a fresh link may time out,
/// so up to 5 tries), then the connection's PD and CQ.
fn resolve(
    ch: &EventChannel,
    id: &CmId,
    addr: SocketAddr,
    deadline: Instant,
) -> Res<(Arc<ProtectionDomain>, Arc<CompletionQueue>)> {
    let dev = nvmf_rdma::client::resolve(ch, id, addr, deadline)?;
    let pd = ProtectionDomain::new(dev).map_err(|e| e.to_string())?;
    let cq = CompletionQueue::new(dev, 64).map_err(|e| e.to_string())?;
    Ok((pd, cq))
}
