//! The malloc backend: a RAM disk.
//!
//! Owns one zeroed allocation of `num_blocks * block_size` bytes, shared by
//! every reactor thread (and the helper pool), and block reads, writes,
//! zeroing and deallocation on it. The memory comes from `calloc` (through
//! `std::alloc::System` with 16-byte alignment), which for large sizes maps
//! fresh anonymous pages: the kernel zeroes them lazily, so a 1 GiB default
//! disk costs no RSS until written.
//!
//! Soundness: several threads may read and write the same blocks at once
//! (hosts may race their own writes, as on any disk). Every access to the
//! disk memory is therefore atomic: the disk is viewed as `[AtomicU64]`
//! (block sizes are multiples of 8 and the base is 16-aligned) and copied
//! word by word with relaxed loads/stores. Racing writes to one block give
//! torn data (each 8-byte word comes from one of the writers), never
//! undefined behaviour. On x86-64 a relaxed atomic load/store is a plain
//! `mov`, so the copy loop costs little over `memcpy` (see the numbers in
//! docs/DESIGN.md).
//!
//! Slow work: zeroing more than [`INLINE_ZERO_BYTES`] (Write Zeroes, or
//! deallocate, whose blocks read back as zeroes) runs on the helper pool;
//! page-aligned stretches of such a range are handed back to the kernel
//! (`MADV_DONTNEED`: the pages read as zero again and stop costing RSS).

use std::alloc::{GlobalAlloc, Layout, System};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use nvmf_wire::status::Status;

use super::{byte_range, helper, Backend, BlockOp, CompletionSink, DsmRanges, IoTag, Submitted};
use crate::error::CoreError;

/// Alignment of the buffer. 16 keeps `System.alloc_zeroed` on `calloc`
/// (larger alignments would memset the whole buffer up front) and is a
/// multiple of `AtomicU64`'s alignment.
const ALIGN: usize = 16;
/// Bytes per atomic word.
const WORD: usize = 8;
/// Zeroing up to this many bytes (summed over a command's ranges) runs
/// inline; more goes to the helper pool.
pub const INLINE_ZERO_BYTES: u64 = 256 * 1024;
/// Page-aligned stretches at least this long are returned to the kernel
/// instead of being overwritten.
const MADVISE_MIN: usize = 2 << 20;

/// The disk memory. Freed when the last holder (backend or helper job) drops it.
struct Mem {
    base: NonNull<u8>,
    layout: Layout,
}

// SAFETY: `Mem` owns its allocation exclusively (freed once, in Drop) and
// every access to the bytes goes through `words`, i.e. through atomics, so
// any number of threads may use it at once.
unsafe impl Send for Mem {}
// SAFETY: as for `Send`: shared access is atomic only.
unsafe impl Sync for Mem {}

impl Drop for Mem {
    fn drop(&mut self) {
        // SAFETY: allocated in `MallocBackend::new` with this layout by the
        // same allocator, and freed only here.
        unsafe { System.dealloc(self.base.as_ptr(), self.layout) };
    }
}

impl Mem {
    /// The whole disk as atomic words.
    fn words(&self) -> &[AtomicU64] {
        // SAFETY: the allocation is `layout.size()` bytes (a multiple of 8:
        // block sizes are powers of two ≥ 512), 16-byte aligned, zero
        // initialised (a valid u64 everywhere), lives as long as `self`, and
        // is only ever accessed through this atomic view, so no non-atomic
        // access can race with it.
        unsafe {
            std::slice::from_raw_parts(
                self.base.as_ptr().cast::<AtomicU64>(),
                self.layout.size() / WORD,
            )
        }
    }

    /// Words of the byte range `[start, start + len)` (both multiples of 8).
    fn range(&self, start: usize, len: usize) -> &[AtomicU64] {
        &self.words()[start / WORD..(start + len) / WORD]
    }

    /// Zeroes `[start, start + len)`.
    fn zero(&self, start: usize, len: usize) {
        let mut start = start;
        let mut len = len;
        #[cfg(not(miri))]
        if len >= MADVISE_MIN {
            let page = page_size();
            let base = self.base.as_ptr() as usize;
            let a = (base + start).next_multiple_of(page);
            let b = (base + start + len) / page * page;
            if b > a && b - a >= MADVISE_MIN {
                // SAFETY: [a, b) is a whole number of pages inside our
                // private anonymous allocation (no allocator metadata lives
                // there); MADV_DONTNEED makes them read as zero. Other
                // threads access these bytes only atomically, and a racing
                // access sees the old value or zero, as with a racing
                // write of zeroes.
                let r =
                    unsafe { libc::madvise(a as *mut libc::c_void, b - a, libc::MADV_DONTNEED) };
                if r == 0 {
                    zero_words(self.range(start, a - base - start));
                    let end = start + len;
                    start = b - base;
                    len = end - start;
                }
            }
        }
        zero_words(self.range(start, len));
    }
}

#[cfg(not(miri))]
fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

/// Copies the disk words `src` into `dst` (same length in bytes).
#[inline]
fn load_words(src: &[AtomicU64], dst: &mut [u8]) {
    debug_assert_eq!(src.len() * WORD, dst.len());
    for (w, d) in src.iter().zip(dst.chunks_exact_mut(WORD)) {
        d.copy_from_slice(&w.load(Ordering::Relaxed).to_ne_bytes());
    }
}

/// Copies `src` into the disk words `dst` (same length in bytes).
#[inline]
fn store_words(dst: &[AtomicU64], src: &[u8]) {
    debug_assert_eq!(dst.len() * WORD, src.len());
    for (w, s) in dst.iter().zip(src.chunks_exact(WORD)) {
        let mut b = [0u8; WORD];
        b.copy_from_slice(s);
        w.store(u64::from_ne_bytes(b), Ordering::Relaxed);
    }
}

#[inline]
fn zero_words(dst: &[AtomicU64]) {
    for w in dst {
        w.store(0, Ordering::Relaxed);
    }
}

/// RAM-backed block device. Concurrent writes to overlapping blocks from
/// different queues race exactly as they would on any disk (torn data): the
/// host must order them.
pub struct MallocBackend {
    name: String,
    block_size: u32,
    num_blocks: u64,
    mem: Arc<Mem>,
}

impl std::fmt::Debug for MallocBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MallocBackend")
            .field("name", &self.name)
            .field("block_size", &self.block_size)
            .field("num_blocks", &self.num_blocks)
            .finish()
    }
}

impl MallocBackend {
    /// Allocate a zeroed RAM disk.
    pub fn new(name: &str, block_size: u32, num_blocks: u64) -> Result<MallocBackend, CoreError> {
        let err = |reason: String| CoreError::Bdev {
            name: name.to_string(),
            reason,
        };
        if !(block_size as usize).is_multiple_of(WORD) || block_size == 0 {
            return Err(err(format!(
                "block_size {block_size} is not a multiple of {WORD}"
            )));
        }
        let size = num_blocks
            .checked_mul(block_size as u64)
            .and_then(|s| usize::try_from(s).ok())
            .filter(|&s| s > 0 && s <= isize::MAX as usize - ALIGN)
            .ok_or_else(|| err("size does not fit in memory".to_string()))?;
        let layout =
            Layout::from_size_align(size, ALIGN).map_err(|e| err(format!("bad layout: {e}")))?;
        // SAFETY: layout has a non-zero size.
        let ptr = unsafe { System.alloc_zeroed(layout) };
        let base = NonNull::new(ptr).ok_or_else(|| err(format!("cannot allocate {size} bytes")))?;
        Ok(MallocBackend {
            name: name.to_string(),
            block_size,
            num_blocks,
            mem: Arc::new(Mem { base, layout }),
        })
    }

    fn range(&self, lba: u64, blocks: u64) -> Option<(usize, usize)> {
        byte_range(lba, blocks, self.block_size, self.num_blocks)
    }

    fn blocks_of(&self, len: usize) -> Option<u64> {
        let bs = self.block_size as usize;
        if !len.is_multiple_of(bs) {
            return None;
        }
        Some((len / bs) as u64)
    }

    fn write_zeroes(
        &self,
        lba: u64,
        blocks: u64,
        tag: IoTag,
        sink: &Arc<CompletionSink>,
    ) -> Submitted {
        let Some((start, len)) = self.range(lba, blocks) else {
            return Submitted::Done(Status::LBA_OUT_OF_RANGE.with_dnr());
        };
        if len as u64 <= INLINE_ZERO_BYTES {
            self.mem.zero(start, len);
            return Submitted::Done(Status::SUCCESS);
        }
        let mem = self.mem.clone();
        helper::run(sink, tag, move || {
            mem.zero(start, len);
            Status::SUCCESS
        })
    }
}

impl Backend for MallocBackend {
    fn name(&self) -> &str {
        &self.name
    }

    fn kind(&self) -> &'static str {
        "malloc"
    }

    fn block_size(&self) -> u32 {
        self.block_size
    }

    fn num_blocks(&self) -> u64 {
        self.num_blocks
    }

    fn deallocate_reads_zeroes(&self) -> bool {
        true
    }

    fn submit(&self, op: BlockOp<'_>, tag: IoTag, sink: &Arc<CompletionSink>) -> Submitted {
        let status = match op {
            BlockOp::Read { lba, buf } => {
                match self.blocks_of(buf.len()).and_then(|n| self.range(lba, n)) {
                    Some((start, len)) => {
                        load_words(self.mem.range(start, len), buf);
                        Status::SUCCESS
                    }
                    None => Status::LBA_OUT_OF_RANGE.with_dnr(),
                }
            }
            BlockOp::Write { lba, buf, .. } => {
                match self.blocks_of(buf.len()).and_then(|n| self.range(lba, n)) {
                    Some((start, len)) => {
                        store_words(self.mem.range(start, len), buf);
                        Status::SUCCESS
                    }
                    None => Status::LBA_OUT_OF_RANGE.with_dnr(),
                }
            }
            BlockOp::Flush => Status::SUCCESS,
            BlockOp::WriteZeroes { lba, blocks, .. } => {
                return self.write_zeroes(lba, blocks, tag, sink)
            }
        };
        Submitted::Done(status)
    }

    /// Deallocated blocks read back as zeroes (DLFEAT = 001b): every range
    /// is zeroed, inline when the command covers at most
    /// [`INLINE_ZERO_BYTES`], else as one helper job for all its ranges.
    fn deallocate(
        &self,
        ranges: DsmRanges<'_>,
        tag: IoTag,
        sink: &Arc<CompletionSink>,
    ) -> Submitted {
        let mut total: u64 = 0;
        for (lba, blocks) in ranges.iter() {
            match self.range(lba, blocks) {
                Some((_, len)) => total = total.saturating_add(len as u64),
                None => return Submitted::Done(Status::LBA_OUT_OF_RANGE.with_dnr()),
            }
        }
        if total <= INLINE_ZERO_BYTES {
            for (lba, blocks) in ranges.iter() {
                if let Some((start, len)) = self.range(lba, blocks) {
                    self.mem.zero(start, len);
                }
            }
            return Submitted::Done(Status::SUCCESS);
        }
        // The descriptors may live in a receive buffer that moves: copy
        // the byte ranges (rare, expensive command: one allocation).
        let list: Vec<(usize, usize)> = ranges
            .iter()
            .filter_map(|(lba, blocks)| self.range(lba, blocks))
            .collect();
        let mem = self.mem.clone();
        helper::run(sink, tag, move || {
            for (start, len) in list {
                mem.zero(start, len);
            }
            Status::SUCCESS
        })
    }
}
