//! rdma.rs — `RdmaLink`: the NVMe/RDMA side of one host queue (issue 13), used by
//! `IoQueue` in place of the TCP socket. It owns the rdma_cm connection (event channel,
//! id and RC queue pair), the completion queue with its channel fd, the one memory region
//! over the queue's slot data buffers (registered once, reachable by the target with
//! RDMA READ / WRITE through Keyed SGLs), and a small control area of its own: one 64-byte
//! command capsule per slot (SEND source) and one 16-byte completion buffer per queue entry
//! (RECV targets, posted before the connect and reposted after each response).
//!
//! Per command: one SEND (the SQE, plus the slot's data as a second gather entry for an
//! in-capsule write), signaled. A slot completes when both its response RECV and its SEND
//! completion have been seen, in either order (`Slots::complete` in queue.rs does the
//! shared bookkeeping). Nothing is allocated per command.

use std::net::{SocketAddr, ToSocketAddrs};
use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nvmf_rdma::{
    Access, CmEventKind, CmId, Completion, CompletionQueue, ConnParam, EventChannel, MemoryRegion,
    ProtectionDomain, QpCaps, RecvWr, SendOp, SendWr, WcOpcode,
};
use nvmf_wire::rdma::{KeyedSgl, RdmaCmAccept, RdmaCmReject, RdmaCmRequest, RdmaCmStatus};
use nvmf_wire::zerocopy::{FromBytes, IntoBytes};
use nvmf_wire::{Command, DataDirection, SglDescriptor, Status};

use crate::error::{Error, Result};
use crate::queue::Slots;

/// Size of a command capsule's SQE.
const SQE: usize = 64;
/// Size of a response capsule (the CQE).
const CQE: usize = 16;
/// RECV work requests carry this bit in their id; SENDs carry the slot index.
const RECV_TAG: u64 = 1 << 32;
/// Completions taken from the CQ per poll call.
const WC_BATCH: usize = 32;
/// The event channel token of the queue's id.
const TOKEN: u64 = 1;

/// How to open the RDMA side of a queue.
pub(crate) struct LinkParams<'a> {
    /// "host:port" (IPv6 in brackets).
    pub addr: &'a str,
    pub qid: u16,
    /// Queue entries (HRQSIZE; HSQSIZE = entries - 1).
    pub entries: u16,
    /// CNTLID for the private data (I/O queues).
    pub cntlid: u16,
    pub timeout: Duration,
}

/// One NVMe/RDMA connection of a host queue (see the top of the file).
pub(crate) struct RdmaLink {
    // Field order is drop order: the QP (in `id`) goes before the regions, the regions
    // before the memory under them.
    id: CmId,
    data_mr: MemoryRegion,
    ctl_mr: MemoryRegion,
    ctl: CtlMem,
    cq: Arc<CompletionQueue>,
    _pd: Arc<ProtectionDomain>,
    ch: EventChannel,
    peer: String,
    buf_size: usize,
    /// Per slot: its SEND completed.
    sent: Box<[bool]>,
    /// Per slot: its response arrived before the SEND completion.
    resp: Box<[Option<(Status, u32, u32)>]>,
    wc: Box<[Completion]>,
    /// Receives to post again after a drain (capacity = entries, reused).
    reposts: Vec<RecvWr>,
    nrecv: usize,
    /// The CQ is armed: the channel fd becomes readable at the next completion.
    armed: bool,
    /// Why the connection is unusable, once it is.
    dead: Option<String>,
    crqsize: u16,
}

// SAFETY: the raw pointers (control memory) belong to this link alone; the rdma-core objects
// may be used from any thread, one at a time (IoQueue is not shared without a lock).
unsafe impl Send for RdmaLink {}

/// The control area: `slots` SQEs then `entries` CQE buffers.
struct CtlMem {
    ptr: *mut u8,
    len: usize,
}

impl CtlMem {
    fn new(len: usize) -> CtlMem {
        let b = vec![0u8; len].into_boxed_slice();
        CtlMem {
            ptr: Box::into_raw(b) as *mut u8,
            len,
        }
    }
}

impl Drop for CtlMem {
    fn drop(&mut self) {
        // SAFETY: came from Box::into_raw of a boxed slice of `len` bytes; the region over
        // it is deregistered (dropped before this field).
        unsafe {
            drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                self.ptr, self.len,
            )))
        };
    }
}

fn rdma_err(peer: &str, what: &str, e: impl std::fmt::Display) -> Error {
    Error::Rdma(format!("{peer}: {what}: {e}"))
}

/// The socket address of "host:port".
fn resolve_addr(addr: &str) -> Result<SocketAddr> {
    addr.to_socket_addrs()
        .map_err(|e| Error::InvalidArg(format!("address {addr}: {e}")))?
        .next()
        .ok_or_else(|| Error::InvalidArg(format!("address {addr} resolves to nothing")))
}

impl RdmaLink {
    /// Connects to the target: address/route resolution, QP, regions, receives posted,
    /// rdma_cm connect with the NVMe/RDMA private data, up to Established — all within
    /// `p.timeout`. `s` holds the slot buffers to register.
    pub(crate) fn connect(p: &LinkParams<'_>, s: &Slots) -> Result<RdmaLink> {
        nvmf_rdma::available().map_err(Error::Rdma)?;
        let deadline = Instant::now() + p.timeout;
        let peer = p.addr.to_string();
        let addr = resolve_addr(p.addr)?;
        let ch = EventChannel::new().map_err(|e| rdma_err(&peer, "event channel", e))?;
        let mut id = ch
            .create_id(TOKEN)
            .map_err(|e| rdma_err(&peer, "rdma_create_id", e))?;
        let dev = nvmf_rdma::client::resolve(&ch, &id, addr, deadline).map_err(|e| {
            if e.starts_with("timed out") {
                Error::Timeout(format!("{peer}: {e}"))
            } else {
                Error::Rdma(format!("{peer}: {e}"))
            }
        })?;
        let limits = dev
            .limits()
            .map_err(|e| rdma_err(&peer, "device limits", e))?;
        let nslots = s.nslots();
        let nrecv = p.entries as usize;
        let pd = ProtectionDomain::new(dev).map_err(|e| rdma_err(&peer, "protection domain", e))?;
        let cq = CompletionQueue::new(dev, (nslots + nrecv + 8) as u32)
            .map_err(|e| rdma_err(&peer, "completion queue", e))?;
        id.create_qp(
            &pd,
            &cq,
            &cq,
            QpCaps {
                send_depth: nslots as u32 + 2,
                recv_depth: nrecv as u32,
                send_sge: 2,
                recv_sge: 1,
                max_inline: 0,
            },
        )
        .map_err(|e| rdma_err(&peer, "queue pair", e))?;
        let (bufs, bufs_len) = s.region();
        // SAFETY: the slot buffers outlive this link (IoQueue drops its link before its
        // slots) and are only deregistered, never freed, while the region exists.
        let data_mr = unsafe {
            MemoryRegion::new(
                &pd,
                bufs,
                bufs_len,
                Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE,
            )
        }
        .map_err(|e| rdma_err(&peer, "registering the data buffers", e))?;
        let ctl = CtlMem::new(nslots * SQE + nrecv * CQE);
        // SAFETY: `ctl` is dropped after the region (field order).
        let ctl_mr = unsafe { MemoryRegion::new(&pd, ctl.ptr, ctl.len, Access::LOCAL_WRITE) }
            .map_err(|e| rdma_err(&peer, "registering the capsule buffers", e))?;
        let mut link = RdmaLink {
            id,
            data_mr,
            ctl_mr,
            ctl,
            cq,
            _pd: pd,
            ch,
            peer,
            buf_size: s.buf_size(),
            sent: vec![false; nslots].into_boxed_slice(),
            resp: vec![None; nslots].into_boxed_slice(),
            wc: vec![Completion::default(); WC_BATCH].into_boxed_slice(),
            reposts: Vec::with_capacity(nrecv),
            nrecv,
            armed: false,
            dead: None,
            crqsize: 0,
        };
        for k in 0..nrecv {
            let wr = link.recv_wr(k);
            link.reposts.push(wr);
        }
        link.post_reposts()?;

        let req = RdmaCmRequest {
            recfmt: 0.into(),
            qid: p.qid.into(),
            hrqsize: p.entries.into(),
            hsqsize: (p.entries - 1).into(),
            cntlid: if p.qid == 0 { 0 } else { p.cntlid }.into(),
            rsvd10: [0; 22],
        };
        link.id
            .connect(&ConnParam {
                private_data: req.as_bytes(),
                responder_resources: limits.max_qp_rd_atom.min(16) as u8,
                initiator_depth: limits.max_qp_init_rd_atom.min(16) as u8,
                retry_count: 7,
                rnr_retry_count: 7,
            })
            .map_err(|e| rdma_err(&link.peer, "rdma_connect", e))?;
        let ev =
            nvmf_rdma::client::wait_event(&link.ch, deadline, "the connection").map_err(|e| {
                Error::Timeout(format!(
                    "{}: no answer to the RDMA connect (queue {}): {e}",
                    link.peer, p.qid
                ))
            })?;
        match ev.kind {
            CmEventKind::Established => {
                if let Ok((a, _)) = RdmaCmAccept::read_from_prefix(&ev.private_data) {
                    link.crqsize = a.crqsize.get();
                }
                if link.crqsize != 0 && (link.crqsize as usize) < nslots {
                    return Err(Error::Rdma(format!(
                        "{}: the controller accepted queue {} with {} receive entries, fewer \
                         than the {nslots} commands this queue may have outstanding",
                        link.peer, p.qid, link.crqsize
                    )));
                }
                Ok(link)
            }
            CmEventKind::Rejected => Err(Error::Rdma(format!(
                "{}: the controller rejected the RDMA connection of queue {}: {}",
                link.peer,
                p.qid,
                describe_reject(&ev.private_data, ev.status)
            ))),
            other => Err(Error::Rdma(format!(
                "{}: RDMA connect of queue {}: {other:?} (status {})",
                link.peer, p.qid, ev.status
            ))),
        }
    }

    fn recv_wr(&self, k: usize) -> RecvWr {
        let off = self.ctl_off_cqe(k);
        RecvWr {
            wr_id: RECV_TAG | k as u64,
            sge: self.ctl_mr.sge(off, CQE as u32),
        }
    }

    fn ctl_off_cqe(&self, k: usize) -> usize {
        self.sent.len() * SQE + k * CQE
    }

    fn post_reposts(&mut self) -> Result<()> {
        if self.reposts.is_empty() {
            return Ok(());
        }
        let r = self.id.post_recv(&self.reposts);
        self.reposts.clear();
        r.map_err(|e| self.fail(format!("posting receives: {e}")))
    }

    /// Marks the link dead and returns the error for it.
    fn fail(&mut self, why: String) -> Error {
        let e = format!(" ({}): {why}", self.peer);
        self.dead.get_or_insert(e.clone());
        Error::Closed(e)
    }

    /// Sends command `cmd` of slot `i` (`dir`/`len` its data; writes up to `in_capsule`
    /// bytes travel in the capsule, other data through a Keyed SGL of the slot buffer).
    pub(crate) fn submit(
        &mut self,
        s: &Slots,
        i: usize,
        cmd: &mut Command,
        dir: DataDirection,
        len: u32,
        in_capsule: u32,
    ) -> Result<()> {
        if let Some(d) = &self.dead {
            return Err(Error::Closed(d.clone()));
        }
        let inline = dir == DataDirection::HostToController && len > 0 && len <= in_capsule;
        let slot_off = i * self.buf_size;
        if inline {
            cmd.set_sgl(SglDescriptor::in_capsule(0, len));
        } else {
            let (address, length) = if len == 0 {
                (0, 0)
            } else {
                (self.data_mr.addr() + slot_off as u64, len)
            };
            let key = if len == 0 { 0 } else { self.data_mr.rkey() };
            let sgl = KeyedSgl {
                address,
                length,
                key,
                invalidate: false,
            }
            .encode()
            .map_err(|e| Error::InvalidArg(format!("transfer of {len} bytes: {e}")))?;
            cmd.set_sgl(sgl);
        }
        let off = i * SQE;
        // SAFETY: slot i's SQE lies inside the control area; the device reads it only
        // while this slot is in flight (its SEND not completed).
        unsafe {
            std::ptr::copy_nonoverlapping(cmd.as_bytes().as_ptr(), self.ctl.ptr.add(off), SQE)
        };
        debug_assert!(slot_off + len as usize <= s.region().1);
        let sges = [
            self.ctl_mr.sge(off, SQE as u32),
            self.data_mr.sge(slot_off, len),
        ];
        self.sent[i] = false;
        self.resp[i] = None;
        let n = if inline { 2 } else { 1 };
        let r = self.id.post_send(&[SendWr {
            wr_id: i as u64,
            op: SendOp::Send,
            local: &sges[..n],
            signaled: true,
            inline: false,
        }]);
        r.map_err(|e| self.fail(format!("posting a command: {e}")))
    }

    /// Takes every completion the CQ holds, completing slots in `s`; reposts the receives
    /// used. (CM events are read only when their fd wakes `wait`: a disconnect also flushes
    /// the posted receives, which ends the link here.)
    pub(crate) fn progress(&mut self, s: &mut Slots) -> Result<()> {
        if self.armed
            && self
                .cq
                .drain_events()
                .map_err(|e| self.fail(e.to_string()))?
                > 0
        {
            self.armed = false;
        }
        let mut res = Ok(());
        for _ in 0..64 {
            let n = match self.cq.poll(&mut self.wc) {
                Ok(n) => n,
                Err(e) => {
                    res = Err(self.fail(format!("polling completions: {e}")));
                    break;
                }
            };
            for k in 0..n {
                let c = self.wc[k];
                if let Err(e) = self.on_completion(s, &c) {
                    if res.is_ok() {
                        res = Err(e);
                    }
                }
            }
            if n < self.wc.len() {
                break;
            }
        }
        if self.dead.is_none() {
            self.post_reposts()?;
        } else {
            self.reposts.clear();
        }
        res?;
        if let Some(d) = &self.dead {
            // hand out what completed before the end; the next poll fails
            if s.done_len() == 0 {
                return Err(Error::Closed(d.clone()));
            }
        }
        Ok(())
    }

    fn on_completion(&mut self, s: &mut Slots, c: &Completion) -> Result<()> {
        let wr = c.wr_id();
        if !c.is_ok() {
            let what = if wr & RECV_TAG != 0 {
                "a receive".to_string()
            } else {
                format!("the command of slot {wr}")
            };
            let e = self.fail(format!(
                "RDMA work request for {what} failed: {} (vendor error {})",
                c.status_str(),
                c.vendor_err()
            ));
            return Err(e);
        }
        if wr & RECV_TAG != 0 {
            let k = (wr & 0xffff_ffff) as usize;
            if k >= self.nrecv || c.opcode() != WcOpcode::Recv {
                return Err(Error::Protocol(format!(
                    "unexpected receive completion {c:?}"
                )));
            }
            let wr = self.recv_wr(k);
            self.reposts.push(wr);
            if (c.byte_len() as usize) < CQE {
                return Err(Error::Protocol(format!(
                    "response capsule of {} bytes (expected {CQE})",
                    c.byte_len()
                )));
            }
            // Send with Invalidate responses are accepted as they are: we use one region
            // and never ask for an invalidation.
            let off = self.ctl_off_cqe(k);
            // SAFETY: the receive completed: its 16 bytes are written and not in use by
            // the device until reposted (after this).
            let bytes = unsafe { std::slice::from_raw_parts(self.ctl.ptr.add(off), CQE) };
            let cqe = nvmf_wire::Completion::read_from_bytes(bytes)
                .map_err(|_| Error::Protocol("short response capsule".into()))?;
            let i = s.slot_for(cqe.cid(), "response")?;
            s.set_sqhd(cqe.sqhd());
            let r = (cqe.status(), cqe.dw0(), cqe.dw1());
            if self.sent[i] {
                s.complete(i, r.0, r.1, r.2);
            } else {
                self.resp[i] = Some(r);
            }
        } else {
            let i = wr as usize;
            if i >= self.sent.len() {
                return Err(Error::Protocol(format!("unexpected send completion {c:?}")));
            }
            self.sent[i] = true;
            if let Some((st, dw0, dw1)) = self.resp[i].take() {
                s.complete(i, st, dw0, dw1);
            }
        }
        Ok(())
    }

    /// Reads pending CM events: a disconnect or device removal ends the link.
    fn cm_events(&mut self) {
        for _ in 0..16 {
            match self.ch.next_event() {
                Ok(Some(ev)) => match ev.kind {
                    CmEventKind::Disconnected => {
                        let _ = self.fail("the target disconnected".into());
                    }
                    CmEventKind::DeviceRemoval => {
                        let _ = self.fail("the RDMA device was removed".into());
                    }
                    _ => {}
                },
                Ok(None) => return,
                Err(e) => {
                    let _ = self.fail(format!("connection events: {e}"));
                    return;
                }
            }
        }
    }

    /// Arms the CQ so that its fd wakes at the next completion; true if newly armed (the
    /// caller polls the CQ once more before sleeping).
    pub(crate) fn arm(&mut self) -> Result<bool> {
        if self.armed {
            return Ok(false);
        }
        self.cq
            .arm()
            .map_err(|e| self.fail(format!("arming the completion queue: {e}")))?;
        self.armed = true;
        Ok(true)
    }

    /// Sleeps until a completion or a CM event may be there, at most `left`.
    pub(crate) fn wait(&mut self, left: Option<Duration>) -> Result<()> {
        let mut fds = [
            libc::pollfd {
                fd: self.cq.fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: self.ch.fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        let ms = match left {
            None => -1,
            Some(d) => d.as_millis().clamp(1, i32::MAX as u128) as i32,
        };
        // SAFETY: two valid pollfds.
        let r = unsafe { libc::poll(fds.as_mut_ptr(), 2, ms) };
        if r > 0 && fds[1].revents != 0 {
            self.cm_events();
        }
        if r < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(Error::Io {
                    what: "poll",
                    err: e,
                });
            }
        }
        Ok(())
    }

    /// The completion channel fd (readable once the armed CQ has a completion).
    pub(crate) fn raw_fd(&self) -> RawFd {
        self.cq.fd()
    }

    /// Starts the disconnect (the target sees the queue go).
    pub(crate) fn shutdown(&self) {
        let _ = self.id.disconnect();
    }
}

impl Drop for RdmaLink {
    fn drop(&mut self) {
        // Disconnect moves the QP to the error state: the device stops touching our memory
        // before the fields (QP, regions, memory) are freed in order.
        let _ = self.id.disconnect();
        let mut wc = [Completion::default(); WC_BATCH];
        for _ in 0..16 {
            match self.cq.poll(&mut wc) {
                Ok(n) if n > 0 => {}
                _ => break,
            }
        }
    }
}

/// The reason of an NVMe/RDMA connect reject, from its private data.
fn describe_reject(pd: &[u8], status: i32) -> String {
    match RdmaCmReject::read_from_prefix(pd) {
        Ok((r, _)) if r.recfmt.get() == 0 => match RdmaCmStatus::from_code(r.sts.get()) {
            Some(st) => format!("{} (NVMe/RDMA status {:#x})", st.describe(), st.code()),
            None if r.sts.get() == 0 => {
                format!("no NVMe/RDMA reason given (rdma_cm status {status})")
            }
            None => format!("unknown NVMe/RDMA status {:#x}", r.sts.get()),
        },
        _ => format!("no NVMe/RDMA reason given (rdma_cm status {status})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reject_reasons_are_described() {
        let r = RdmaCmStatus::InvalidHsqsize.reject();
        let s = describe_reject(r.as_bytes(), 28);
        assert!(s.contains(RdmaCmStatus::InvalidHsqsize.describe()), "{s}");
        assert!(s.contains("0x4"), "{s}");
        assert!(describe_reject(&[], 28).contains("no NVMe/RDMA reason"));
        assert!(describe_reject(&[0, 0, 0x77, 0], 28).contains("unknown NVMe/RDMA status 0x77"));
    }

    #[test]
    fn addresses_of_both_families() {
        assert_eq!(
            resolve_addr("10.0.0.1:4420").unwrap(),
            "10.0.0.1:4420".parse::<SocketAddr>().unwrap()
        );
        assert_eq!(
            resolve_addr("[fd00::1]:4420").unwrap(),
            "[fd00::1]:4420".parse::<SocketAddr>().unwrap()
        );
        assert!(resolve_addr("nohost.invalid.:4420").is_err());
    }
}
