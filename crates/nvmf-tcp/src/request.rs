//! Request slots: the per-command state of one NVMe/TCP queue. A slot holds
//! the command (SQE copy), its transfer bookkeeping, its `RequestState` and a
//! data buffer that is allocated the first time a command needs it and then
//! reused by every later command in that slot (never freed per I/O). The
//! `Slots` table owns the free list and a CID bitmap that finds Command ID
//! conflicts in O(1). Data buffers are 4096-byte aligned ([`AlignedBuf`]) so
//! that an O_DIRECT backend can read/write them in place.

use nvmf_wire::command::Command;
use std::alloc::{self, Layout};
use std::ptr::NonNull;

/// Alignment of slot data buffers (O_DIRECT on 512- and 4096-byte devices).
pub const BUF_ALIGN: usize = 4096;

/// A zero-initialised, 4096-byte aligned byte buffer that only grows.
/// Growing keeps the old contents.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: owns its allocation exclusively, like a Vec<u8>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only reads, like a Vec<u8>.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    pub const fn new() -> AlignedBuf {
        AlignedBuf {
            ptr: NonNull::dangling(),
            len: 0,
        }
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
    }

    fn free(&mut self) {
        if self.len > 0 {
            let layout = Layout::from_size_align(self.len, BUF_ALIGN).expect("buffer layout");
            // SAFETY: allocated by `grow` with this layout.
            unsafe { alloc::dealloc(self.ptr.as_ptr(), layout) };
            self.len = 0;
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

/// Where a request is in its life. Transitions (see `connection.rs`):
///
/// ```text
/// Free ──capsule──► ReadyToExecute ──────────────────────────┐
///   │                      ▲                                 │
///   └─capsule (R2T)──► AwaitingH2CData ──last H2CData────────┘
///                                                            ▼
///         Executing ◄──Pending── execute() ──Complete──► Completing
///             │                                            │   │
///             └──────────completion via poll()─────────────┘   │
///                                                              ▼
///   Free ◄──data written── TransferringC2H ◄──C2H data── (response queued)
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestState {
    /// On the free list; owns nothing but its (reusable) buffer.
    Free,
    /// Host→controller data goes through the transport: an R2T asking for
    /// the whole transfer was queued (TTAG = slot index) and H2CData PDUs are
    /// being collected into the slot buffer.
    AwaitingH2CData,
    /// The command and all of its input data are here; next stop is
    /// `QueuePair::execute`.
    ReadyToExecute,
    /// `QueuePair::execute` returned `Pending`: the backend owns the command
    /// until its completion is delivered through `QueuePair::poll`. The slot
    /// and its buffer stay reserved.
    Executing,
    /// Controller→host data (C2HData PDU) was queued and references the slot
    /// buffer directly (vectored write, no copy); the slot is released when
    /// the socket has taken those bytes.
    TransferringC2H,
    /// The completion is known and the response capsule is being queued.
    /// Transient within one call: the slot goes to `TransferringC2H` when
    /// data is still in flight, else straight back to `Free`.
    Completing,
}

/// Direction of a command's data, from the opcode's (or FCTYPE's) low bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Xfer {
    None,
    HostToCtrl,
    CtrlToHost,
    /// Bidirectional (both bits set): not supported over NVMe/TCP.
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
    /// Host→controller bytes received so far (R2T path).
    pub received: u32,
    /// An H2CData PDU for this command failed its data digest: the command
    /// is completed with a transient transport error instead of executed.
    pub digest_error: bool,
    buf: AlignedBuf,
}

impl Slot {
    fn new() -> Slot {
        Slot {
            state: RequestState::Free,
            cmd: Command::default(),
            xfer: Xfer::None,
            len: 0,
            received: 0,
            digest_error: false,
            buf: AlignedBuf::new(),
        }
    }

    /// The first `len` bytes of the slot buffer, growing it if needed. The
    /// buffer grows to the next power of two (≥ 4 KiB, ≤ `max`), so a slot
    /// reallocates at most a handful of times over its life.
    pub fn data_mut(&mut self, len: usize, max: usize) -> &mut [u8] {
        if self.buf.len() < len {
            let want = len.next_power_of_two().clamp(4096, max.max(len));
            self.buf.grow(want);
        }
        &mut self.buf[..len]
    }

    /// The first `len` bytes of the slot buffer (must already be allocated).
    pub fn data(&self, len: usize) -> &[u8] {
        &self.buf[..len.min(self.buf.len())]
    }

    /// Bytes currently allocated for data.
    #[allow(dead_code)]
    pub fn capacity(&self) -> usize {
        self.buf.len()
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
}

#[allow(dead_code)]
impl Slots {
    /// A table with `n` free slots.
    pub fn new(n: usize) -> Slots {
        let mut s = Slots {
            slots: Vec::new(),
            free: Vec::new(),
            cid_busy: Box::new([0u64; 1024]),
            executing: 0,
        };
        s.grow(n);
        s
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
        s.xfer = Xfer::of(cmd);
        s.len = 0;
        s.received = 0;
        s.digest_error = false;
        s.state = RequestState::ReadyToExecute;
        Ok(idx)
    }

    /// Returns slot `idx` to the free list.
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
        let (w, b) = Self::cid_bit(s.cmd.cid());
        self.cid_busy[w] &= !b;
        self.free.push(idx);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alloc_release_and_conflicts() {
        let mut s = Slots::new(2);
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
        let mut s = Slots::new(1);
        let i = s.alloc(&Command::new(0x02, 1)).unwrap();
        let slot = s.get_mut(i).unwrap();
        slot.data_mut(512, 131072)[0] = 9;
        assert_eq!(slot.capacity(), 4096);
        let p = slot.data_mut(4096, 131072).as_ptr();
        assert_eq!(p, slot.data_mut(100, 131072).as_ptr());
        slot.data_mut(65536 + 1, 131072);
        assert_eq!(slot.capacity(), 131072);
        let p = slot.data_mut(131072, 131072).as_ptr();
        assert_eq!(p as usize % BUF_ALIGN, 0, "O_DIRECT alignment");
        assert_eq!(slot.data(1)[0], 9, "growing keeps the contents");
    }
}
