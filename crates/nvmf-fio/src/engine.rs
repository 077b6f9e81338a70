//! engine.rs — the I/O side of the fio engine, free of fio types: a probe
//! (connect, read the namespace's size, disconnect), and `Job`, the state of
//! one fio job (thread or process): one controller and one I/O queue of
//! `iodepth` slots per fio file, submission of read / write / trim / flush
//! from fio's buffers, and reaping of completions across the job's files.
//!
//! Data moves by copy between fio's buffer and the queue's slot buffer
//! (write: at submit; read: at completion). Nothing here allocates per I/O:
//! the per-slot bookkeeping and the poll set are sized when a file opens.

use crate::filename::{self, Target};
use nvmf_host::{ConnectOptions, Controller, IoQueue, Slot, TlsKey};
use nvmf_wire::{Command, IoOpcode, Status};
use std::ffi::c_void;
use std::time::{Duration, Instant};

/// Operation codes of the C ABI (`nvmf_fio_queue`).
pub const OP_READ: u32 = 0;
pub const OP_WRITE: u32 = 1;
pub const OP_TRIM: u32 = 2;
pub const OP_FLUSH: u32 = 3;

/// Size facts of a namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NsInfo {
    pub size_bytes: u64,
    pub block_size: u32,
}

fn connect(t: &Target) -> Result<(Controller, NsInfo), String> {
    let mut opts = ConnectOptions::new(t.trid.clone()).with_digests(t.hdr_digest, t.data_digest);
    if let Some(path) = &t.tls_key {
        opts.tls =
            Some(TlsKey::from_file(path, t.tls_identity).map_err(|e| format!("tls_key: {e}"))?);
    }
    let where_ = format!(
        "{}:{} subsystem {}",
        t.trid.traddr, t.trid.trsvcid, t.trid.subnqn
    );
    let ctrl = Controller::connect(&opts).map_err(|e| format!("connect to {where_}: {e}"))?;
    if ctrl.is_discovery() {
        return Err(format!(
            "{where_} is a discovery subsystem; give the NQN of an NVM subsystem"
        ));
    }
    let ns = ctrl
        .identify_namespace(t.nsid)
        .map_err(|e| format!("Identify Namespace {} on {where_}: {e}", t.nsid))?;
    let nsze = ns.nsze.get();
    if nsze == 0 {
        let active = ctrl
            .active_namespaces()
            .map(|v| {
                v.iter()
                    .map(|n| n.to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .unwrap_or_default();
        return Err(format!(
            "namespace {} is not active on {where_} (active namespaces: {})",
            t.nsid,
            if active.is_empty() { "none" } else { &active }
        ));
    }
    let bs = ns.block_size();
    if !(512..=(1 << 20)).contains(&bs) {
        return Err(format!(
            "namespace {} on {where_} has an unusable block size {bs}",
            t.nsid
        ));
    }
    let info = NsInfo {
        size_bytes: nsze.saturating_mul(bs),
        block_size: bs as u32,
    };
    Ok((ctrl, info))
}

/// Connect to the filename's subsystem, read the namespace size, disconnect.
pub fn probe(name: &str) -> Result<NsInfo, String> {
    let t = filename::parse(name)?;
    connect(&t).map(|(_, info)| info)
}

/// What an in-flight slot was submitted for.
#[derive(Clone, Copy)]
struct Pending {
    tag: *mut c_void,
    /// fio's buffer (reads copy into it on completion).
    buf: *mut u8,
    len: u32,
    read: bool,
}

const NO_PENDING: Pending = Pending {
    tag: std::ptr::null_mut(),
    buf: std::ptr::null_mut(),
    len: 0,
    read: false,
};

/// One open fio file: its controller and I/O queue.
struct FileQueue {
    /// Kept for the admin queue's keep-alive; dropped last.
    _ctrl: Controller,
    q: IoQueue,
    nsid: u32,
    bs_shift: u32,
    pending: Box<[Pending]>,
    /// NVMe errors printed so far (the first few are printed).
    errors_printed: u32,
    name: String,
}

/// Outcome of a submission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Queued {
    Queued,
    /// No free slot: reap first.
    Busy,
    /// Done at once with this errno (bad request).
    Failed(i32),
}

/// State of one fio job: its open files.
pub struct Job {
    depth: u16,
    min_bs: u32,
    max_bs: u32,
    files: Vec<Option<FileQueue>>,
    pollfds: Vec<libc::pollfd>,
    /// File to reap first next time (fairness between files).
    next: usize,
    /// Busy-poll this long without a completion before sleeping in poll(2).
    spin: Duration,
}

/// How many NVMe errors per file are printed before going quiet.
const ERRORS_PRINTED: u32 = 5;

impl Job {
    /// `poll_us`: busy-poll the job's sockets up to this many microseconds
    /// without a completion before sleeping (0 = sleep whenever idle).
    pub fn new(depth: u32, min_bs: u32, max_bs: u32, poll_us: u32) -> Result<Job, String> {
        if depth == 0 || depth > u16::MAX as u32 {
            return Err(format!("iodepth {depth} is out of range (1 to 65535)"));
        }
        if min_bs == 0 || max_bs == 0 {
            return Err(format!("block sizes {min_bs}..{max_bs} are not usable"));
        }
        Ok(Job {
            depth: depth as u16,
            min_bs,
            max_bs,
            files: Vec::new(),
            pollfds: Vec::new(),
            next: 0,
            spin: Duration::from_micros(poll_us as u64),
        })
    }

    /// Open one file: controller, Set Features Number of Queues, one I/O
    /// queue of `iodepth` slots with buffers of the job's largest read or
    /// write (at most the controller's MDTS). Returns its index.
    pub fn open(&mut self, name: &str) -> Result<usize, String> {
        let t = filename::parse(name)?;
        let (ctrl, info) = connect(&t)?;
        if !self.min_bs.is_multiple_of(info.block_size) {
            return Err(format!(
                "block size {} is not a multiple of namespace {}'s {} byte blocks",
                self.min_bs, t.nsid, info.block_size
            ));
        }
        ctrl.set_num_queues(1)
            .map_err(|e| format!("Set Features Number of Queues: {e}"))?;
        let depth = self.depth;
        let max = ctrl.max_queue_size();
        if depth as u32 > max {
            return Err(format!(
                "iodepth {depth} exceeds the controller's largest queue ({max} entries)"
            ));
        }
        // A job's largest block size may exceed MDTS when it only trims
        // with it; a read or write that large fails alone (see `queue`).
        let buf = self.max_bs.min(ctrl.max_transfer().unwrap_or(u32::MAX));
        let q = ctrl
            .create_io_queue(1, depth, buf)
            .map_err(|e| format!("create I/O queue: {e}"))?;
        let fq = FileQueue {
            pending: vec![NO_PENDING; q.depth()].into_boxed_slice(),
            _ctrl: ctrl,
            q,
            nsid: t.nsid,
            bs_shift: info.block_size.trailing_zeros(),
            errors_printed: 0,
            name: format!("{}:{} ns {}", t.trid.traddr, t.trid.trsvcid, t.nsid),
        };
        let idx = match self.files.iter().position(|f| f.is_none()) {
            Some(i) => i,
            None => {
                self.files.push(None);
                self.pollfds.push(libc::pollfd {
                    fd: -1,
                    events: 0,
                    revents: 0,
                });
                self.files.len() - 1
            }
        };
        self.pollfds[idx].fd = fq.q.raw_fd();
        self.files[idx] = Some(fq);
        Ok(idx)
    }

    /// Close a file (commands still in flight are abandoned with it).
    pub fn close(&mut self, idx: usize) {
        if let Some(f) = self.files.get_mut(idx).and_then(|f| f.take()) {
            f.q.shutdown();
            self.pollfds[idx].fd = -1;
        }
    }

    /// Commands submitted and not reaped yet, on all files.
    pub fn outstanding(&self) -> usize {
        self.files
            .iter()
            .flatten()
            .map(|f| f.q.inflight() + f.q.completions_ready())
            .sum()
    }

    /// Submit one command (only encoded; `commit` or `getevents` sends it).
    ///
    /// # Safety
    /// `buf` must be valid for `len` bytes (reads: writable) until the
    /// command is reaped.
    pub unsafe fn queue(
        &mut self,
        idx: usize,
        op: u32,
        offset: u64,
        len: u64,
        buf: *mut u8,
        tag: *mut c_void,
    ) -> Result<Queued, String> {
        let Some(f) = self.files.get_mut(idx).and_then(|f| f.as_mut()) else {
            return Err(format!("file {idx} is not open"));
        };
        let bs_mask = (1u64 << f.bs_shift) - 1;
        if op != OP_FLUSH && (offset & bs_mask != 0 || len & bs_mask != 0 || len == 0) {
            eprintln!(
                "nvmf: {}: offset {offset} length {len} is not a whole number of {} byte blocks",
                f.name,
                1u64 << f.bs_shift
            );
            return Ok(Queued::Failed(libc::EINVAL));
        }
        if (op == OP_READ || op == OP_WRITE) && len > f.q.buf_size() as u64 {
            if f.errors_printed < ERRORS_PRINTED {
                f.errors_printed += 1;
                eprintln!(
                    "nvmf: {}: a {len} byte transfer exceeds the queue's {} bytes (the job's bs, or the controller's MDTS)",
                    f.name,
                    f.q.buf_size()
                );
            }
            return Ok(Queued::Failed(libc::EINVAL));
        }
        let Some(slot) = f.q.alloc() else {
            return Ok(Queued::Busy);
        };
        let slba = offset >> f.bs_shift;
        let nlb = len >> f.bs_shift;
        let r = match op {
            OP_READ | OP_WRITE if nlb > 65536 => {
                Err(format!("{nlb} blocks in one command (at most 65536)"))
            }
            // NVMe/TCP: the data moves straight between the socket and fio's
            // buffer (valid until reaped: the caller's contract), no copy.
            OP_READ if !f.q.is_rdma() => {
                f.q.submit_read_into(slot, f.nsid, slba, nlb as u32, len as u32, buf)
                    .map_err(|e| e.to_string())
            }
            OP_WRITE if !f.q.is_rdma() => {
                f.q.submit_write_from(slot, f.nsid, slba, nlb as u32, len as u32, buf)
                    .map_err(|e| e.to_string())
            }
            OP_READ => {
                f.q.submit_read(slot, f.nsid, slba, nlb as u32, len as u32)
                    .map_err(|e| e.to_string())
            }
            OP_WRITE => {
                // SAFETY: the caller guarantees buf..buf+len is readable.
                let src = std::slice::from_raw_parts(buf as *const u8, len as usize);
                f.q.buf_mut(slot)[..len as usize].copy_from_slice(src);
                f.q.submit_write(slot, f.nsid, slba, nlb as u32, len as u32)
                    .map_err(|e| e.to_string())
            }
            OP_TRIM if nlb > u32::MAX as u64 => Err(format!(
                "trim of {nlb} blocks in one range (at most 2^32-1)"
            )),
            OP_TRIM => {
                f.q.submit_deallocate(slot, f.nsid, &[(slba, nlb as u32)])
                    .map_err(|e| e.to_string())
            }
            OP_FLUSH => {
                let mut c = Command::new(IoOpcode::Flush as u8, 0);
                c.set_nsid(f.nsid);
                f.q.submit(slot, c, 0).map_err(|e| e.to_string())
            }
            _ => Err(format!("unknown operation {op}")),
        };
        if let Err(e) = r {
            f.q.release(slot);
            eprintln!("nvmf: {}: {e}", f.name);
            return Ok(Queued::Failed(libc::EINVAL));
        }
        f.pending[slot as usize] = Pending {
            tag,
            buf,
            len: len as u32,
            read: op == OP_READ,
        };
        Ok(Queued::Queued)
    }

    /// Send everything submitted (without waiting for the socket).
    pub fn commit(&mut self) -> Result<(), String> {
        for f in self.files.iter_mut().flatten() {
            f.q.flush().map_err(|e| format!("{}: send: {e}", f.name))?;
        }
        Ok(())
    }

    /// Move up to `out_tags.len()` completions into `out_tags`/`out_errs`
    /// (errno, 0 = success), waiting until at least `min` are there or
    /// `timeout` passes (None: no limit). Returns how many.
    pub fn getevents(
        &mut self,
        min: usize,
        timeout: Option<Duration>,
        out_tags: &mut [*mut c_void],
        out_errs: &mut [i32],
    ) -> Result<usize, String> {
        let max = out_tags.len().min(out_errs.len());
        let min = min.min(max).min(self.outstanding());
        let deadline = timeout.map(|t| Instant::now() + t);
        let nfiles = self.files.len();
        let mut n = 0;
        // Busy-poll until this instant (reset by every completion), then sleep.
        let mut spin_until: Option<Instant> = None;
        loop {
            let before = n;
            // Drive every queue without waiting and take what is done.
            for k in 0..nfiles {
                let i = (self.next + k) % nfiles;
                let Some(f) = self.files[i].as_mut() else {
                    continue;
                };
                if f.q.inflight() == 0 && f.q.completions_ready() == 0 {
                    continue;
                }
                f.q.poll(Some(Duration::ZERO))
                    .map_err(|e| format!("{}: {e}", f.name))?;
                while n < max {
                    let Some(c) = f.q.next_completion() else {
                        break;
                    };
                    let (tag, err) = f.finish(c.slot, c.status);
                    out_tags[n] = tag;
                    out_errs[n] = err;
                    n += 1;
                }
            }
            if nfiles > 0 {
                self.next = (self.next + 1) % nfiles;
            }
            if n >= min || n == max {
                return Ok(n);
            }
            if !self.spin.is_zero() {
                let now = Instant::now();
                if n > before {
                    spin_until = None;
                }
                let until = *spin_until.get_or_insert(now + self.spin);
                if now < until && deadline.is_none_or(|d| now < d) {
                    continue;
                }
            }
            let left = match deadline {
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return Ok(n);
                    }
                    d - now
                }
                None => Duration::from_secs(1),
            };
            self.wait(left)?;
        }
    }

    /// Sleep until a socket of the job is readable (or writable with
    /// output pending), at most `left`.
    fn wait(&mut self, left: Duration) -> Result<(), String> {
        if self.files.iter().flatten().count() == 1 {
            let f = self.files.iter_mut().flatten().next().expect("one file");
            return f
                .q
                .poll(Some(left.min(Duration::from_secs(1))))
                .map(|_| ())
                .map_err(|e| format!("{}: {e}", f.name));
        }
        for (p, f) in self.pollfds.iter_mut().zip(self.files.iter()) {
            p.events = f.as_ref().map_or(0, |f| f.q.poll_events());
            p.revents = 0;
        }
        let ms = left.as_millis().clamp(1, 1000) as libc::c_int;
        // SAFETY: pollfds is a valid array of this length.
        let r = unsafe { libc::poll(self.pollfds.as_mut_ptr(), self.pollfds.len() as _, ms) };
        if r < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(format!("poll: {e}"));
            }
        }
        Ok(())
    }
}

impl FileQueue {
    /// Finish a completed slot: copy read data to fio's buffer (NVMe/RDMA:
    /// data moves through the registered slot buffers), free the slot;
    /// returns (tag, errno).
    fn finish(&mut self, slot: Slot, status: Status) -> (*mut c_void, i32) {
        let p = self.pending[slot as usize];
        self.pending[slot as usize] = NO_PENDING;
        let err = if status.is_success() {
            // Over NVMe/TCP reads land in fio's buffer directly.
            if p.read && !p.buf.is_null() && self.q.is_rdma() {
                let len = p.len as usize;
                // SAFETY: fio's buffer is valid for `len` bytes until the
                // command is reaped (the contract of `queue`).
                unsafe {
                    std::ptr::copy_nonoverlapping(self.q.buf(slot).as_ptr(), p.buf, len);
                }
            }
            0
        } else {
            if self.errors_printed < ERRORS_PRINTED {
                self.errors_printed += 1;
                eprintln!(
                    "nvmf: {}: command failed: {status}{}",
                    self.name,
                    if self.errors_printed == ERRORS_PRINTED {
                        " (further errors of this file are not printed)"
                    } else {
                        ""
                    }
                );
            }
            libc::EIO
        };
        self.q.release(slot);
        (p.tag, err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An NVMe/RDMA file opens through the same connect as TCP; where RDMA cannot be used
    /// (no rdma-core, no device, or nothing listening) the job's setup fails at once with the
    /// address and the reason, not later in I/O.
    #[test]
    fn rdma_file_fails_at_setup_with_a_clear_error() {
        let t0 = Instant::now();
        let e = probe("trtype=rdma traddr=127.0.0.1 trsvcid=9 subnqn=nqn.2024-01.io.nvmfd:x")
            .unwrap_err();
        assert!(
            e.contains("connect to 127.0.0.1:9 subsystem nqn.2024-01.io.nvmfd:x"),
            "{e}"
        );
        assert!(e.to_ascii_lowercase().contains("rdma"), "{e}");
        assert!(t0.elapsed() < Duration::from_secs(15), "{e}");
        eprintln!("rdma probe without RDMA here: {e}");
    }
}
