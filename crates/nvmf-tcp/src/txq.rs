//! The send side of a connection: a queue of byte ranges ready for one
//! vectored write. PDU headers, responses and digests are appended to one
//! contiguous byte buffer; controller→host payloads are not copied there but
//! referenced in place in their request slot's buffer. The queue tells the
//! connection which slots it has finished sending so they can be freed.
//!
//! Zero-copy sends (`zerocopy.rs`): a call made with `MSG_ZEROCOPY` carries
//! only slot data ([`TxQueue::iovecs_split`] never puts header bytes in
//! one: the byte buffer is reused as soon as it is written). A slot whose
//! bytes went out in such a call is not released when written but parked
//! with the number of the last zero-copy call that carried it, and
//! released by [`TxQueue::release_done`] once the kernel reported that
//! call (and every earlier one) done.

use std::collections::VecDeque;

use nvmf_zerocopy::ZcTracker;

/// Written bytes at the front of the byte buffer worth a compaction (when
/// they are at least half of it).
const COMPACT_AT: usize = 64 << 10;

/// One stretch of output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seg {
    /// `bytes[previous end .. end]`.
    Bytes { end: usize },
    /// The first `len` bytes of slot `slot`'s data buffer, or with `zeroes`
    /// `len` bytes of the shared zero buffer (`nvmf_core::backend::zeroes`:
    /// a null read; the slot is still released when they have left).
    Slot { slot: u16, len: usize, zeroes: bool },
}

/// Pending output of one connection.
#[derive(Debug, Default)]
pub struct TxQueue {
    bytes: Vec<u8>,
    /// Start in `bytes` of the first not yet sent `Bytes` segment.
    bytes_pos: usize,
    segs: VecDeque<Seg>,
    /// Bytes of the front segment already written.
    head_done: usize,
    /// Bytes queued and not yet written.
    pending: usize,
    /// End in `bytes` of the last `Bytes` segment ever queued (where the
    /// next one starts): `bytes_pos` once all of them are written. Kept
    /// here so that queuing never searches the segments.
    committed: usize,
    /// The last zero-copy call that carried bytes of the front segment.
    head_zc: Option<u32>,
    /// Slots written by zero-copy calls, with the last call that carried
    /// each, in call order: released when the kernel is done with it.
    zc_parked: VecDeque<(u32, u16)>,
}

/// How the next write should be made ([`TxQueue::iovecs_split`]): a
/// copying send (`more`: zero-copy slot data comes right after, so the
/// header and its data share a segment), or only slot data with
/// `MSG_ZEROCOPY`.
pub use nvmf_zerocopy::SendKind;

impl TxQueue {
    pub fn with_capacity(bytes: usize, segs: usize) -> TxQueue {
        TxQueue {
            bytes: Vec::with_capacity(bytes),
            bytes_pos: 0,
            segs: VecDeque::with_capacity(segs),
            head_done: 0,
            pending: 0,
            committed: 0,
            head_zc: None,
            zc_parked: VecDeque::with_capacity(segs),
        }
    }

    /// Slots held for zero-copy calls the kernel has not reported done.
    pub fn zc_parked(&self) -> usize {
        self.zc_parked.len()
    }

    /// Bytes waiting to be written.
    pub fn pending(&self) -> usize {
        self.pending
    }

    /// Header/response bytes held in the queue's own buffer (written or
    /// not: the part already written is dropped by the next compaction).
    pub fn bytes_pending(&self) -> usize {
        self.bytes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pending == 0
    }

    /// The byte buffer to append PDU bytes to. Call `commit_bytes` after
    /// appending so the new bytes join the queue.
    pub fn buf(&mut self) -> &mut Vec<u8> {
        &mut self.bytes
    }

    /// Queues every byte appended to `buf()` since the last commit.
    pub fn commit_bytes(&mut self) {
        debug_assert_eq!(self.committed, self.last_bytes_end());
        let end = self.bytes.len();
        if end <= self.committed {
            return;
        }
        self.pending += end - self.committed;
        self.committed = end;
        match self.segs.back_mut() {
            Some(Seg::Bytes { end: e }) => *e = end,
            _ => self.segs.push_back(Seg::Bytes { end }),
        }
    }

    /// End of the last `Bytes` segment (where the next one starts), found
    /// the long way (`committed` keeps it; debug builds compare).
    fn last_bytes_end(&self) -> usize {
        self.segs
            .iter()
            .rev()
            .find_map(|s| match s {
                Seg::Bytes { end } => Some(*end),
                _ => None,
            })
            .unwrap_or(self.bytes_pos)
    }

    /// Queues `len` bytes of slot `slot`'s buffer (after any bytes appended so far).
    #[inline]
    pub fn push_slot(&mut self, slot: u16, len: usize) {
        self.push_slot_seg(slot, len, false);
    }

    /// Queues `len` (at most `backend::ZEROES_LEN`) zero bytes as slot
    /// `slot`'s data: `slot_done(slot)` comes when they have left, as for
    /// [`Self::push_slot`].
    #[inline]
    pub fn push_zeroes(&mut self, slot: u16, len: usize) {
        debug_assert!(len <= nvmf_core::backend::ZEROES_LEN);
        self.push_slot_seg(slot, len, true);
    }

    #[inline]
    fn push_slot_seg(&mut self, slot: u16, len: usize, zeroes: bool) {
        self.commit_bytes();
        if len > 0 {
            self.segs.push_back(Seg::Slot { slot, len, zeroes });
            self.pending += len;
        }
    }

    /// Fills `iov` with the queued output, in order; `slot_data(i, len)`
    /// returns the bytes of a slot segment. Returns how many entries were used.
    pub fn iovecs<'a, F>(&'a self, iov: &mut [std::io::IoSlice<'a>], slot_data: F) -> usize
    where
        F: Fn(u16, usize) -> &'a [u8],
    {
        self.fill(iov, slot_data, |_, _| false).0
    }

    /// Fills `iov` with the queued output, in order, up to (not including)
    /// the first segment for which `stop(index, segment)` is true; returns
    /// the entries used and whether `stop` ended it.
    #[inline]
    fn fill<'a, F, S>(
        &'a self,
        iov: &mut [std::io::IoSlice<'a>],
        slot_data: F,
        stop: S,
    ) -> (usize, bool)
    where
        F: Fn(u16, usize) -> &'a [u8],
        S: Fn(usize, &Seg) -> bool,
    {
        let mut n = 0;
        let mut start = self.bytes_pos;
        for (i, seg) in self.segs.iter().enumerate() {
            if n == iov.len() {
                break;
            }
            if stop(i, seg) {
                return (n, true);
            }
            let skip = if i == 0 { self.head_done } else { 0 };
            let s: &'a [u8] = match *seg {
                Seg::Bytes { end } => {
                    let b = &self.bytes[start + skip..end];
                    start = end;
                    b
                }
                Seg::Slot { slot, len, zeroes } => {
                    let d = if zeroes {
                        nvmf_core::backend::zeroes(len).unwrap_or(&[])
                    } else {
                        slot_data(slot, len)
                    };
                    d.get(skip..).unwrap_or(&[])
                }
            };
            if !s.is_empty() {
                iov[n] = std::io::IoSlice::new(s);
                n += 1;
            }
        }
        (n, false)
    }

    /// Like [`Self::iovecs`], but splits the output for zero-copy sends:
    /// when the front segment is slot data of at least `threshold` bytes,
    /// the run of slot segments from there (no header bytes) is one
    /// [`SendKind::ZeroCopy`] call; otherwise everything before the next
    /// such segment is a normal call.
    pub fn iovecs_split<'a, F>(
        &'a self,
        iov: &mut [std::io::IoSlice<'a>],
        threshold: usize,
        slot_data: F,
    ) -> (usize, SendKind)
    where
        F: Fn(u16, usize) -> &'a [u8],
    {
        let big = |seg: &Seg| matches!(*seg, Seg::Slot { len, .. } if len >= threshold);
        let zc = self.segs.front().is_some_and(big);
        let (n, stopped) = self.fill(iov, slot_data, |i, seg| {
            if zc {
                matches!(seg, Seg::Bytes { .. })
            } else {
                i > 0 && big(seg)
            }
        });
        let more = !zc && stopped;
        let kind = if zc {
            SendKind::ZeroCopy
        } else {
            SendKind::Copy { more }
        };
        (n, kind)
    }

    /// Marks `n` bytes as written; calls `slot_done(slot)` for every slot
    /// segment that was completely written.
    pub fn consume(&mut self, n: usize, slot_done: impl FnMut(u16)) {
        self.consume_call(n, None, slot_done)
    }

    /// Marks `n` bytes as written by zero-copy call number `seq`: the slots
    /// completed are parked until the kernel is done with the call (slots
    /// completed by a later copying call, after part went out zero-copy,
    /// too).
    pub fn consume_zc(&mut self, n: usize, seq: u32, slot_done: impl FnMut(u16)) {
        self.consume_call(n, Some(seq), slot_done)
    }

    /// Releases (`slot_done`) every parked slot whose zero-copy calls the
    /// tracker reports done.
    pub fn release_done(&mut self, t: &ZcTracker, mut slot_done: impl FnMut(u16)) -> usize {
        let mut n = 0;
        while let Some(&(seq, slot)) = self.zc_parked.front() {
            if !t.is_done(seq) {
                break;
            }
            self.zc_parked.pop_front();
            slot_done(slot);
            n += 1;
        }
        n
    }

    #[inline]
    fn consume_call(&mut self, mut n: usize, zc: Option<u32>, mut slot_done: impl FnMut(u16)) {
        n = n.min(self.pending);
        self.pending -= n;
        while n > 0 {
            let Some(front) = self.segs.front().copied() else {
                break;
            };
            let seg_len = match front {
                Seg::Bytes { end } => end - self.bytes_pos,
                Seg::Slot { len, .. } => len,
            };
            let left = seg_len - self.head_done;
            if n < left {
                self.head_done += n;
                if zc.is_some() {
                    self.head_zc = zc;
                }
                break;
            }
            n -= left;
            self.head_done = 0;
            self.segs.pop_front();
            let carried = zc.or(self.head_zc.take());
            match front {
                Seg::Bytes { end } => {
                    debug_assert!(zc.is_none(), "header bytes in a zero-copy call");
                    self.bytes_pos = end
                }
                Seg::Slot { slot, .. } => match carried {
                    Some(seq) => self.zc_parked.push_back((seq, slot)),
                    None => slot_done(slot),
                },
            }
        }
        if self.segs.is_empty() {
            self.bytes.clear();
            self.bytes_pos = 0;
            self.head_done = 0;
            self.committed = 0;
        } else if self.bytes_pos > COMPACT_AT && self.bytes_pos * 2 > self.bytes.len() {
            self.compact();
        }
    }

    /// Drops already written bytes from the front of the byte buffer (only
    /// when the queue never fully drains under sustained load).
    #[cold]
    fn compact(&mut self) {
        let cut = self.bytes_pos;
        self.bytes.drain(..cut);
        for s in self.segs.iter_mut() {
            if let Seg::Bytes { end } = s {
                *end -= cut;
            }
        }
        self.bytes_pos = 0;
        self.committed -= cut;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::IoSlice;

    fn collect(q: &TxQueue, slots: &[Vec<u8>]) -> Vec<u8> {
        let mut iov = [IoSlice::new(&[]); 16];
        let n = q.iovecs(&mut iov, |s, l| &slots[s as usize][..l]);
        iov[..n].iter().flat_map(|s| s.iter().copied()).collect()
    }

    fn split(q: &TxQueue, slots: &[Vec<u8>], thr: usize) -> (Vec<u8>, SendKind) {
        let mut iov = [IoSlice::new(&[]); 16];
        let (n, k) = q.iovecs_split(&mut iov, thr, |s, l| &slots[s as usize][..l]);
        (iov[..n].iter().flat_map(|s| s.iter().copied()).collect(), k)
    }

    /// A C2HData header, its data, the response; twice.
    fn two_reads(q: &mut TxQueue) {
        for s in 0..2u16 {
            q.buf().extend_from_slice(b"HDR");
            q.push_slot(s, 10);
            q.buf().extend_from_slice(b"RSP");
            q.commit_bytes();
        }
    }

    #[test]
    fn zero_copy_calls_carry_only_slot_data() {
        let slots = vec![vec![1u8; 10], vec![2u8; 10]];
        let mut q = TxQueue::with_capacity(64, 8);
        two_reads(&mut q);
        // Below the threshold: one copying call with everything.
        let (all, k) = split(&q, &slots, 11);
        assert_eq!(k, SendKind::Copy { more: false });
        assert_eq!(all.len(), 2 * 16);
        // At the threshold: the header alone (MSG_MORE), then the data.
        let (b, k) = split(&q, &slots, 10);
        assert_eq!(
            (b.as_slice(), k),
            (&b"HDR"[..], SendKind::Copy { more: true })
        );
        let mut done = Vec::new();
        q.consume(3, |s| done.push(s));
        let (b, k) = split(&q, &slots, 10);
        assert_eq!((b, k), (vec![1u8; 10], SendKind::ZeroCopy));
    }

    #[test]
    fn zero_copy_slots_wait_for_the_kernel_out_of_order() {
        let mut q = TxQueue::with_capacity(64, 8);
        two_reads(&mut q);
        let mut t = ZcTracker::default();
        let mut done = Vec::new();
        q.consume(3, |s| done.push(s)); // HDR
                                        // Slot 0 in two zero-copy calls (a short write), slot 1 in a third.
        let a = t.sent();
        q.consume_zc(4, a, |s| done.push(s));
        let b = t.sent();
        q.consume_zc(6, b, |s| done.push(s));
        q.consume(6, |s| done.push(s)); // RSP HDR
        let c = t.sent();
        q.consume_zc(10, c, |s| done.push(s));
        q.consume(3, |s| done.push(s)); // RSP
        assert!(q.is_empty());
        assert!(
            done.is_empty(),
            "nothing released before the kernel is done"
        );
        assert_eq!(q.zc_parked(), 2);
        // The kernel reports the last call first, then the second: slot 0
        // still waits for call a, slot 1 for everything up to c.
        t.complete(c, c, false);
        t.complete(b, b, false);
        assert_eq!(q.release_done(&t, |s| done.push(s)), 0);
        t.complete(a, a, false);
        assert_eq!(q.release_done(&t, |s| done.push(s)), 2);
        assert_eq!(done, vec![0, 1]);
        assert_eq!(q.zc_parked(), 0);
    }

    #[test]
    fn a_slot_finished_by_a_copying_call_after_a_zero_copy_one_waits_too() {
        let mut q = TxQueue::with_capacity(64, 8);
        q.push_slot(0, 10);
        let mut t = ZcTracker::default();
        let mut done = Vec::new();
        let a = t.sent();
        q.consume_zc(4, a, |s| done.push(s));
        // ENOBUFS, say: the rest went out in a copying call.
        q.consume(6, |s| done.push(s));
        assert!(done.is_empty());
        assert_eq!(q.release_done(&t, |s| done.push(s)), 0);
        t.complete(a, a, true);
        assert_eq!(q.release_done(&t, |s| done.push(s)), 1);
        assert_eq!(done, vec![0]);
    }

    #[test]
    fn bytes_and_slots_in_order_with_partial_writes() {
        let slots = vec![vec![7u8; 10], vec![9u8; 5]];
        let mut q = TxQueue::with_capacity(64, 8);
        q.buf().extend_from_slice(b"ab");
        q.push_slot(0, 10);
        q.buf().extend_from_slice(b"cd");
        q.commit_bytes();
        q.buf().extend_from_slice(b"e");
        q.commit_bytes();
        q.push_slot(1, 5);
        assert_eq!(q.pending(), 2 + 10 + 3 + 5);
        let all = collect(&q, &slots);
        assert_eq!(&all[..2], b"ab");
        assert_eq!(&all[2..12], &[7u8; 10]);
        assert_eq!(&all[12..15], b"cde");
        let mut done = Vec::new();
        q.consume(5, |s| done.push(s));
        assert!(done.is_empty());
        assert_eq!(collect(&q, &slots), all[5..].to_vec());
        q.consume(8, |s| done.push(s));
        assert_eq!(done, vec![0]);
        assert_eq!(collect(&q, &slots), all[13..].to_vec());
        q.consume(100, |s| done.push(s));
        assert_eq!(done, vec![0, 1]);
        assert!(q.is_empty());
        assert_eq!(q.buf().len(), 0);
    }
}
