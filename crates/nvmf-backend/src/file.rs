//! The file backend: a regular file or a block device served through the
//! per-thread io_uring (`uring.rs`), opened with O_DIRECT.
//!
//! Owns opening the file (O_DIRECT, falling back to buffered I/O with a log
//! line when the filesystem refuses it), checking its geometry against the
//! configuration (block devices: BLKSSZGET / BLKGETSIZE64; files: their
//! size), turning block operations into ring operations (Read/Write straight
//! into/out of the request's buffer, Flush = fdatasync, Write Zeroes =
//! fallocate(ZERO_RANGE) or writes of a zero buffer, followed by fdatasync
//! with FUA), and Deallocate (one io_uring operation punching every range's
//! hole for files; BLKDISCARD of every range as one helper-pool job for
//! block devices, since the ioctl is synchronous; a no-op where unsupported,
//! reported through DLFEAT). Nothing here blocks the calling reactor except
//! the bounce path below, which only a caller breaking the contract takes.
//!
//! Every operation completes asynchronously ([`Submitted::Pending`]): the
//! data buffer must stay valid and unmoved until the completion is posted to
//! the sink. For O_DIRECT it must also be 4096-byte aligned (nvmf-tcp's slot
//! buffers are); an unaligned buffer (a caller that does not follow the
//! contract) is bounced through a direct blocking pread/pwrite instead.

use std::fs::OpenOptions;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use nvmf_config::{BdevConfig, FileBdev};
use nvmf_wire::status::Status;

use super::uring::{self, NewOp, OpKind};
use super::{helper, Backend, BlockOp, CompletionSink, DsmRanges, IoTag, Submitted};
use crate::BdevError;

/// Alignment O_DIRECT buffers must have (covers 512 and 4096 devices).
pub const DIRECT_ALIGN: usize = 4096;

const BLKSSZGET: libc::c_ulong = 0x1268;
const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
const BLKDISCARD: libc::c_ulong = 0x1277;

/// What every in-flight operation keeps alive: the open file.
#[derive(Debug)]
pub struct FileShared {
    name: String,
    fd: OwnedFd,
    block_size: u32,
    zero_range: AtomicBool,
    /// Deallocate does something (punch hole / discard).
    dealloc: AtomicBool,
}

impl FileShared {
    pub(crate) fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn block_size(&self) -> u32 {
        self.block_size
    }

    /// The device refused a deallocate as unsupported: stop trying.
    pub(crate) fn dealloc_unsupported(&self) {
        if self.dealloc.swap(false, Ordering::Relaxed) {
            tracing::info!(bdev = %self.name, "deallocate unsupported: ignored from now on");
        }
    }

    pub(crate) fn zero_range_unsupported(&self) {
        if self.zero_range.swap(false, Ordering::Relaxed) {
            tracing::info!(bdev = %self.name, "fallocate(ZERO_RANGE) unsupported: Write Zeroes writes zero buffers");
        }
    }
}

/// A file or block device bdev.
#[derive(Debug)]
pub struct FileBackend {
    shared: Arc<FileShared>,
    filename: String,
    block_size: u32,
    num_blocks: u64,
    readonly: bool,
    direct: bool,
    is_block_device: bool,
    /// Deallocated blocks read back as zeroes (DLFEAT).
    dealloc_zeroes: bool,
}

fn ioctl_u64(fd: RawFd, req: libc::c_ulong) -> std::io::Result<u64> {
    let mut v: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes one u64 to the pointer.
    let r = unsafe { libc::ioctl(fd, req as _, &mut v as *mut u64) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(v)
}

fn ioctl_int(fd: RawFd, req: libc::c_ulong) -> std::io::Result<u32> {
    let mut v: libc::c_int = 0;
    // SAFETY: BLKSSZGET writes one int to the pointer.
    let r = unsafe { libc::ioctl(fd, req as _, &mut v as *mut libc::c_int) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(v as u32)
}

/// Size in bytes and logical block size of a block device.
pub fn block_device_geometry(fd: RawFd) -> std::io::Result<(u64, u32)> {
    Ok((ioctl_u64(fd, BLKGETSIZE64)?, ioctl_int(fd, BLKSSZGET)?))
}

impl FileBackend {
    /// Opens the file a bdev entry names and checks its geometry.
    pub fn new(cfg: &BdevConfig, f: &FileBdev) -> Result<FileBackend, BdevError> {
        let err = |reason: String| BdevError {
            name: cfg.name.clone(),
            reason,
        };
        uring::available().map_err(err)?;
        let open = |direct: bool| {
            let mut o = OpenOptions::new();
            o.read(true).write(!f.readonly);
            if direct {
                o.custom_flags(libc::O_DIRECT);
            }
            o.open(&f.filename)
        };
        let (file, direct) = match open(true) {
            Ok(file) => (file, true),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                tracing::info!(
                    bdev = %cfg.name,
                    filename = %f.filename,
                    "filesystem refuses O_DIRECT: using buffered I/O"
                );
                let file =
                    open(false).map_err(|e| err(format!("cannot open \"{}\": {e}", f.filename)))?;
                (file, false)
            }
            Err(e) => return Err(err(format!("cannot open \"{}\": {e}", f.filename))),
        };
        let md = file
            .metadata()
            .map_err(|e| err(format!("cannot stat \"{}\": {e}", f.filename)))?;
        let fd: OwnedFd = file.into();
        let is_block_device = md.file_type().is_block_device();
        let (size, dev_bs) = if is_block_device {
            block_device_geometry(fd.as_raw_fd())
                .map_err(|e| err(format!("cannot read geometry of \"{}\": {e}", f.filename)))?
        } else {
            (md.len(), 512)
        };
        let bs = cfg.block_size;
        if bs < dev_bs {
            return Err(err(format!(
                "block_size {bs} is smaller than the logical block size {dev_bs} of \"{}\"",
                f.filename
            )));
        }
        let num_blocks = size / u64::from(bs);
        if num_blocks == 0 {
            return Err(err(format!(
                "\"{}\" ({size} bytes) is smaller than one block",
                f.filename
            )));
        }
        if num_blocks != cfg.num_blocks {
            tracing::info!(
                bdev = %cfg.name,
                configured = cfg.num_blocks,
                now = num_blocks,
                "file size changed since the config was loaded"
            );
        }
        let shared = Arc::new(FileShared {
            name: cfg.name.clone(),
            fd,
            block_size: bs,
            zero_range: AtomicBool::new(f.fallocate),
            dealloc: AtomicBool::new(false),
        });
        let mut b = FileBackend {
            shared,
            filename: f.filename.clone(),
            block_size: bs,
            num_blocks,
            readonly: f.readonly,
            direct,
            is_block_device,
            dealloc_zeroes: false,
        };
        if !f.readonly && f.fallocate {
            if is_block_device {
                // Discard is a hint: what reads return afterwards is
                // device-specific.
                b.shared.dealloc.store(true, Ordering::Relaxed);
            } else if b.probe_punch_hole(size) {
                b.shared.dealloc.store(true, Ordering::Relaxed);
                b.dealloc_zeroes = true;
            }
        }
        tracing::info!(
            bdev = %cfg.name,
            filename = %f.filename,
            block_size = bs,
            num_blocks,
            direct,
            block_device = is_block_device,
            readonly = f.readonly,
            deallocate = b.shared.dealloc.load(Ordering::Relaxed),
            "file bdev opened (io_uring)"
        );
        Ok(b)
    }

    /// Punches a hole past the end of the file (changes nothing, KEEP_SIZE)
    /// to learn whether the filesystem supports it.
    fn probe_punch_hole(&self, size: u64) -> bool {
        let off = size.next_multiple_of(u64::from(self.block_size));
        self.fallocate(
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            off,
            u64::from(self.block_size),
        )
        .is_ok()
    }

    fn fallocate(&self, mode: i32, off: u64, len: u64) -> std::io::Result<()> {
        loop {
            // SAFETY: plain syscall on our descriptor.
            let r =
                unsafe { libc::fallocate(self.shared.fd(), mode, off as libc::off_t, len as _) };
            if r == 0 {
                return Ok(());
            }
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EINTR) {
                return Err(e);
            }
        }
    }

    /// O_DIRECT is in use.
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    /// The path it serves.
    pub fn filename(&self) -> &str {
        &self.filename
    }

    fn byte_range(&self, lba: u64, len: u64) -> Option<u64> {
        let end = lba.checked_add(len / u64::from(self.block_size))?;
        if end > self.num_blocks || !len.is_multiple_of(u64::from(self.block_size)) {
            return None;
        }
        lba.checked_mul(u64::from(self.block_size))
    }

    /// Blocking fallback for buffers that do not meet O_DIRECT alignment.
    /// fdatasync(2) (a FUA write that went through the bounce path).
    fn sync_data(&self) -> Status {
        loop {
            // SAFETY: plain syscall on our descriptor.
            if unsafe { libc::fdatasync(self.shared.fd()) } == 0 {
                return Status::SUCCESS;
            }
            let e = std::io::Error::last_os_error().raw_os_error();
            if e != Some(libc::EINTR) {
                tracing::warn!(bdev = %self.shared.name(), errno = e.unwrap_or(0), "file bdev fdatasync failed");
                return uring::errno_status(OpKind::Flush, e);
            }
        }
    }

    fn bounce(&self, write: bool, off: u64, buf: *mut u8, len: usize) -> Status {
        let layout = match std::alloc::Layout::from_size_align(len.max(1), DIRECT_ALIGN) {
            Ok(l) => l,
            Err(_) => return Status::INTERNAL_ERROR,
        };
        // SAFETY: non-zero layout; freed below.
        let tmp = unsafe { std::alloc::alloc(layout) };
        if tmp.is_null() {
            return Status::INTERNAL_ERROR;
        }
        let mut done = 0usize;
        let mut status = Status::SUCCESS;
        if write {
            // SAFETY: `buf` holds `len` bytes (caller's slice); `tmp` too.
            unsafe { std::ptr::copy_nonoverlapping(buf, tmp, len) };
        }
        while done < len {
            // SAFETY: [tmp+done, tmp+len) is inside our allocation.
            let r = unsafe {
                let p = tmp.add(done).cast();
                let o = (off + done as u64) as libc::off_t;
                if write {
                    libc::pwrite(self.shared.fd(), p, len - done, o)
                } else {
                    libc::pread(self.shared.fd(), p, len - done, o)
                }
            };
            if r > 0 {
                done += r as usize;
                continue;
            }
            let errno = if r == 0 {
                None
            } else {
                let e = std::io::Error::last_os_error().raw_os_error();
                if matches!(e, Some(libc::EINTR) | Some(libc::EAGAIN)) {
                    continue;
                }
                e
            };
            let kind = if write { OpKind::Write } else { OpKind::Read };
            status = uring::errno_status(kind, errno);
            tracing::warn!(bdev = %self.shared.name(), errno = errno.unwrap_or(0), "file bdev I/O failed");
            break;
        }
        if !write && status.is_success() {
            // SAFETY: as above.
            unsafe { std::ptr::copy_nonoverlapping(tmp, buf, len) };
        }
        // SAFETY: allocated above with this layout.
        unsafe { std::alloc::dealloc(tmp, layout) };
        status
    }

    #[allow(clippy::too_many_arguments)]
    fn queue(
        &self,
        kind: OpKind,
        buf: *mut u8,
        offset: u64,
        len: u64,
        sync_after: bool,
        tag: IoTag,
        sink: &Arc<CompletionSink>,
    ) -> Submitted {
        let op = NewOp {
            file: self.shared.clone(),
            sink: sink.clone(),
            tag,
            kind,
            buf,
            len,
            offset,
            sync_after,
        };
        match uring::submit(op) {
            Ok(()) => Submitted::Pending,
            Err(s) => Submitted::Done(s),
        }
    }
}

impl Backend for FileBackend {
    fn name(&self) -> &str {
        self.shared.name()
    }

    fn kind(&self) -> &'static str {
        "file"
    }

    fn block_size(&self) -> u32 {
        self.block_size
    }

    fn num_blocks(&self) -> u64 {
        self.num_blocks
    }

    fn deallocate_reads_zeroes(&self) -> bool {
        self.dealloc_zeroes
    }
    fn read_only(&self) -> bool {
        self.readonly
    }

    fn needs_stable_buffers(&self) -> bool {
        true
    }

    fn submit(&self, op: BlockOp<'_>, tag: IoTag, sink: &Arc<CompletionSink>) -> Submitted {
        let oob = Status::LBA_OUT_OF_RANGE.with_dnr();
        match op {
            BlockOp::Read { lba, buf } => {
                let len = buf.len() as u64;
                let Some(off) = self.byte_range(lba, len) else {
                    return Submitted::Done(oob);
                };
                if len == 0 {
                    return Submitted::Done(Status::SUCCESS);
                }
                let p = buf.as_mut_ptr();
                if self.direct && !(p as usize).is_multiple_of(DIRECT_ALIGN) {
                    return Submitted::Done(self.bounce(false, off, p, buf.len()));
                }
                self.queue(OpKind::Read, p, off, len, false, tag, sink)
            }
            BlockOp::Write { lba, buf, fua } => {
                if self.readonly {
                    return Submitted::Done(Status::NS_WRITE_PROTECTED.with_dnr());
                }
                let len = buf.len() as u64;
                let Some(off) = self.byte_range(lba, len) else {
                    return Submitted::Done(oob);
                };
                if len == 0 {
                    return Submitted::Done(Status::SUCCESS);
                }
                // The kernel only reads through this pointer.
                let p = buf.as_ptr().cast_mut();
                if self.direct && !(p as usize).is_multiple_of(DIRECT_ALIGN) {
                    let status = self.bounce(true, off, p, buf.len());
                    return Submitted::Done(if fua && status.is_success() {
                        self.sync_data()
                    } else {
                        status
                    });
                }
                let kind = if fua { OpKind::WriteFua } else { OpKind::Write };
                self.queue(kind, p, off, len, false, tag, sink)
            }
            BlockOp::Flush => {
                if self.readonly {
                    return Submitted::Done(Status::SUCCESS);
                }
                self.queue(OpKind::Flush, std::ptr::null_mut(), 0, 0, false, tag, sink)
            }
            BlockOp::WriteZeroes { lba, blocks, fua } => {
                if self.readonly {
                    return Submitted::Done(Status::NS_WRITE_PROTECTED.with_dnr());
                }
                let Some(len) = blocks.checked_mul(u64::from(self.block_size)) else {
                    return Submitted::Done(oob);
                };
                let Some(off) = self.byte_range(lba, len) else {
                    return Submitted::Done(oob);
                };
                if len == 0 {
                    return Submitted::Done(Status::SUCCESS);
                }
                let kind = if self.shared.zero_range.load(Ordering::Relaxed) {
                    OpKind::ZeroRange
                } else {
                    OpKind::WriteZeroBuf
                };
                self.queue(kind, std::ptr::null_mut(), off, len, fua, tag, sink)
            }
        }
    }

    fn deallocate(
        &self,
        ranges: DsmRanges<'_>,
        tag: IoTag,
        sink: &Arc<CompletionSink>,
    ) -> Submitted {
        let oob = Submitted::Done(Status::LBA_OUT_OF_RANGE.with_dnr());
        let bs = u64::from(self.block_size);
        for (lba, blocks) in ranges.iter() {
            match blocks.checked_mul(bs) {
                Some(len) if self.byte_range(lba, len).is_some() => {}
                _ => return oob,
            }
        }
        if self.readonly {
            return Submitted::Done(Status::NS_WRITE_PROTECTED.with_dnr());
        }
        if ranges.iter().next().is_none() || !self.shared.dealloc.load(Ordering::Relaxed) {
            return Submitted::Done(Status::SUCCESS);
        }
        if !self.is_block_device {
            // One ring operation for every range; it reads the descriptors
            // from the request's data buffer, which stays put until the
            // completion is posted (needs_stable_buffers).
            let p = ranges.as_bytes().as_ptr().cast_mut();
            let n = ranges.count() as u64;
            return self.queue(OpKind::PunchRanges, p, 0, n, false, tag, sink);
        }
        // BLKDISCARD is a synchronous ioctl: all ranges in one helper job.
        let list: Vec<[u64; 2]> = ranges.iter().map(|(l, n)| [l * bs, n * bs]).collect();
        let shared = self.shared.clone();
        helper::run(sink, tag, move || discard(&shared, &list))
    }
}

/// BLKDISCARD of each `[offset, length]` (helper thread).
fn discard(shared: &FileShared, list: &[[u64; 2]]) -> Status {
    for range in list {
        // SAFETY: BLKDISCARD reads two u64 from the pointer, which points at
        // a live `[u64; 2]`; the descriptor stays open (we hold its Arc).
        let r = unsafe { libc::ioctl(shared.fd(), BLKDISCARD as _, range.as_ptr()) };
        if r < 0 {
            let e = std::io::Error::last_os_error();
            if matches!(
                e.raw_os_error(),
                Some(libc::EOPNOTSUPP) | Some(libc::ENOTTY)
            ) {
                shared.dealloc_unsupported();
                return Status::SUCCESS;
            }
            tracing::warn!(bdev = %shared.name(), "deallocate (discard) failed: {e}");
            return uring::errno_status(OpKind::Write, e.raw_os_error());
        }
    }
    Status::SUCCESS
}
