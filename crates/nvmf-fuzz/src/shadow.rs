//! The data-integrity model: what namespace 1 (the RAM disk) must hold given
//! the writes whose successful completions the host saw, and the check that
//! reads return exactly that (namespace 2, the null disk, reads zeroes).
//!
//! Execution order is only known up to the host's view: a write executes
//! somewhere between the action that sent it (`sent`) and the one that saw
//! its completion. Blocks written by commands whose windows overlap become
//! "unknown" until the next unambiguous write; a read skips unknown blocks,
//! blocks written after it was sent, and blocks with a write in flight.
//! Writes whose outcome the host never learns (connection dropped or
//! terminated first) make their blocks unknown. Anything the harness cannot
//! follow (raw bytes or SQEs, corrupted PDUs) turns the model off.

use std::collections::HashMap;

/// Namespace 1 block size.
pub const BS: usize = 512;

/// A write (or Write Zeroes / deallocate) the host has in flight.
#[derive(Debug, Clone)]
pub struct PendingWrite {
    pub slba: u64,
    pub count: u32,
    /// The bytes sent (`None`: unknown, e.g. an H2CData was faulty;
    /// ignored for `zeroes`).
    pub data: Option<Vec<u8>>,
    /// Write Zeroes: the blocks read back as zeroes.
    pub zeroes: bool,
    pub sent: u64,
}

/// A read in flight: the data that arrived so far.
#[derive(Debug, Clone)]
pub struct PendingRead {
    /// Namespace 2 (null: always zeroes).
    pub null: bool,
    pub slba: u64,
    pub count: u32,
    pub block_size: usize,
    pub buf: Vec<u8>,
    pub sent: u64,
}

struct Block {
    /// `None`: unknown.
    data: Option<Box<[u8; BS]>>,
    /// When the host learned of the last write to it.
    t: u64,
}

/// The expected content of namespace 1 (absent blocks are zero).
pub struct Shadow {
    blocks: HashMap<u64, Block>,
    /// False once the host did something the model cannot follow.
    pub valid: bool,
    /// Some Reservation Acquire succeeded in this case: reads and writes
    /// may get Reservation Conflict from now on (never before).
    pub reserved: bool,
    clock: u64,
}

impl Default for Shadow {
    fn default() -> Self {
        Shadow {
            blocks: HashMap::new(),
            valid: true,
            reserved: false,
            clock: 0,
        }
    }
}

impl Shadow {
    /// A new point in the host's timeline.
    pub fn now(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// The host saw write `w` complete successfully.
    pub fn apply(&mut self, w: &PendingWrite) {
        let now = self.now();
        for i in 0..w.count {
            let lba = w.slba.wrapping_add(u64::from(i));
            let prev = self.blocks.get(&lba).map_or(0, |b| b.t);
            let data = if prev > w.sent {
                // Another write to this block completed after this one was
                // sent: either may have gone last.
                None
            } else if w.zeroes {
                Some(Box::new([0; BS]))
            } else {
                w.data.as_ref().and_then(|d| {
                    let at = i as usize * BS;
                    d.get(at..at + BS)
                        .map(|b| Box::new(<[u8; BS]>::try_from(b).expect("block")))
                })
            };
            self.blocks.insert(lba, Block { data, t: now });
        }
    }

    /// The outcome of a write to these blocks will never be known.
    pub fn forget(&mut self, slba: u64, count: u32) {
        let now = self.now();
        for i in 0..count {
            let lba = slba.wrapping_add(u64::from(i));
            self.blocks.insert(lba, Block { data: None, t: now });
        }
    }

    /// Checks a read that completed successfully; `busy(lba)` says whether
    /// a write to that block is still in flight. Returns the number of
    /// blocks compared with known content.
    pub fn check_read(&self, r: &PendingRead, busy: impl Fn(u64) -> bool) -> usize {
        assert_eq!(
            r.buf.len(),
            r.count as usize * r.block_size,
            "successful read of {} blocks at LBA {} returned {} bytes",
            r.count,
            r.slba,
            r.buf.len()
        );
        if r.null {
            assert!(
                r.buf.iter().all(|&b| b == 0),
                "read from the null namespace returned non-zero data"
            );
            return r.count as usize;
        }
        if !self.valid {
            return 0;
        }
        let mut checked = 0;
        for i in 0..r.count {
            let lba = r.slba.wrapping_add(u64::from(i));
            if busy(lba) {
                continue;
            }
            let at = i as usize * BS;
            let got = &r.buf[at..at + BS];
            checked += 1;
            match self.blocks.get(&lba) {
                None => assert!(
                    got.iter().all(|&b| b == 0),
                    "read of never-written LBA {lba} returned non-zero data"
                ),
                Some(b) if b.t > r.sent => checked -= 1,
                Some(Block { data: None, .. }) => checked -= 1,
                Some(Block { data: Some(d), .. }) => assert!(
                    got == &d[..],
                    "read of LBA {lba} returned data that differs from the last write \
                     (first bytes {:02x?}, expected {:02x?})",
                    &got[..8],
                    &d[..8]
                ),
            }
        }
        checked
    }
}
