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
//! Shared ownership (`Arc<Waker>`): a poster that writes after the owner
//! is gone writes to a live descriptor nobody reads, never to a reused
//! descriptor number.
//!
//! One write per wake-up, not per completion: [`Waker`] has a `pending`
//! flag that the first poster sets (and only it writes the eventfd) and
//! the owner resets in [`clear`] after reading the counter and before
//! polling its sinks. Posts that find it set skip the write(2): the owner
//! has not polled yet and will see them. Under load (librbd completing
//! thousands of I/Os a second onto one busy reactor) this saves a system
//! call per completion on the library's threads and a loop turn per
//! completion on the reactor. The thread's io_uring writes the descriptor
//! from the kernel, ignoring the flag, which is harmless (an extra wake).

use std::cell::RefCell;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A thread's wake-up eventfd and whether a wake-up is already pending.
#[derive(Debug)]
pub struct Waker {
    fd: OwnedFd,
    pending: AtomicBool,
}

impl AsRawFd for Waker {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

thread_local! {
    static WAKE: RefCell<Option<Arc<Waker>>> = const { RefCell::new(None) };
}

/// This thread's wake-up eventfd, made on first use.
pub fn thread_waker() -> std::io::Result<Arc<Waker>> {
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
        let fd = Arc::new(Waker {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            pending: AtomicBool::new(false),
        });
        *w = Some(fd.clone());
        Ok(fd)
    })
}

/// This thread's wake-up eventfd number (made on first use), for the
/// owner's epoll set.
pub fn fd() -> std::io::Result<RawFd> {
    thread_waker().map(|f| f.as_raw_fd())
}

/// Wakes the waker's owner: adds 1 to its eventfd (non-blocking; a full
/// counter already means "wake up") unless a wake-up is already pending
/// (see the module comment). Call it after posting.
pub fn wake(w: &Waker) {
    // AcqRel: the post before this is visible to the owner's `clear`,
    // which reads this flag with a swap too.
    if w.pending.swap(true, Ordering::AcqRel) {
        return;
    }
    let fd = &w.fd;
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
/// thread never made one), then the pending flag, so posts from now on
/// write the eventfd again. Call it before polling the sinks.
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
                // After the read: a post that came before it either wrote
                // the counter (read just now) or found the flag set; the
                // swap synchronizes with its swap, so its completion is
                // visible to the poll that follows. A post after this
                // writes the counter again.
                fd.pending.swap(false, Ordering::AcqRel);
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

    /// The eventfd counter of this thread (read and reset).
    fn take_counter() -> u64 {
        let w = thread_waker().unwrap();
        let mut v = 0u64;
        // SAFETY: reads 8 bytes into `v` from our own non-blocking eventfd.
        let n = unsafe {
            libc::read(
                w.as_raw_fd(),
                (&mut v as *mut u64).cast(),
                std::mem::size_of::<u64>(),
            )
        };
        if n == 8 {
            v
        } else {
            0
        }
    }

    /// Posts while a wake-up is pending write the eventfd once, not once
    /// each; after `clear` the next post writes it again.
    #[test]
    fn one_eventfd_write_per_wake_up() {
        clear();
        let sink = CompletionSink::new();
        let tag = IoTag {
            cid: 1,
            bytes: 0,
            write: false,
            nsid: 0,
        };
        let poster = {
            let sink = sink.clone();
            std::thread::spawn(move || {
                for _ in 0..100 {
                    CompletionSink::post_and_wake(sink.clone(), tag, Status::SUCCESS);
                }
            })
        };
        poster.join().unwrap();
        assert_eq!(take_counter(), 1, "100 posts, one write");
        clear();
        let mut n = 0;
        sink.drain(|_, _| n += 1);
        assert_eq!(n, 100);
        CompletionSink::post_and_wake(sink.clone(), tag, Status::SUCCESS);
        assert_eq!(take_counter(), 1, "after clear the next post writes again");
        clear();
    }

    /// Bursts of foreign posts with the owner sleeping in epoll with a long
    /// timeout: every burst wakes it (no wake-up lost to the pending flag).
    #[test]
    fn no_wake_up_is_lost_between_bursts() {
        // SAFETY: plain epoll_create1; closed at the end.
        let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        assert!(ep >= 0);
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: 1,
        };
        // SAFETY: valid epoll and eventfd descriptors, `ev` lives across the call.
        assert_eq!(
            unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, fd().unwrap(), &mut ev) },
            0
        );
        let sink = CompletionSink::new();
        let rounds = 300u32;
        let poster = {
            let sink = sink.clone();
            std::thread::spawn(move || {
                for r in 0..rounds {
                    for i in 0..(1 + r % 7) {
                        let tag = IoTag {
                            cid: i as u16,
                            bytes: r,
                            write: false,
                            nsid: 0,
                        };
                        CompletionSink::post_and_wake(sink.clone(), tag, Status::SUCCESS);
                    }
                    std::thread::sleep(Duration::from_micros(u64::from(r % 5) * 100));
                }
            })
        };
        let total: u32 = (0..rounds).map(|r| 1 + r % 7).sum();
        let mut got = 0u32;
        let start = Instant::now();
        while got < total {
            let t = Instant::now();
            let mut out = [libc::epoll_event { events: 0, u64: 0 }];
            // SAFETY: one output slot; a long timeout: only a wake-up ends
            // the wait early.
            let n = unsafe { libc::epoll_wait(ep, out.as_mut_ptr(), 1, 3000) };
            assert!(
                n == 1 && t.elapsed() < Duration::from_secs(2),
                "wake-up lost: {got} of {total} drained, waited {:?}",
                t.elapsed()
            );
            clear();
            sink.drain(|_, _| got += 1);
            assert!(start.elapsed() < Duration::from_secs(60));
        }
        poster.join().unwrap();
        // SAFETY: our own epoll descriptor.
        unsafe { libc::close(ep) };
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
                nsid: 0,
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
