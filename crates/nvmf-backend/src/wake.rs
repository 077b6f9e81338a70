//! The per-thread wake-up eventfd: how any thread wakes the thread that owns
//! a queue pair.
//!
//! Owns one non-blocking eventfd per thread, made on first use. It is the
//! one descriptor a reactor keeps in its epoll set for backend work: the
//! thread's io_uring (if it has one) signals completions on it
//! (`uring` registers this same descriptor with the ring), and a
//! [`CompletionSink`](super::CompletionSink) made on the thread keeps a
//! shared handle to it, so a completion posted from any other thread (the
//! helper pool, a library's callback thread) wakes the owner at once,
//! whether or not the owner ever used io_uring. On the event the owner
//! calls [`clear`] and then polls its sinks (and `uring::flush`).
//!
//! Shared ownership (`Arc<OwnedFd>`): a poster that writes after the owner
//! is gone writes to a live descriptor nobody reads, never to a reused
//! descriptor number.

use std::cell::RefCell;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;

thread_local! {
    static WAKE: RefCell<Option<Arc<OwnedFd>>> = const { RefCell::new(None) };
}

/// This thread's wake-up eventfd, made on first use.
pub fn thread_waker() -> std::io::Result<Arc<OwnedFd>> {
    WAKE.with(|w| {
        let mut w = w.borrow_mut();
        if let Some(fd) = w.as_ref() {
            return Ok(fd.clone());
        }
        // SAFETY: plain eventfd(2); the descriptor is owned below.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh descriptor nobody else owns.
        let fd = Arc::new(unsafe { OwnedFd::from_raw_fd(fd) });
        *w = Some(fd.clone());
        Ok(fd)
    })
}

/// This thread's wake-up eventfd number (made on first use), for the
/// owner's epoll set.
pub fn fd() -> std::io::Result<RawFd> {
    thread_waker().map(|f| f.as_raw_fd())
}

/// Adds 1 to an eventfd (non-blocking; a full counter already means
/// "wake up").
pub fn wake(fd: &OwnedFd) {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from `one` to a descriptor we hold open.
    unsafe {
        libc::write(
            fd.as_raw_fd(),
            (&one as *const u64).cast(),
            std::mem::size_of::<u64>(),
        )
    };
}

/// Resets this thread's wake-up counter (non-blocking; nothing when the
/// thread never made one).
pub fn clear() {
    WAKE.with(|w| {
        if let Ok(w) = w.try_borrow() {
            if let Some(fd) = w.as_ref() {
                let mut v = 0u64;
                // SAFETY: reads 8 bytes into `v` from our own non-blocking eventfd.
                unsafe {
                    libc::read(
                        fd.as_raw_fd(),
                        (&mut v as *mut u64).cast(),
                        std::mem::size_of::<u64>(),
                    )
                };
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Backend, BlockOp, CompletionSink, DsmRanges, IoTag, Submitted};
    use nvmf_wire::status::Status;
    use std::sync::mpsc;
    use std::sync::Mutex;
    use std::time::{Duration, Instant};

    /// A read handed to the worker: where to write, and whom to tell.
    struct Job {
        buf: usize,
        len: usize,
        lba: u64,
        tag: IoTag,
        sink: Arc<CompletionSink>,
    }

    /// A backend whose reads complete on its own thread (what librbd's
    /// callback threads will do): the submitting thread never sees the
    /// work, only the posted completion.
    #[derive(Debug)]
    struct Foreign {
        jobs: Mutex<mpsc::Sender<Job>>,
    }

    impl Foreign {
        fn start() -> (Foreign, std::thread::JoinHandle<()>) {
            let (tx, rx) = mpsc::channel::<Job>();
            let worker = std::thread::spawn(move || {
                for job in rx {
                    // SAFETY: the submitter keeps the buffer alive and
                    // untouched until this job's completion is drained.
                    let buf =
                        unsafe { std::slice::from_raw_parts_mut(job.buf as *mut u8, job.len) };
                    buf.fill(job.lba as u8);
                    CompletionSink::post_and_wake(job.sink, job.tag, Status::SUCCESS);
                }
            });
            (
                Foreign {
                    jobs: Mutex::new(tx),
                },
                worker,
            )
        }
    }

    impl Backend for Foreign {
        fn name(&self) -> &str {
            "foreign"
        }
        fn kind(&self) -> &'static str {
            "foreign"
        }
        fn block_size(&self) -> u32 {
            512
        }
        fn num_blocks(&self) -> u64 {
            1 << 20
        }
        fn deallocate_reads_zeroes(&self) -> bool {
            false
        }
        fn submit(&self, op: BlockOp<'_>, tag: IoTag, sink: &Arc<CompletionSink>) -> Submitted {
            let BlockOp::Read { lba, buf } = op else {
                return Submitted::Done(Status::INVALID_OPCODE);
            };
            let job = Job {
                buf: buf.as_mut_ptr() as usize,
                len: buf.len(),
                lba,
                tag,
                sink: sink.clone(),
            };
            match self.jobs.lock().unwrap().send(job) {
                Ok(()) => Submitted::Pending,
                Err(_) => Submitted::Done(Status::INTERNAL_ERROR),
            }
        }
        fn deallocate(&self, _: DsmRanges<'_>, _: IoTag, _: &Arc<CompletionSink>) -> Submitted {
            Submitted::Done(Status::INVALID_OPCODE)
        }
        fn needs_stable_buffers(&self) -> bool {
            true
        }
    }

    /// QD1 reads through a backend that completes on a foreign thread, on
    /// a thread that never touches io_uring and sleeps in epoll the way a
    /// reactor does (with the reactor's 100 ms tick as timeout): every
    /// completion wakes it at once, p99 well under the tick.
    #[test]
    fn foreign_completion_wakes_a_thread_without_io_uring() {
        let (backend, worker) = Foreign::start();
        // SAFETY: plain epoll_create1; closed at the end.
        let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        assert!(ep >= 0);
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: 1,
        };
        // SAFETY: valid epoll and eventfd descriptors, `ev` lives across the call.
        let rc = unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, fd().unwrap(), &mut ev) };
        assert_eq!(rc, 0);
        let sink = CompletionSink::new();
        let mut buf = vec![0u8; 4096];
        let mut lat = Vec::with_capacity(200);
        for i in 0..200u64 {
            let tag = IoTag {
                cid: i as u16,
                bytes: 4096,
                write: false,
            };
            let start = Instant::now();
            let op = BlockOp::Read {
                lba: i,
                buf: &mut buf,
            };
            assert_eq!(backend.submit(op, tag, &sink), Submitted::Pending);
            let mut got = None;
            while got.is_none() {
                assert!(
                    start.elapsed() < Duration::from_secs(5),
                    "read {i} never completed"
                );
                let mut out = [libc::epoll_event { events: 0, u64: 0 }];
                // SAFETY: one output slot; the reactor's tick as timeout.
                unsafe { libc::epoll_wait(ep, out.as_mut_ptr(), 1, 100) };
                clear();
                sink.drain(|t, s| got = Some((t.cid, s)));
            }
            lat.push(start.elapsed());
            assert_eq!(got, Some((i as u16, Status::SUCCESS)));
            assert!(buf.iter().all(|&b| b == i as u8), "read {i} data");
        }
        lat.sort();
        let p99 = lat[lat.len() * 99 / 100 - 1];
        eprintln!(
            "foreign-thread completions, QD1 x {}: median {:?}, p99 {p99:?}, max {:?}",
            lat.len(),
            lat[lat.len() / 2],
            lat[lat.len() - 1]
        );
        assert!(
            p99 < Duration::from_millis(10),
            "foreign completions wait for the tick: p99 {p99:?}, max {:?}",
            lat[lat.len() - 1]
        );
        // SAFETY: our own epoll descriptor.
        unsafe { libc::close(ep) };
        drop(backend);
        worker.join().unwrap();
    }
}
