//! The malloc backend: a RAM disk.
//!
//! Owns one zeroed allocation of `num_blocks * block_size` bytes, shared by
//! every reactor thread (and the helper pool), and block reads, writes,
//! zeroing and deallocation on it.
//!
//! Memory is reserved when the bdev is created, as SPDK's malloc bdev does:
//! an anonymous mapping asked for transparent huge pages (`MADV_HUGEPAGE`)
//! and populated at once (`MADV_POPULATE_WRITE`). Creation fails with a
//! clear error when the memory is not there, instead of the daemon being
//! OOM-killed in the middle of a host's writes later; and no host I/O ever
//! pays a page fault (a fresh 4 KiB page costs ~1-2 µs of zeroing in the
//! fault, a fresh huge page ~100 µs of compaction and zeroing: on a reactor
//! that is a stall). Huge pages also cut the TLB misses of random I/O over a
//! large disk. About 0.13 s per GiB at creation on this machine kind.
//!
//! Soundness: several threads may read and write the same blocks at once
//! (hosts may race their own writes, as on any disk). The disk memory is
//! therefore never accessed through Rust references to plain bytes: on
//! x86-64 block copies are one `rep movsb` in inline assembly (opaque to the
//! compiler, so a racing access is a hardware-level race with defined,
//! torn-data results, like a DMA engine's), elsewhere and under Miri the
//! disk is viewed as `[AtomicU64]` and copied word by word with relaxed
//! loads/stores. Racing writes to one block give torn data, never undefined
//! behaviour. `rep movsb` moves whole cache lines without reading the
//! destination first, which the word loop cannot: ~200 ns less per 4 KiB
//! write to cold memory (numbers in docs/DESIGN.md).
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
use crate::BdevError;

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
    /// Bytes of the disk (a multiple of 8).
    size: usize,
    /// How it was allocated (and is freed).
    alloc: Alloc,
}

enum Alloc {
    /// `mmap` of this many bytes (the size rounded up to whole huge pages).
    #[cfg_attr(miri, allow(dead_code))]
    Mapped(usize),
    /// `System.alloc_zeroed` (Miri, which has no mmap).
    #[cfg_attr(not(miri), allow(dead_code))]
    Heap(Layout),
}

// SAFETY: `Mem` owns its allocation exclusively (freed once, in Drop) and
// every access to the bytes goes through `words`, i.e. through atomics, so
// any number of threads may use it at once.
unsafe impl Send for Mem {}
// SAFETY: as for `Send`: shared access is atomic only.
unsafe impl Sync for Mem {}

impl Drop for Mem {
    fn drop(&mut self) {
        match self.alloc {
            // SAFETY: mapped in `reserve` with this length, unmapped only here.
            Alloc::Mapped(len) => unsafe {
                libc::munmap(self.base.as_ptr().cast(), len);
            },
            // SAFETY: allocated in `reserve` with this layout by the same
            // allocator, and freed only here.
            Alloc::Heap(layout) => unsafe { System.dealloc(self.base.as_ptr(), layout) },
        }
    }
}

impl Mem {
    /// The whole disk as atomic words.
    fn words(&self) -> &[AtomicU64] {
        // SAFETY: the allocation is `size` bytes (a multiple of 8:
        // block sizes are powers of two ≥ 512), 16-byte aligned, zero
        // initialised (a valid u64 everywhere), lives as long as `self`, and
        // is only ever accessed through this atomic view or by the inline
        // `rep movsb` of `copy_in`/`copy_out` (which the compiler cannot see
        // into: it acts as byte-wise relaxed atomic copies would), so no
        // plain Rust access can race with it.
        unsafe {
            std::slice::from_raw_parts(self.base.as_ptr().cast::<AtomicU64>(), self.size / WORD)
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

/// Copies the disk bytes `[start, start + dst.len())` into `dst`. Not
/// inlined, so that profiles (callgrind counts every byte of a `rep movsb`)
/// can tell the copy from the rest.
#[inline(never)]
fn copy_out(mem: &Mem, start: usize, dst: &mut [u8]) {
    let src = mem.range(start, dst.len());
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    // SAFETY: `src` is `dst.len()` bytes of the disk (checked by `range`),
    // `dst` a distinct exclusive buffer; the copy reads only `src` and
    // writes only `dst`; DF is clear at any Rust call boundary (SysV ABI).
    unsafe {
        std::arch::asm!(
            "rep movsb",
            inout("rcx") dst.len() => _,
            inout("rsi") src.as_ptr() => _,
            inout("rdi") dst.as_mut_ptr() => _,
            options(nostack, preserves_flags)
        );
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    for (w, d) in src.iter().zip(dst.chunks_exact_mut(WORD)) {
        d.copy_from_slice(&w.load(Ordering::Relaxed).to_ne_bytes());
    }
}

/// Copies `src` into the disk bytes `[start, start + src.len())`.
#[inline(never)]
fn copy_in(mem: &Mem, start: usize, src: &[u8]) {
    let dst = mem.range(start, src.len());
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    // SAFETY: as in `copy_out`, the other way round: writes only the
    // `src.len()` disk bytes of `dst` (memory the atomics of `dst` cover,
    // so writing it through a shared reference is allowed: `AtomicU64` is
    // an `UnsafeCell`).
    unsafe {
        std::arch::asm!(
            "rep movsb",
            inout("rcx") src.len() => _,
            inout("rsi") src.as_ptr() => _,
            inout("rdi") dst.as_ptr() => _,
            options(nostack, preserves_flags)
        );
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
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

/// Huge page size the mapping is rounded to (x86-64 and arm64 with 4 KiB pages).
#[cfg(not(miri))]
const HUGE_PAGE: usize = 2 << 20;

/// Reserves `size` zeroed bytes: mapped, asked for huge pages, populated.
#[cfg(not(miri))]
fn reserve(size: usize) -> Result<Mem, String> {
    let len = size
        .checked_next_multiple_of(HUGE_PAGE)
        .ok_or_else(|| "size does not fit in memory".to_string())?;
    // SAFETY: a fresh private anonymous mapping; no existing memory is touched.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(format!(
            "cannot map {size} bytes: {}",
            std::io::Error::last_os_error()
        ));
    }
    let mem = Mem {
        base: NonNull::new(ptr.cast()).ok_or_else(|| "mmap returned NULL".to_string())?,
        size,
        alloc: Alloc::Mapped(len),
    };
    // SAFETY (both calls): advice on our own fresh mapping. Huge pages are
    // a hint (THP may be off: then 4 KiB pages, still populated).
    unsafe { libc::madvise(ptr, len, libc::MADV_HUGEPAGE) };
    // MADV_POPULATE_WRITE (Linux 5.14) faults every page in now, or fails
    // with ENOMEM; older kernels say EINVAL: touch one byte per page then.
    const MADV_POPULATE_WRITE: libc::c_int = 23;
    if unsafe { libc::madvise(ptr, len, MADV_POPULATE_WRITE) } != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINVAL) {
            return Err(format!("cannot reserve {size} bytes of memory: {e}"));
        }
        for w in mem.words().iter().step_by(page_size() / WORD) {
            w.store(0, Ordering::Relaxed);
        }
    }
    Ok(mem)
}

/// Miri has no mmap: a zeroed heap allocation.
#[cfg(miri)]
fn reserve(size: usize) -> Result<Mem, String> {
    let layout = Layout::from_size_align(size, ALIGN).map_err(|e| format!("bad layout: {e}"))?;
    // SAFETY: layout has a non-zero size.
    let ptr = unsafe { System.alloc_zeroed(layout) };
    let base = NonNull::new(ptr).ok_or_else(|| format!("cannot allocate {size} bytes"))?;
    Ok(Mem {
        base,
        size,
        alloc: Alloc::Heap(layout),
    })
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
    pub fn new(name: &str, block_size: u32, num_blocks: u64) -> Result<MallocBackend, BdevError> {
        let err = |reason: String| BdevError {
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
        let mem = reserve(size).map_err(err)?;
        Ok(MallocBackend {
            name: name.to_string(),
            block_size,
            num_blocks,
            mem: Arc::new(mem),
        })
    }

    /// Bytes of the disk resident in memory now (`mincore`), for tests.
    #[cfg(all(test, not(miri)))]
    pub(super) fn resident_bytes(&self) -> usize {
        let page = page_size();
        let len = self.mem.size.next_multiple_of(page);
        let mut vec = vec![0u8; len / page];
        // SAFETY: our own mapping, `len` bytes from a page-aligned base (mmap);
        // `vec` has one byte per page.
        let r = unsafe { libc::mincore(self.mem.base.as_ptr().cast(), len, vec.as_mut_ptr()) };
        assert_eq!(r, 0, "mincore: {}", std::io::Error::last_os_error());
        vec.iter().filter(|&&b| b & 1 != 0).count() * page
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
                        debug_assert_eq!(len, buf.len());
                        copy_out(&self.mem, start, buf);
                        Status::SUCCESS
                    }
                    None => Status::LBA_OUT_OF_RANGE.with_dnr(),
                }
            }
            BlockOp::Write { lba, buf, .. } => {
                match self.blocks_of(buf.len()).and_then(|n| self.range(lba, n)) {
                    Some((start, len)) => {
                        debug_assert_eq!(len, buf.len());
                        copy_in(&self.mem, start, buf);
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
