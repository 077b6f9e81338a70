//! The malloc backend: a RAM disk.
//!
//! Owns one zeroed allocation of `num_blocks * block_size` bytes, shared by
//! every reactor thread, and block reads/writes/zeroing on it. The memory
//! comes from `calloc` (through `std::alloc::System` with 16-byte alignment),
//! which for large sizes maps fresh anonymous pages: the kernel zeroes them
//! lazily, so a 1 GiB default disk costs no RSS until written.

use std::alloc::{GlobalAlloc, Layout, System};
use std::ptr::NonNull;
use std::sync::Arc;

use nvmf_wire::status::Status;

use super::{byte_range, Backend, BlockOp, CompletionSink, IoTag, Submitted};
use crate::error::CoreError;

/// Alignment of the buffer. 16 keeps `System.alloc_zeroed` on `calloc`
/// (larger alignments would memset the whole buffer up front).
const ALIGN: usize = 16;

/// RAM-backed block device. Concurrent writes to overlapping blocks from
/// different queues race exactly as they would on any disk: the host must
/// order them.
pub struct MallocBackend {
    name: String,
    block_size: u32,
    num_blocks: u64,
    base: NonNull<u8>,
    layout: Layout,
}

// SAFETY: the buffer is owned by this struct for its whole life and freed in
// Drop; all access goes through `submit`, which copies with raw pointers inside
// the bounds checked by `byte_range`. Sharing between threads is the point of
// a block device; overlapping concurrent writes are the host's business.
unsafe impl Send for MallocBackend {}
// SAFETY: see `Send` above; no method hands out references into the buffer.
unsafe impl Sync for MallocBackend {}

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
            base,
            layout,
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

    fn zero(&self, lba: u64, blocks: u64) -> Status {
        match self.range(lba, blocks) {
            Some((start, len)) => {
                // SAFETY: start + len <= layout.size() (checked by byte_range
                // against num_blocks * block_size == layout.size()).
                unsafe { std::ptr::write_bytes(self.base.as_ptr().add(start), 0, len) };
                Status::SUCCESS
            }
            None => Status::LBA_OUT_OF_RANGE.with_dnr(),
        }
    }
}

impl Drop for MallocBackend {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout by the same allocator.
        unsafe { System.dealloc(self.base.as_ptr(), self.layout) };
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

    fn submit(&self, op: BlockOp<'_>, _tag: IoTag, _sink: &Arc<CompletionSink>) -> Submitted {
        let status = match op {
            BlockOp::Read { lba, buf } => {
                match self.blocks_of(buf.len()).and_then(|n| self.range(lba, n)) {
                    Some((start, len)) => {
                        // SAFETY: [start, start+len) lies inside the buffer
                        // (byte_range), `buf` is exactly len bytes and cannot
                        // alias our private allocation.
                        unsafe {
                            std::ptr::copy_nonoverlapping(
                                self.base.as_ptr().add(start),
                                buf.as_mut_ptr(),
                                len,
                            )
                        };
                        Status::SUCCESS
                    }
                    None => Status::LBA_OUT_OF_RANGE.with_dnr(),
                }
            }
            BlockOp::Write { lba, buf, .. } => {
                match self.blocks_of(buf.len()).and_then(|n| self.range(lba, n)) {
                    Some((start, len)) => {
                        // SAFETY: as for Read, in the other direction.
                        unsafe {
                            std::ptr::copy_nonoverlapping(
                                buf.as_ptr(),
                                self.base.as_ptr().add(start),
                                len,
                            )
                        };
                        Status::SUCCESS
                    }
                    None => Status::LBA_OUT_OF_RANGE.with_dnr(),
                }
            }
            BlockOp::Flush => Status::SUCCESS,
            BlockOp::WriteZeroes { lba, blocks } => self.zero(lba, blocks),
        };
        Submitted::Done(status)
    }

    /// Deallocated blocks read back as zeroes (DLFEAT = 001b).
    fn deallocate(&self, lba: u64, blocks: u64) -> Status {
        self.zero(lba, blocks)
    }
}
