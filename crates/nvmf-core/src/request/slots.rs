//! Request slots: the per-command state of one queue, whatever the
//! transport. A slot holds
//! the command (SQE copy), its transfer bookkeeping, its `RequestState` and a
//! data buffer that is allocated the first time a command needs it and then
//! reused by every later command in that slot (no allocation per I/O while
//! memory is plentiful). The `Slots` table owns the free list, a CID bitmap
//! that finds Command ID conflicts in O(1), and the accounting of slot
//! buffers against the target-wide [`BufBudget`]. Data buffers are 4096-byte
//! aligned ([`AlignedBuf`]) so that an O_DIRECT backend can read/write them
//! in place.
//!
//! Memory bound: a slot buffer up to the *retained size* (the in-capsule data
//! size rounded up to a power of two, at least 4 KiB) is per-slot overhead,
//! like SPDK's per-request in-capsule buffers, and is never charged. A bigger
//! buffer is charged in full to the budget when it grows (one atomic add) and
//! credited when it is freed (one atomic sub). Buffers of free slots above the
//! retained size are freed when a slot is released while the budget is under
//! pressure, when the connection itself must wait for a buffer, and on the
//! timer tick under pressure. A connection that has nothing charged may
//! always overdraw by one buffer, so every connection makes progress.

use nvmf_wire::command::Command;
use std::alloc::{self, Layout};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

/// Alignment of slot data buffers (O_DIRECT on 512- and 4096-byte devices).
pub const BUF_ALIGN: usize = 4096;

/// A zero-initialised, 4096-byte aligned byte buffer that only grows.
/// Growing keeps the old contents.
///
/// Each allocation has an ID unique in the process ([`AlignedBuf::id`]),
/// so that whoever keeps something tied to the memory (an RDMA memory
/// registration) can tell a buffer freed and allocated again, even when
/// the allocator hands back the same address and length.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
    id: u64,
}

/// The next [`AlignedBuf`] allocation's ID (0 is "no allocation").
static NEXT_BUF_ID: AtomicU64 = AtomicU64::new(1);

// SAFETY: owns its allocation exclusively, like a Vec<u8>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only reads, like a Vec<u8>.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    pub const fn new() -> AlignedBuf {
        AlignedBuf {
            ptr: NonNull::dangling(),
            len: 0,
            id: 0,
        }
    }

    /// The ID of the current allocation (0 while empty): changes whenever
    /// the memory does (grown into a new allocation, or freed).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Grows to `len` bytes (new bytes zero), keeping the contents.
    pub fn grow(&mut self, len: usize) {
        if len <= self.len {
            return;
        }
        let layout = Layout::from_size_align(len, BUF_ALIGN).expect("buffer layout");
        // SAFETY: non-zero size (len > self.len >= 0).
        let p = unsafe { alloc::alloc_zeroed(layout) };
        let Some(p) = NonNull::new(p) else {
            alloc::handle_alloc_error(layout)
        };
        if self.len > 0 {
            // SAFETY: both regions are valid for self.len bytes and distinct.
            unsafe { std::ptr::copy_nonoverlapping(self.ptr.as_ptr(), p.as_ptr(), self.len) };
            self.free();
        }
        self.ptr = p;
        self.len = len;
        self.id = NEXT_BUF_ID.fetch_add(1, Ordering::Relaxed);
    }

    /// Frees the allocation (the buffer becomes empty).
    pub fn free(&mut self) {
        if self.len > 0 {
            let layout = Layout::from_size_align(self.len, BUF_ALIGN).expect("buffer layout");
            // SAFETY: allocated by `grow` with this layout.
            unsafe { alloc::dealloc(self.ptr.as_ptr(), layout) };
            self.len = 0;
            self.id = 0;
        }
    }
}

impl Default for AlignedBuf {
    fn default() -> Self {
        AlignedBuf::new()
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        self.free();
    }
}

impl std::ops::Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr is valid for len bytes (dangling + 0 when empty).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in Deref, uniquely borrowed.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedBuf({} bytes)", self.len)
    }
}

/// Where a request is in its life. Transitions (driven by `engine.rs`; the
/// transport moves the data):
///
/// ```text
/// Free ──capsule──► ReadyToExecute ──────────────────────────────┐
///   │  └──(no room)──► NeedBuffer ──room──┐ (fetch or execute)   │
///   │                      ▲              ▼                      │
///   └─capsule (fetch)─► AwaitingHostData ──all data landed───────┘
///                                                                ▼
///         Executing ◄──Pending── execute() ──Complete──► Completing
///             │                                            │   │
///             └──────────completion via poll()─────────────┘   │
///                                                              ▼
///   Free ◄──data sent── TransferringToHost ◄──data to host── (response queued)
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestState {
    /// On the free list; owns nothing but its (reusable) buffer.
    Free,
    /// The command needs a data buffer larger than the retained size and
    /// the budget (or, for a write, the queue's fetch allowance) has no
    /// room now: it waits in the connection's FIFO (SPDK's "need buffer")
    /// and starts when room frees up (a slot of this connection releases,
    /// or on the next tick).
    NeedBuffer,
    /// Host→controller data goes through the transport, which is fetching
    /// the whole transfer into the slot buffer (NVMe/TCP: one R2T with TTAG
    /// = slot index, then H2CData PDUs; NVMe/RDMA: RDMA READs).
    AwaitingHostData,
    /// The command and all of its input data are here; next stop is
    /// `QueuePair::execute`.
    ReadyToExecute,
    /// `QueuePair::execute` returned `Pending`: the backend owns the command
    /// until its completion is delivered through `QueuePair::poll`. The slot
    /// and its buffer stay reserved.
    Executing,
    /// Controller→host data (NVMe/TCP C2HData, NVMe/RDMA RDMA WRITE) was
    /// queued and references the slot buffer directly (no copy); the slot
    /// is released when the transport has sent those bytes.
    TransferringToHost,
    /// The completion is known and the response capsule is being queued.
    /// Transient within one call: the slot goes to `TransferringToHost` when
    /// data is still in flight, else straight back to `Free`.
    Completing,
}

/// Direction of a command's data, from the opcode's (or FCTYPE's) low bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Xfer {
    None,
    HostToCtrl,
    CtrlToHost,
    /// Bidirectional (both bits set): not supported.
    Bidi,
}

impl Xfer {
    /// The data direction of `cmd`: bits 1:0 of the opcode, or of FCTYPE
    /// for Fabrics commands (opcode 0x7f).
    pub fn of(cmd: &Command) -> Xfer {
        let code = if cmd.opcode() == 0x7f {
            cmd.fctype()
        } else {
            cmd.opcode()
        };
        match code & 0x3 {
            0 => Xfer::None,
            1 => Xfer::HostToCtrl,
            2 => Xfer::CtrlToHost,
            _ => Xfer::Bidi,
        }
    }
}

/// One request slot.
#[derive(Debug)]
pub struct Slot {
    pub state: RequestState,
    pub cmd: Command,
    pub xfer: Xfer,
    /// Transfer length in bytes (the SGL length).
    pub len: u32,
    /// Host→controller bytes received so far (the transport's fetch).
    pub received: u32,
    /// The transport saw this command's data damaged (an NVMe/TCP data
    /// digest error): the command is completed with a transient transport
    /// error instead of executed.
    pub data_error: bool,
    /// When the fetch of this command's data started (the queue's coarse
    /// clock, set on its timer tick: no clock read per I/O).
    pub fetch_at: std::time::Instant,
    /// When the capsule was received (the connection's clock read for the
    /// bytes it came in: `nvmf_core::stats::now_ns`, one per receive, not
    /// per command): the start of the command's latency.
    pub start_ns: u64,
    buf: AlignedBuf,
    /// Bytes of `buf` charged to the budget (0 or `buf.len()`).
    charged: usize,
    /// The slot holds its command's CID (until its response is queued:
    /// [`Slots::release_cid`], or the slot is released).
    cid_held: bool,
}

impl Slot {
    fn new() -> Slot {
        Slot {
            state: RequestState::Free,
            cmd: Command::default(),
            xfer: Xfer::None,
            len: 0,
            received: 0,
            data_error: false,
            fetch_at: std::time::Instant::now(),
            start_ns: 0,
            buf: AlignedBuf::new(),
            charged: 0,
            cid_held: false,
        }
    }

    /// The first `len` bytes of the slot buffer (at most what
    /// [`Slots::reserve`] made room for).
    pub fn data_mut(&mut self, len: usize) -> &mut [u8] {
        let n = len.min(self.buf.len());
        &mut self.buf[..n]
    }

    /// The command and the first `len` bytes of its buffer (`data_mut(len)`)
    /// at once, `len` being the slot's transfer length: what execution
    /// needs, without copying the command out of the slot.
    #[inline]
    pub fn cmd_and_data_mut(&mut self) -> (&Command, &mut [u8]) {
        let n = (self.len as usize).min(self.buf.len());
        (&self.cmd, &mut self.buf[..n])
    }

    /// The first `len` bytes of the slot buffer (must already be allocated).
    pub fn data(&self, len: usize) -> &[u8] {
        &self.buf[..len.min(self.buf.len())]
    }

    /// Bytes currently allocated for data.
    pub fn capacity(&self) -> usize {
        self.buf.len()
    }

    /// The ID of the data buffer's current allocation (0: none; see
    /// [`AlignedBuf::id`]): a registration of the buffer made under another
    /// ID names memory that was freed.
    pub fn buffer_id(&self) -> u64 {
        self.buf.id()
    }
}

/// The target-wide budget of slot data buffer bytes above the retained size
/// (shared by every connection of every reactor as `Arc<BufBudget>`).
/// Sized from SPDK's `num_shared_buffers` × `io_unit_size`.
#[derive(Debug)]
pub struct BufBudget {
    limit: usize,
    used: AtomicUsize,
    /// Connections with commands waiting for a buffer.
    waiting: AtomicUsize,
}

impl BufBudget {
    pub fn new(limit: usize) -> Arc<BufBudget> {
        Arc::new(BufBudget {
            limit,
            used: AtomicUsize::new(0),
            waiting: AtomicUsize::new(0),
        })
    }

    /// Bytes the budget allows (overdrafts aside, see the module docs).
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Bytes currently charged.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// Connections with a command waiting for a buffer.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }

    /// Somebody waits, or less than an eighth of the budget is left:
    /// released buffers above the retained size are freed, not kept.
    pub fn under_pressure(&self) -> bool {
        self.waiting.load(Ordering::Relaxed) > 0
            || self.used.load(Ordering::Relaxed) > self.limit - self.limit / 8
    }

    /// Charges `n` bytes if they fit (always when `force`).
    fn charge(&self, n: usize, force: bool) -> bool {
        let prev = self.used.fetch_add(n, Ordering::Relaxed);
        if force || prev.saturating_add(n) <= self.limit {
            true
        } else {
            self.used.fetch_sub(n, Ordering::Relaxed);
            false
        }
    }

    fn credit(&self, n: usize) {
        if n > 0 {
            self.used.fetch_sub(n, Ordering::Relaxed);
        }
    }

    fn add_waiter(&self) {
        self.waiting.fetch_add(1, Ordering::Relaxed);
    }

    fn remove_waiter(&self) {
        self.waiting.fetch_sub(1, Ordering::Relaxed);
    }
}

/// How slot buffers of one queue are sized and accounted.
#[derive(Debug, Clone)]
pub struct BufPolicy {
    pub budget: Arc<BufBudget>,
    /// Buffers up to this size are per-slot overhead (never charged, kept).
    pub retain: usize,
    /// Largest buffer (the largest transfer of one command).
    pub max: usize,
}

impl BufPolicy {
    /// A policy with its own budget of `limit` bytes.
    pub fn new(limit: usize, retain: usize, max: usize) -> BufPolicy {
        BufPolicy {
            budget: BufBudget::new(limit),
            retain: retain.max(4096).next_power_of_two(),
            max: max.max(4096),
        }
    }
}

/// Why a slot could not be taken for a new command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AllocError {
    /// Another outstanding command uses this CID.
    CidConflict,
    /// More commands outstanding than the queue depth.
    Full,
}

/// The request slots of one queue.
pub struct Slots {
    slots: Vec<Slot>,
    /// Free slot indices, used as a stack so that hot slots (warm buffers)
    /// are reused first.
    free: Vec<u16>,
    /// One bit per CID in use.
    cid_busy: Box<[u64; 1024]>,
    /// Outstanding commands in state `Executing`.
    executing: usize,
    policy: BufPolicy,
    /// Bytes this queue has charged to the budget.
    charged: usize,
    /// This queue counts as a waiter in the budget.
    waiter: bool,
    /// Slots released so far (wakes commands waiting for room).
    releases: u64,
}

#[allow(dead_code)]
impl Slots {
    /// A table with `n` free slots whose buffers follow `policy`.
    pub fn new(n: usize, policy: BufPolicy) -> Slots {
        let mut s = Slots {
            slots: Vec::new(),
            free: Vec::new(),
            cid_busy: Box::new([0u64; 1024]),
            executing: 0,
            policy,
            charged: 0,
            waiter: false,
            releases: 0,
        };
        s.grow(n);
        s
    }

    /// Marks this queue as waiting for budget (or not): while any queue
    /// waits, released buffers above the retained size are freed.
    pub fn set_waiter(&mut self, on: bool) {
        if on != self.waiter {
            self.waiter = on;
            if on {
                self.policy.budget.add_waiter();
            } else {
                self.policy.budget.remove_waiter();
            }
        }
    }

    /// Slots released so far.
    pub fn releases(&self) -> u64 {
        self.releases
    }

    /// When the oldest fetch still waiting for data started.
    pub fn oldest_fetch(&self) -> Option<std::time::Instant> {
        self.slots
            .iter()
            .filter(|s| s.state == RequestState::AwaitingHostData)
            .map(|s| s.fetch_at)
            .min()
    }

    /// Bytes this queue has charged to the budget.
    pub fn charged(&self) -> usize {
        self.charged
    }

    /// Bytes of data buffers all slots hold (charged or not).
    pub fn buffer_bytes(&self) -> usize {
        self.slots.iter().map(|s| s.capacity()).sum()
    }

    /// The retained (never charged) buffer size.
    pub fn retain(&self) -> usize {
        self.policy.retain
    }

    pub fn budget(&self) -> &Arc<BufBudget> {
        &self.policy.budget
    }

    /// Slot `idx` can hold `len` bytes without charging the budget: its
    /// buffer is that big already, or `len` is within the retained size.
    #[inline]
    pub fn fits_without_budget(&self, idx: u16, len: usize) -> bool {
        len <= self.policy.retain
            || self
                .slots
                .get(idx as usize)
                .is_some_and(|s| s.buf.len() >= len)
    }

    /// Makes slot `idx`'s buffer at least `len` bytes. Returns false when
    /// the budget has no room (the command must wait); `must` charges
    /// regardless (data that cannot wait, e.g. still in the receive
    /// buffer). Growing a buffer above the retained size charges it; when
    /// that fails, this queue's idle charged buffers are freed first, and a
    /// queue with nothing else charged may overdraw.
    #[inline]
    pub fn reserve(&mut self, idx: u16, len: usize, must: bool) -> bool {
        match self.slots.get(idx as usize) {
            Some(s) if s.buf.len() >= len => true,
            Some(_) => self.reserve_grow(idx, len, must),
            None => false,
        }
    }

    /// `reserve` when the buffer must grow (the first use of a slot, or a
    /// bigger command than before; every command under pressure).
    #[cold]
    #[inline(never)]
    fn reserve_grow(&mut self, idx: u16, len: usize, must: bool) -> bool {
        let s = &self.slots[idx as usize];
        let max = self.policy.max.max(len);
        let want = len.next_power_of_two().clamp(4096, max);
        let charge = if want > self.policy.retain { want } else { 0 };
        let delta = charge.saturating_sub(s.charged);
        if delta > 0 {
            if !self.policy.budget.charge(delta, must) {
                self.trim_idle();
                let alone = self.charged == self.slots[idx as usize].charged;
                if !self.policy.budget.charge(delta, alone) {
                    return false;
                }
            }
            self.charged += delta;
        }
        let s = &mut self.slots[idx as usize];
        s.buf.grow(want);
        s.charged = charge;
        true
    }

    /// Frees the charged buffers of free slots (credits the budget).
    /// Returns the bytes freed.
    pub fn trim_idle(&mut self) -> usize {
        let mut freed = 0;
        for &i in &self.free {
            let s = &mut self.slots[i as usize];
            if s.charged > 0 {
                freed += s.charged;
                s.charged = 0;
                s.buf.free();
            }
        }
        self.charged -= freed;
        self.policy.budget.credit(freed);
        freed
    }

    /// Grows the table to `n` slots (never shrinks). Control path only.
    pub fn grow(&mut self, n: usize) {
        let n = n.min(u16::MAX as usize);
        if n <= self.slots.len() {
            return;
        }
        let old = self.slots.len();
        self.slots.reserve_exact(n - old);
        self.free.reserve(n - old);
        for _ in old..n {
            self.slots.push(Slot::new());
        }
        // Keep low indices on top of the stack.
        let mut added: Vec<u16> = (old as u16..n as u16).collect();
        added.reverse();
        let rest = std::mem::take(&mut self.free);
        self.free = added;
        self.free.extend(rest);
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Commands currently outstanding (any state but `Free`).
    pub fn in_use(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// Commands waiting for the backend.
    pub fn executing(&self) -> usize {
        self.executing
    }

    fn cid_bit(cid: u16) -> (usize, u64) {
        ((cid >> 6) as usize, 1u64 << (cid & 63))
    }

    pub fn cid_in_use(&self, cid: u16) -> bool {
        let (w, b) = Self::cid_bit(cid);
        self.cid_busy[w] & b != 0
    }

    /// Takes a free slot for `cmd`.
    pub fn alloc(&mut self, cmd: &Command) -> Result<u16, AllocError> {
        let cid = cmd.cid();
        if self.cid_in_use(cid) {
            return Err(AllocError::CidConflict);
        }
        let idx = self.free.pop().ok_or(AllocError::Full)?;
        let (w, b) = Self::cid_bit(cid);
        self.cid_busy[w] |= b;
        let s = &mut self.slots[idx as usize];
        s.cmd = *cmd;
        s.cid_held = true;
        s.xfer = Xfer::of(cmd);
        s.len = 0;
        s.received = 0;
        s.data_error = false;
        s.state = RequestState::ReadyToExecute;
        Ok(idx)
    }

    /// The response of slot `idx` is queued: its CID is the host's again
    /// (a host may reuse it as soon as it has the completion, which over
    /// RDMA can be before the transport has seen its SEND complete), while
    /// the slot itself (its buffers) stays busy until released.
    #[inline]
    pub fn release_cid(&mut self, idx: u16) {
        if let Some(s) = self.slots.get_mut(idx as usize) {
            if std::mem::take(&mut s.cid_held) {
                let (w, b) = Self::cid_bit(s.cmd.cid());
                self.cid_busy[w] &= !b;
            }
        }
    }

    /// Returns slot `idx` to the free list.
    #[inline]
    pub fn release(&mut self, idx: u16) {
        let Some(s) = self.slots.get_mut(idx as usize) else {
            return;
        };
        if s.state == RequestState::Free {
            return;
        }
        if s.state == RequestState::Executing {
            self.executing -= 1;
        }
        s.state = RequestState::Free;
        if std::mem::take(&mut s.cid_held) {
            let (w, b) = Self::cid_bit(s.cmd.cid());
            self.cid_busy[w] &= !b;
        }
        self.releases += 1;
        let charged = s.charged;
        self.free.push(idx);
        if charged > 0 {
            self.release_charged(idx);
        }
    }

    /// A released slot holds a charged buffer: under pressure it is freed.
    #[cold]
    #[inline(never)]
    fn release_charged(&mut self, idx: u16) {
        if !self.policy.budget.under_pressure() {
            return;
        }
        let s = &mut self.slots[idx as usize];
        let n = std::mem::take(&mut s.charged);
        s.buf.free();
        self.charged -= n;
        self.policy.budget.credit(n);
    }

    /// Moves slot `idx` to `state`, keeping the executing count.
    pub fn set_state(&mut self, idx: u16, state: RequestState) {
        if let Some(s) = self.slots.get_mut(idx as usize) {
            if s.state == RequestState::Executing {
                self.executing -= 1;
            }
            if state == RequestState::Executing {
                self.executing += 1;
            }
            s.state = state;
        }
    }

    pub fn get(&self, idx: u16) -> Option<&Slot> {
        self.slots.get(idx as usize)
    }

    pub fn get_mut(&mut self, idx: u16) -> Option<&mut Slot> {
        self.slots.get_mut(idx as usize)
    }

    /// The slot of the outstanding command `cid` in state `state`.
    pub fn find(&self, cid: u16, state: RequestState) -> Option<u16> {
        if !self.cid_in_use(cid) {
            return None;
        }
        self.slots
            .iter()
            .position(|s| s.state == state && s.cmd.cid() == cid)
            .map(|i| i as u16)
    }
}

impl Drop for Slots {
    fn drop(&mut self) {
        // Whatever happens to the buffers themselves (freed with the slots,
        // or handed over to the core while the kernel still uses them), this
        // queue's charge goes back to the budget now.
        self.policy.budget.credit(self.charged);
        self.charged = 0;
        self.set_waiter(false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(limit: usize) -> BufPolicy {
        BufPolicy::new(limit, 4096, 131072)
    }

    #[test]
    fn alloc_release_and_conflicts() {
        let mut s = Slots::new(2, policy(1 << 20));
        let a = s.alloc(&Command::new(0x02, 7)).unwrap();
        assert_eq!(a, 0);
        assert_eq!(
            s.alloc(&Command::new(0x02, 7)),
            Err(AllocError::CidConflict)
        );
        let b = s.alloc(&Command::new(0x01, 8)).unwrap();
        assert_eq!(b, 1);
        assert_eq!(s.alloc(&Command::new(0x01, 9)), Err(AllocError::Full));
        assert_eq!(s.get(b).unwrap().xfer, Xfer::HostToCtrl);
        s.release(a);
        assert!(!s.cid_in_use(7));
        assert_eq!(s.alloc(&Command::new(0x00, 7)).unwrap(), 0);
        s.grow(4);
        assert_eq!(s.len(), 4);
        assert_eq!(s.in_use(), 2);
    }

    #[test]
    fn buffer_is_reused() {
        let mut s = Slots::new(1, policy(1 << 20));
        let i = s.alloc(&Command::new(0x02, 1)).unwrap();
        assert!(s.reserve(i, 512, false));
        let slot = s.get_mut(i).unwrap();
        slot.data_mut(512)[0] = 9;
        assert_eq!(slot.capacity(), 4096);
        let p = slot.data_mut(4096).as_ptr();
        assert_eq!(p, slot.data_mut(100).as_ptr());
        assert_eq!(s.charged(), 0, "retained size is not charged");
        assert!(s.reserve(i, 65536 + 1, false));
        assert_eq!(s.charged(), 131072);
        let slot = s.get_mut(i).unwrap();
        assert_eq!(slot.capacity(), 131072);
        let p = slot.data_mut(131072).as_ptr();
        assert_eq!(p as usize % BUF_ALIGN, 0, "O_DIRECT alignment");
        assert_eq!(slot.data(1)[0], 9, "growing keeps the contents");
        // Released without pressure: kept (no allocation next time).
        s.release(i);
        assert_eq!(s.charged(), 131072);
        let i = s.alloc(&Command::new(0x02, 2)).unwrap();
        assert!(s.reserve(i, 131072, false));
        assert_eq!(s.budget().used(), 131072);
        drop(s);
    }

    #[test]
    fn budget_limits_growth_and_pressure_frees() {
        let mut s = Slots::new(4, policy(256 * 1024));
        let budget = s.budget().clone();
        let a = s.alloc(&Command::new(0x01, 1)).unwrap();
        let b = s.alloc(&Command::new(0x01, 2)).unwrap();
        let c = s.alloc(&Command::new(0x01, 3)).unwrap();
        assert!(s.reserve(a, 131072, false));
        assert!(s.reserve(b, 131072, false));
        assert_eq!(budget.used(), 262144);
        assert!(!s.reserve(c, 131072, false), "budget exhausted");
        assert!(budget.under_pressure());
        // Released under pressure: freed and credited.
        s.release(a);
        assert_eq!(budget.used(), 131072);
        assert_eq!(s.get(a).unwrap().capacity(), 0);
        assert!(s.reserve(c, 131072, false));
        // Another queue with nothing charged may overdraw once.
        let mut other = Slots::new(
            2,
            BufPolicy {
                budget: budget.clone(),
                retain: 4096,
                max: 131072,
            },
        );
        let x = other.alloc(&Command::new(0x01, 1)).unwrap();
        let y = other.alloc(&Command::new(0x01, 2)).unwrap();
        assert!(
            other.reserve(x, 131072, false),
            "overdraft for an empty queue"
        );
        assert!(!other.reserve(y, 131072, false), "but only one");
        drop(other);
        drop(s);
        assert_eq!(budget.used(), 0, "dropping the queues credits everything");
    }
}
