//! The null backend: reads return zeroes, writes are discarded.
//!
//! A read's buffer is not filled: it answers [`Submitted::ZeroData`] and the
//! transport sends the shared zero buffer ([`super::zeroes`]); only reads
//! longer than that buffer get their own buffer zeroed.
//!
//! Owns nothing but its geometry; useful to measure the target's own overhead.

use std::sync::Arc;

use nvmf_wire::status::Status;

use super::{byte_range, Backend, BlockOp, CompletionSink, DsmRanges, IoTag, Submitted};

/// A device of `num_blocks` blocks with no storage behind it.
#[derive(Debug)]
pub struct NullBackend {
    name: String,
    block_size: u32,
    num_blocks: u64,
}

impl NullBackend {
    pub fn new(name: &str, block_size: u32, num_blocks: u64) -> NullBackend {
        NullBackend {
            name: name.to_string(),
            block_size,
            num_blocks,
        }
    }

    fn check(&self, lba: u64, len: usize) -> Status {
        let bs = self.block_size as usize;
        if !len.is_multiple_of(bs) {
            return Status::LBA_OUT_OF_RANGE.with_dnr();
        }
        self.check_blocks(lba, (len / bs) as u64)
    }

    fn check_blocks(&self, lba: u64, blocks: u64) -> Status {
        match byte_range(lba, blocks, self.block_size, self.num_blocks) {
            Some(_) => Status::SUCCESS,
            None => Status::LBA_OUT_OF_RANGE.with_dnr(),
        }
    }
}

impl Backend for NullBackend {
    fn name(&self) -> &str {
        &self.name
    }

    fn kind(&self) -> &'static str {
        "null"
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
                let s = self.check(lba, buf.len());
                if !s.is_success() {
                    s
                } else if super::zeroes(buf.len()).is_some() {
                    return Submitted::ZeroData;
                } else {
                    buf.fill(0);
                    s
                }
            }
            BlockOp::Write { lba, buf, .. } => self.check(lba, buf.len()),
            BlockOp::Flush => Status::SUCCESS,
            BlockOp::WriteZeroes { lba, blocks, .. } => self.check_blocks(lba, blocks),
        };
        Submitted::Done(status)
    }

    fn deallocate(
        &self,
        ranges: DsmRanges<'_>,
        _tag: IoTag,
        _sink: &Arc<CompletionSink>,
    ) -> Submitted {
        for (lba, blocks) in ranges.iter() {
            let s = self.check_blocks(lba, blocks);
            if !s.is_success() {
                return Submitted::Done(s);
            }
        }
        Submitted::Done(Status::SUCCESS)
    }
}
