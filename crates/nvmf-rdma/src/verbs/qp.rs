//! The RC queue pair on a [`CmId`] and what is posted to it: send work requests (SEND, Send
//! with Invalidate, RDMA WRITE/READ, memory-window binds) and receives, each batch built as one
//! C list in reusable scratch space and posted with one call (one doorbell); and shared
//! receive queues, an option for receives.

use std::ptr::null_mut;
use std::sync::{Arc, Mutex};

use super::{Access, CompletionQueue, MemoryRegion, MemoryWindow, ProtectionDomain};
use crate::cm::CmId;
use crate::ffi;
use crate::{lib, Error, Result};

/// A shared receive queue: receive buffers for every QP created with it (an NVMe/RDMA target's
/// option to size receive memory per reactor instead of per queue). Its receive completions
/// arrive on each QP's receive CQ, told apart by [`Completion::qp_num`](super::Completion::qp_num).
pub struct SharedReceiveQueue {
    srq: *mut ffi::ibv_srq,
    depth: u32,
    scratch: Mutex<WrScratch>,
    _pd: Arc<ProtectionDomain>,
}

// SAFETY: libibverbs SRQs may be posted to from any thread; the scratch is behind a mutex.
unsafe impl Send for SharedReceiveQueue {}
// SAFETY: as above.
unsafe impl Sync for SharedReceiveQueue {}

impl SharedReceiveQueue {
    /// One of at least `depth` receives (one SGE each) in `pd`.
    pub fn new(pd: &Arc<ProtectionDomain>, depth: u32) -> Result<Arc<SharedReceiveQueue>> {
        let l = lib()?;
        if depth == 0 {
            return Err(Error::invalid("ibv_create_srq", "depth 0".into()));
        }
        let mut attr = ffi::ibv_srq_init_attr {
            srq_context: null_mut(),
            max_wr: depth,
            max_sge: 1,
            srq_limit: 0,
        };
        // SAFETY: `pd` is live; attr is complete.
        let srq = unsafe { (l.ibv_create_srq)(pd.pd, &mut attr) };
        if srq.is_null() {
            return Err(Error::last("ibv_create_srq"));
        }
        Ok(Arc::new(SharedReceiveQueue {
            srq,
            depth: attr.max_wr,
            scratch: Mutex::new(WrScratch::default()),
            _pd: pd.clone(),
        }))
    }

    /// The depth the device granted.
    pub fn depth(&self) -> u32 {
        self.depth
    }

    /// Posts receive buffers as one list. Never blocks (beyond an uncontended mutex); fails if
    /// the queue is full.
    pub fn post_recv(&self, wrs: &[RecvWr]) -> std::result::Result<(), PostError> {
        let total = wrs.len();
        if wrs.is_empty() {
            return Ok(());
        }
        let mut scratch = self.scratch.lock().unwrap_or_else(|p| p.into_inner());
        let list = scratch.build_recv(wrs);
        let mut bad: *mut ffi::ibv_recv_wr = null_mut();
        // SAFETY: the list is live for the call; `srq` and its context are live.
        let r = unsafe { (ffi::ops((*self.srq).context).post_srq_recv)(self.srq, list, &mut bad) };
        if r != 0 {
            return Err(PostError {
                posted: posted_before(list, bad),
                total,
                error: Error::errno("ibv_post_srq_recv", r.abs()),
            });
        }
        Ok(())
    }
}

impl Drop for SharedReceiveQueue {
    fn drop(&mut self) {
        if let Ok(l) = lib() {
            // SAFETY: every QP using it holds an Arc to it, so none is left.
            unsafe { (l.ibv_destroy_srq)(self.srq) };
        }
    }
}

/// A local scatter/gather entry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sge {
    pub addr: u64,
    pub len: u32,
    pub lkey: u32,
}

/// A receive work request: one buffer.
#[derive(Clone, Copy, Debug)]
pub struct RecvWr {
    pub wr_id: u64,
    pub sge: Sge,
}

/// The operation of a [`SendWr`].
#[derive(Clone, Copy)]
pub enum SendOp<'a> {
    /// SEND of the local buffers.
    Send,
    /// SEND, and the peer's device invalidates `rkey` (its memory window / fast-registered
    /// region) before the receive completes.
    SendWithInvalidate { rkey: u32 },
    /// RDMA WRITE of the local buffers to the peer's `remote_addr` under `rkey`.
    RdmaWrite { remote_addr: u64, rkey: u32 },
    /// RDMA READ from the peer's `remote_addr` under `rkey` into the local buffers.
    RdmaRead { remote_addr: u64, rkey: u32 },
    /// Binds `mw` to `len` bytes at `addr` of `mr` with key `rkey` (see [`next_rkey`](super::next_rkey)) and
    /// `access` (remote read and/or write). No local buffers.
    BindMw {
        mw: &'a MemoryWindow,
        mr: &'a MemoryRegion,
        rkey: u32,
        addr: u64,
        len: u64,
        access: Access,
    },
}

/// A send-queue work request.
#[derive(Clone, Copy)]
pub struct SendWr<'a> {
    pub wr_id: u64,
    pub op: SendOp<'a>,
    /// Local buffers (gathered for SEND/WRITE, scattered into for READ).
    pub local: &'a [Sge],
    /// Whether it produces a completion (unsignaled ones complete silently, in order).
    pub signaled: bool,
    /// Copy the data into the work request at post time (SEND/WRITE up to the QP's
    /// `max_inline`; no lkey needed, the buffer is free again on return).
    pub inline: bool,
}

/// Queue pair sizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpCaps {
    pub send_depth: u32,
    pub recv_depth: u32,
    pub send_sge: u32,
    pub recv_sge: u32,
    pub max_inline: u32,
}

/// A post that failed at `posted` (the work requests before it are on the queue).
#[derive(Debug, thiserror::Error)]
#[error("{error} ({posted} of {total} work requests posted)")]
pub struct PostError {
    pub posted: usize,
    pub total: usize,
    #[source]
    pub error: Error,
}

/// What a CmId with a QP holds: the objects the QP uses (released after it) and the space
/// work-request lists are built in.
pub(crate) struct QpResources {
    _pd: Arc<ProtectionDomain>,
    _send_cq: Arc<CompletionQueue>,
    _recv_cq: Arc<CompletionQueue>,
    srq: Option<Arc<SharedReceiveQueue>>,
    caps: QpCaps,
    scratch: WrScratch,
}

impl CmId {
    /// Creates this connection's RC queue pair (`rdma_create_qp`) in `pd` with the two CQs;
    /// returns the sizes the device granted (at least those asked for). Once per id.
    pub fn create_qp(
        &mut self,
        pd: &Arc<ProtectionDomain>,
        send_cq: &Arc<CompletionQueue>,
        recv_cq: &Arc<CompletionQueue>,
        caps: QpCaps,
    ) -> Result<QpCaps> {
        self.create_qp_with(pd, send_cq, recv_cq, None, caps)
    }

    /// As [`create_qp`](CmId::create_qp), taking receives from `srq` when given (the QP then
    /// has no receive queue of its own: `recv_depth`/`recv_sge` are ignored and
    /// [`post_recv`](CmId::post_recv) is refused).
    pub fn create_qp_with(
        &mut self,
        pd: &Arc<ProtectionDomain>,
        send_cq: &Arc<CompletionQueue>,
        recv_cq: &Arc<CompletionQueue>,
        srq: Option<&Arc<SharedReceiveQueue>>,
        caps: QpCaps,
    ) -> Result<QpCaps> {
        let l = lib()?;
        if self.qp.is_some() {
            return Err(Error::invalid(
                "rdma_create_qp",
                "this id has a QP already".into(),
            ));
        }
        let (recv_depth, recv_sge) = if srq.is_some() {
            (0, 0)
        } else {
            (caps.recv_depth, caps.recv_sge)
        };
        let mut attr = ffi::ibv_qp_init_attr {
            qp_context: null_mut(),
            send_cq: send_cq.cq,
            recv_cq: recv_cq.cq,
            srq: srq.map_or(null_mut(), |q| q.srq),
            cap: ffi::ibv_qp_cap {
                max_send_wr: caps.send_depth,
                max_recv_wr: recv_depth,
                max_send_sge: caps.send_sge,
                max_recv_sge: recv_sge,
                max_inline_data: caps.max_inline,
            },
            qp_type: ffi::IBV_QPT_RC,
            sq_sig_all: 0,
        };
        // SAFETY: `raw`, `pd` and the CQs are live; attr is complete.
        if unsafe { (l.rdma_create_qp)(self.raw, pd.pd, &mut attr) } != 0 {
            return Err(Error::last("rdma_create_qp"));
        }
        let got = QpCaps {
            send_depth: attr.cap.max_send_wr,
            recv_depth: attr.cap.max_recv_wr,
            send_sge: attr.cap.max_send_sge,
            recv_sge: attr.cap.max_recv_sge,
            max_inline: attr.cap.max_inline_data,
        };
        self.qp = Some(QpResources {
            _pd: pd.clone(),
            _send_cq: send_cq.clone(),
            _recv_cq: recv_cq.clone(),
            srq: srq.cloned(),
            caps: got,
            scratch: WrScratch::default(),
        });
        Ok(got)
    }

    /// The QP's number (`None` before [`create_qp`](CmId::create_qp)).
    pub fn qp_num(&self) -> Option<u32> {
        // SAFETY: `raw` is live; `qp` is set by rdma_create_qp.
        let qp = unsafe { (*self.raw).qp };
        (self.qp.is_some() && !qp.is_null()).then(|| unsafe { (*qp).qp_num })
    }

    /// The granted sizes (`None` before [`create_qp`](CmId::create_qp)).
    pub fn qp_caps(&self) -> Option<QpCaps> {
        self.qp.as_ref().map(|q| q.caps)
    }

    fn qp_ptr(&self, op: &'static str) -> Result<*mut ffi::ibv_qp> {
        // SAFETY: `raw` is live.
        let qp = unsafe { (*self.raw).qp };
        if self.qp.is_none() || qp.is_null() {
            return Err(Error::invalid(op, "no queue pair on this id".into()));
        }
        Ok(qp)
    }

    /// Posts `wrs` as one list (one doorbell). Never blocks; fails if the send queue is full.
    pub fn post_send(&mut self, wrs: &[SendWr]) -> std::result::Result<(), PostError> {
        let total = wrs.len();
        let fail = |posted, error| PostError {
            posted,
            total,
            error,
        };
        let qp = self.qp_ptr("ibv_post_send").map_err(|e| fail(0, e))?;
        if wrs.is_empty() {
            return Ok(());
        }
        let res = self.qp.as_mut().expect("checked by qp_ptr");
        let caps = res.caps;
        let list = res.scratch.build_send(wrs, &caps).map_err(|e| fail(0, e))?;
        let mut bad: *mut ffi::ibv_send_wr = null_mut();
        // SAFETY: the list, its SGEs and the objects it names are live for the call; the
        // provider copies what it keeps.
        let r = unsafe { (ffi::ops((*qp).context).post_send)(qp, list, &mut bad) };
        if r != 0 {
            return Err(fail(
                posted_before(list, bad),
                Error::errno("ibv_post_send", r.abs()),
            ));
        }
        Ok(())
    }

    /// Posts receive buffers as one list. Never blocks; fails if the receive queue is full.
    pub fn post_recv(&mut self, wrs: &[RecvWr]) -> std::result::Result<(), PostError> {
        let total = wrs.len();
        let fail = |posted, error| PostError {
            posted,
            total,
            error,
        };
        let qp = self.qp_ptr("ibv_post_recv").map_err(|e| fail(0, e))?;
        if wrs.is_empty() {
            return Ok(());
        }
        let res = self.qp.as_mut().expect("checked by qp_ptr");
        if res.srq.is_some() {
            let e = "this QP takes its receives from a shared receive queue".to_string();
            return Err(fail(0, Error::invalid("ibv_post_recv", e)));
        }
        let list = res.scratch.build_recv(wrs);
        let mut bad: *mut ffi::ibv_recv_wr = null_mut();
        // SAFETY: as in post_send.
        let r = unsafe { (ffi::ops((*qp).context).post_recv)(qp, list, &mut bad) };
        if r != 0 {
            return Err(fail(
                posted_before(list, bad),
                Error::errno("ibv_post_recv", r.abs()),
            ));
        }
        Ok(())
    }
}

/// How many work requests of `list` precede `bad` (the one the device refused).
fn posted_before<T>(list: *mut T, bad: *mut T) -> usize {
    if bad.is_null() {
        0
    } else {
        // SAFETY: the provider sets `bad` to an element of `list`.
        unsafe { bad.offset_from(list).max(0) as usize }
    }
}

/// Where work-request lists are built for the C library: reused from post to post, so
/// posting allocates nothing once the vectors have grown to the largest batch.
#[derive(Default)]
pub(crate) struct WrScratch {
    send_wrs: Vec<ffi::ibv_send_wr>,
    recv_wrs: Vec<ffi::ibv_recv_wr>,
    sges: Vec<ffi::ibv_sge>,
}

impl WrScratch {
    /// The C list for `wrs` (linked through `next`), checked against the QP's `caps`.
    fn build_send(&mut self, wrs: &[SendWr], caps: &QpCaps) -> Result<*mut ffi::ibv_send_wr> {
        self.sges.clear();
        self.send_wrs.clear();
        for (i, w) in wrs.iter().enumerate() {
            if w.local.len() > caps.send_sge as usize {
                return Err(Error::invalid(
                    "ibv_post_send",
                    format!(
                        "work request {i}: {} scatter/gather entries, the QP allows {}",
                        w.local.len(),
                        caps.send_sge
                    ),
                ));
            }
            let inline_len: u64 = w.local.iter().map(|s| s.len as u64).sum();
            if w.inline && inline_len > caps.max_inline as u64 {
                return Err(Error::invalid(
                    "ibv_post_send",
                    format!(
                        "work request {i}: {inline_len} bytes inline, the QP allows {}",
                        caps.max_inline
                    ),
                ));
            }
            self.sges.extend(w.local.iter().map(|s| ffi::ibv_sge {
                addr: s.addr,
                length: s.len,
                lkey: s.lkey,
            }));
        }
        let mut at = 0usize;
        let base = self.sges.as_mut_ptr();
        for w in wrs {
            let mut raw = ffi::ibv_send_wr::default();
            raw.wr_id = w.wr_id;
            let n = w.local.len();
            if n > 0 {
                // SAFETY: `at + n <= sges.len()`; the vector does not change until posted.
                raw.sg_list = unsafe { base.add(at) };
            }
            raw.num_sge = n as i32;
            at += n;
            raw.send_flags = if w.signaled {
                ffi::IBV_SEND_SIGNALED
            } else {
                0
            };
            if w.inline {
                raw.send_flags |= ffi::IBV_SEND_INLINE;
            }
            match w.op {
                SendOp::Send => raw.opcode = ffi::IBV_WR_SEND,
                SendOp::SendWithInvalidate { rkey } => {
                    raw.opcode = ffi::IBV_WR_SEND_WITH_INV;
                    raw.invalidate_rkey = rkey;
                }
                SendOp::RdmaWrite { remote_addr, rkey } => {
                    raw.opcode = ffi::IBV_WR_RDMA_WRITE;
                    raw.remote_addr = remote_addr;
                    raw.rkey = rkey;
                }
                SendOp::RdmaRead { remote_addr, rkey } => {
                    raw.opcode = ffi::IBV_WR_RDMA_READ;
                    raw.remote_addr = remote_addr;
                    raw.rkey = rkey;
                }
                SendOp::BindMw {
                    mw,
                    mr,
                    rkey,
                    addr,
                    len,
                    access,
                } => {
                    raw.opcode = ffi::IBV_WR_BIND_MW;
                    raw.bind_mw = mw.mw;
                    raw.bind_rkey = rkey;
                    raw.bind_info = ffi::ibv_mw_bind_info {
                        mr: mr.mr,
                        addr,
                        length: len,
                        mw_access_flags: access.bits(),
                    };
                }
            }
            self.send_wrs.push(raw);
        }
        let list = self.send_wrs.as_mut_ptr();
        for i in 1..self.send_wrs.len() {
            // SAFETY: both indexes are in bounds; the vector no longer grows.
            unsafe { (*list.add(i - 1)).next = list.add(i) };
        }
        Ok(list)
    }

    /// The C list for `wrs` (one SGE each, linked through `next`).
    fn build_recv(&mut self, wrs: &[RecvWr]) -> *mut ffi::ibv_recv_wr {
        self.sges.clear();
        self.recv_wrs.clear();
        self.sges.extend(wrs.iter().map(|w| ffi::ibv_sge {
            addr: w.sge.addr,
            length: w.sge.len,
            lkey: w.sge.lkey,
        }));
        let base = self.sges.as_mut_ptr();
        for (i, w) in wrs.iter().enumerate() {
            self.recv_wrs.push(ffi::ibv_recv_wr {
                wr_id: w.wr_id,
                next: null_mut(),
                // SAFETY: `i < sges.len()`.
                sg_list: unsafe { base.add(i) },
                num_sge: 1,
            });
        }
        let list = self.recv_wrs.as_mut_ptr();
        for i in 1..self.recv_wrs.len() {
            // SAFETY: in bounds; the vector no longer grows.
            unsafe { (*list.add(i - 1)).next = list.add(i) };
        }
        list
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps() -> QpCaps {
        QpCaps {
            send_depth: 16,
            recv_depth: 16,
            send_sge: 2,
            recv_sge: 1,
            max_inline: 64,
        }
    }

    #[test]
    fn send_list_is_one_chain_with_the_c_fields() {
        let mut s = WrScratch::default();
        let a = [Sge {
            addr: 0x1000,
            len: 4096,
            lkey: 7,
        }];
        let b = [
            Sge {
                addr: 0x2000,
                len: 16,
                lkey: 8,
            },
            Sge {
                addr: 0x3000,
                len: 48,
                lkey: 8,
            },
        ];
        let wrs = [
            SendWr {
                wr_id: 1,
                op: SendOp::RdmaRead {
                    remote_addr: 0xdead_0000,
                    rkey: 0x42,
                },
                local: &a,
                signaled: true,
                inline: false,
            },
            SendWr {
                wr_id: 2,
                op: SendOp::RdmaWrite {
                    remote_addr: 0xbeef_0000,
                    rkey: 0x43,
                },
                local: &a,
                signaled: false,
                inline: false,
            },
            SendWr {
                wr_id: 3,
                op: SendOp::SendWithInvalidate { rkey: 0x44 },
                local: &b,
                signaled: true,
                inline: true,
            },
        ];
        let list = s.build_send(&wrs, &caps()).unwrap();
        // SAFETY: walks the list just built; it lives in `s`.
        let got: Vec<ffi::ibv_send_wr> = unsafe {
            let mut v = Vec::new();
            let mut p = list;
            while !p.is_null() && v.len() < 10 {
                v.push(*p);
                p = (*p).next;
            }
            v
        };
        assert_eq!(got.len(), 3, "one chain of all three");
        assert_eq!(got.iter().map(|w| w.wr_id).collect::<Vec<_>>(), [1, 2, 3]);
        assert_eq!(
            got.iter().map(|w| w.opcode).collect::<Vec<_>>(),
            [
                ffi::IBV_WR_RDMA_READ,
                ffi::IBV_WR_RDMA_WRITE,
                ffi::IBV_WR_SEND_WITH_INV
            ]
        );
        assert_eq!(
            got.iter().map(|w| w.send_flags).collect::<Vec<_>>(),
            [
                ffi::IBV_SEND_SIGNALED,
                0,
                ffi::IBV_SEND_SIGNALED | ffi::IBV_SEND_INLINE
            ]
        );
        assert_eq!((got[0].remote_addr, got[0].rkey), (0xdead_0000, 0x42));
        assert_eq!((got[1].remote_addr, got[1].rkey), (0xbeef_0000, 0x43));
        assert_eq!(got[2].invalidate_rkey, 0x44);
        assert_eq!(got[2].num_sge, 2);
        // SAFETY: sg_list points at the scratch SGEs.
        let sg2 = unsafe { std::slice::from_raw_parts(got[2].sg_list, 2) };
        assert_eq!((sg2[0].addr, sg2[0].length, sg2[0].lkey), (0x2000, 16, 8));
        assert_eq!((sg2[1].addr, sg2[1].length, sg2[1].lkey), (0x3000, 48, 8));
        // SAFETY: as above.
        let sg0 = unsafe { &*got[0].sg_list };
        assert_eq!((sg0.addr, sg0.length, sg0.lkey), (0x1000, 4096, 7));
    }

    #[test]
    fn send_list_limits_are_checked() {
        let mut s = WrScratch::default();
        let three = [Sge::default(); 3];
        let big = [Sge {
            addr: 1,
            len: 65,
            lkey: 1,
        }];
        let wr = |local| SendWr {
            wr_id: 9,
            op: SendOp::Send,
            local,
            signaled: true,
            inline: true,
        };
        let e = s.build_send(&[wr(&three)], &caps()).err().unwrap();
        assert!(e.to_string().contains("3 scatter/gather entries"), "{e}");
        let e = s.build_send(&[wr(&big)], &caps()).err().unwrap();
        assert!(e.to_string().contains("65 bytes inline"), "{e}");
    }

    #[test]
    fn recv_list_is_one_chain() {
        let mut s = WrScratch::default();
        let wrs: Vec<RecvWr> = (0..4)
            .map(|i| RecvWr {
                wr_id: 100 + i,
                sge: Sge {
                    addr: 0x1000 * (i + 1),
                    len: 4160,
                    lkey: 5,
                },
            })
            .collect();
        let mut p = s.build_recv(&wrs);
        let mut n = 0;
        while !p.is_null() && n < 10 {
            // SAFETY: walks the list just built.
            let w = unsafe { &*p };
            // SAFETY: one SGE each.
            let sge = unsafe { &*w.sg_list };
            assert_eq!(w.wr_id, 100 + n);
            assert_eq!(
                (sge.addr, sge.length, sge.lkey),
                (0x1000 * (n + 1), 4160, 5)
            );
            n += 1;
            p = w.next;
        }
        assert_eq!(n, 4);
    }
}
