//! Which zero-copy send calls (`MSG_ZEROCOPY`) the kernel has finished
//! with. Bookkeeping only; `socket.rs` makes the calls and reads the
//! socket's error queue.
//!
//! The kernel numbers every `sendmsg(MSG_ZEROCOPY)` that sent something,
//! from 0 per socket, and later reports ranges `[lo, hi]` of numbers whose
//! pages it no longer uses (on the socket's error queue; possibly out of
//! order, possibly merged). Until a call's number is reported, the slot
//! buffers it sent from must not be reused or freed: the kernel may still
//! read them (a NIC's DMA, a retransmission). [`ZcTracker`] keeps the
//! watermark below which every call is done, plus the ranges reported ahead
//! of it; a slot is released once the watermark passes the last call that
//! carried its bytes (the target's `nvmf-tcp` send queue, the host's
//! `nvmf-host` transport).
//!
//! The kernel also says when it copied after all (`SO_EE_CODE_ZEROCOPY_COPIED`:
//! loopback, a device without scatter-gather): then zero-copy costs a
//! notification and gains nothing, so after [`COPIED_TO_STOP`] such calls
//! in a row the connection stops asking ([`ZcTracker::copies_everything`]).

/// Zero-copy calls a connection may have unreported; beyond, sends copy.
pub const MAX_OUTSTANDING: u32 = 1024;

/// Reported calls in a row that the kernel copied after which zero-copy
/// is not worth asking for on this connection.
pub const COPIED_TO_STOP: u32 = 64;

/// The zero-copy send calls of one socket.
#[derive(Debug, Default)]
pub struct ZcTracker {
    /// The number the next zero-copy call gets.
    next: u32,
    /// Every call numbered below this is done.
    done_below: u32,
    /// Reported ranges above the watermark (out of order), disjoint.
    ahead: Vec<(u32, u32)>,
    /// Reported calls in a row the kernel copied.
    copied_run: u32,
    /// Calls made, and reported calls the kernel copied.
    pub calls: u64,
    pub copied: u64,
}

/// `a < b` in sequence space (wrapping u32).
#[inline]
fn before(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) < 0
}

impl ZcTracker {
    /// Calls made and not yet reported done.
    #[inline]
    pub fn outstanding(&self) -> u32 {
        self.next.wrapping_sub(self.done_below)
    }

    /// Whether another zero-copy call may be made now.
    #[inline]
    pub fn has_room(&self) -> bool {
        self.outstanding() < MAX_OUTSTANDING
    }

    /// A zero-copy call sent something: its number.
    #[inline]
    pub fn sent(&mut self) -> u32 {
        let s = self.next;
        self.next = self.next.wrapping_add(1);
        self.calls += 1;
        s
    }

    /// Whether call `seq` and every call before it are done.
    #[inline]
    pub fn is_done(&self, seq: u32) -> bool {
        before(seq, self.done_below)
    }

    /// The kernel reported calls `lo..=hi` done (`copied`: it copied their
    /// data after all). Numbers never sent, or reported twice, are ignored.
    pub fn complete(&mut self, lo: u32, hi: u32, copied: bool) {
        if before(hi, lo) {
            return;
        }
        // Clip to what was sent and is not yet done.
        let lo = if before(lo, self.done_below) {
            self.done_below
        } else {
            lo
        };
        if before(hi, lo) || !before(hi, self.next) {
            return;
        }
        let n = hi.wrapping_sub(lo).wrapping_add(1);
        if copied {
            self.copied += u64::from(n);
            self.copied_run = self.copied_run.saturating_add(n);
        } else {
            self.copied_run = 0;
        }
        if lo == self.done_below {
            self.done_below = hi.wrapping_add(1);
            // Ranges reported earlier that now join the watermark.
            while let Some(i) = self
                .ahead
                .iter()
                .position(|&(l, h)| !before(self.done_below, l) && !before(h, self.done_below))
            {
                let (_, h) = self.ahead.swap_remove(i);
                self.done_below = h.wrapping_add(1);
            }
            let w = self.done_below;
            self.ahead.retain(|&(_, h)| !before(h, w));
        } else if self.ahead.len() < MAX_OUTSTANDING as usize {
            self.ahead.push((lo, hi));
        }
    }

    /// The kernel has copied the last [`COPIED_TO_STOP`] calls in a row.
    pub fn copies_everything(&self) -> bool {
        self.copied_run >= COPIED_TO_STOP
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_order_reports_move_the_watermark() {
        let mut t = ZcTracker::default();
        let a = t.sent();
        let b = t.sent();
        assert_eq!((a, b, t.outstanding()), (0, 1, 2));
        assert!(!t.is_done(a));
        t.complete(0, 0, false);
        assert!(t.is_done(a) && !t.is_done(b));
        t.complete(1, 1, false);
        assert!(t.is_done(b));
        assert_eq!(t.outstanding(), 0);
    }

    #[test]
    fn out_of_order_reports_wait_for_the_gap() {
        let mut t = ZcTracker::default();
        for _ in 0..6 {
            t.sent();
        }
        t.complete(3, 4, false);
        t.complete(1, 1, false);
        assert!(!t.is_done(0), "0 not reported");
        assert!(!t.is_done(1), "done only with everything before it");
        t.complete(0, 0, false);
        assert!(t.is_done(1));
        assert!(!t.is_done(2), "2 not reported");
        t.complete(2, 2, false);
        assert!(t.is_done(4));
        assert!(!t.is_done(5));
        assert_eq!(t.outstanding(), 1);
        t.complete(5, 5, false);
        assert_eq!(t.outstanding(), 0);
        assert!(t.ahead.is_empty());
    }

    #[test]
    fn merged_duplicate_and_unknown_reports() {
        let mut t = ZcTracker::default();
        for _ in 0..4 {
            t.sent();
        }
        t.complete(0, 2, false);
        assert!(t.is_done(2) && !t.is_done(3));
        t.complete(1, 2, false); // again: nothing changes
        t.complete(7, 9, false); // never sent: ignored
        t.complete(3, 2, false); // backwards: ignored
        assert!(!t.is_done(3));
        assert_eq!(t.outstanding(), 1);
        t.complete(2, 3, false); // overlaps the watermark
        assert_eq!(t.outstanding(), 0);
    }

    #[test]
    fn numbers_wrap() {
        let mut t = ZcTracker {
            next: u32::MAX - 1,
            done_below: u32::MAX - 1,
            ..Default::default()
        };
        let a = t.sent();
        let b = t.sent();
        let c = t.sent();
        assert_eq!((a, b, c), (u32::MAX - 1, u32::MAX, 0));
        t.complete(u32::MAX, 0, false);
        assert!(!t.is_done(a));
        t.complete(u32::MAX - 1, u32::MAX - 1, false);
        assert!(t.is_done(c));
        assert_eq!(t.outstanding(), 0);
    }

    #[test]
    fn copies_in_a_row_turn_it_off_and_a_real_one_resets() {
        let mut t = ZcTracker::default();
        for _ in 0..COPIED_TO_STOP + 1 {
            t.sent();
        }
        t.complete(0, COPIED_TO_STOP - 2, true);
        assert!(!t.copies_everything());
        t.complete(COPIED_TO_STOP - 1, COPIED_TO_STOP - 1, true);
        assert!(t.copies_everything());
        t.complete(COPIED_TO_STOP, COPIED_TO_STOP, false);
        assert!(!t.copies_everything());
        assert_eq!(t.copied, u64::from(COPIED_TO_STOP));
    }

    #[test]
    fn room_is_bounded() {
        let mut t = ZcTracker::default();
        for _ in 0..MAX_OUTSTANDING {
            assert!(t.has_room());
            t.sent();
        }
        assert!(!t.has_room());
        t.complete(0, 0, false);
        assert!(t.has_room());
    }
}
