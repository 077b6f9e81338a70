//! The helper pool: a small, fixed set of threads for backend work that can
//! only be done synchronously and may take long (zeroing a large range of a
//! RAM disk, BLKDISCARD on a block device), so that it never runs on a
//! reactor thread.
//!
//! Owns the threads (started on first use, [`HELPER_THREADS`] of them, named
//! `nvmf-helper-N`, living for the rest of the process), the job queue, and
//! posting each job's status to its queue pair's [`CompletionSink`] with a
//! wake-up of the owning reactor ([`CompletionSink::post_and_wake`]); and
//! [`JobPool`], the same machinery for other named pools (nvmf-core's
//! `nvmfd-auth`).
//!
//! Bounds: the thread count is fixed; the queue holds at most one job per
//! command the hosts have outstanding (every job is a command that
//! answered [`Submitted::Pending`] and keeps its request slot), so it is
//! bounded by the transport's slot limits. A job is one boxed closure: an
//! allocation per job, which only the rare, expensive commands that use
//! this pool pay (small ones stay inline).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex, OnceLock};

use nvmf_wire::status::Status;

use super::{CompletionSink, IoTag, Submitted};

/// Threads in the helper pool.
pub const HELPER_THREADS: usize = 2;

type Work = Box<dyn FnOnce() -> Status + Send>;

struct Job {
    work: Work,
    sink: Arc<CompletionSink>,
    tag: IoTag,
}

/// A named, fixed set of threads (started on first use, living for the
/// rest of the process) running jobs whose status is posted to a queue
/// pair's sink with a wake-up of its reactor. The backend helpers are one;
/// nvmf-core's `nvmfd-auth` threads (DH-HMAC-CHAP arithmetic) are another,
/// so that one kind of slow work never queues behind the other.
pub struct JobPool {
    name: &'static str,
    threads: usize,
    tx: OnceLock<Option<Mutex<Sender<Job>>>>,
    warned: AtomicBool,
}

impl JobPool {
    /// A pool of `threads` threads named `NAME-N` (none started yet).
    pub const fn new(name: &'static str, threads: usize) -> JobPool {
        JobPool {
            name,
            threads,
            tx: OnceLock::new(),
            warned: AtomicBool::new(false),
        }
    }

    fn start(&self) -> Option<Mutex<Sender<Job>>> {
        let (tx, rx) = channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        let mut started = 0;
        for i in 0..self.threads {
            let rx = rx.clone();
            match std::thread::Builder::new()
                .name(format!("{}-{i}", self.name))
                .spawn(move || worker(&rx))
            {
                Ok(_) => started += 1,
                Err(e) => tracing::warn!("cannot start a {} thread: {e}", self.name),
            }
        }
        (started > 0).then(|| Mutex::new(tx))
    }

    /// Runs `work` on one of the pool's threads; its status is posted to
    /// `sink` under `tag` (the command completes through the queue pair's
    /// `poll`). If no thread can be started the work runs here, inline
    /// (logged once per pool).
    pub fn run(
        &self,
        sink: &Arc<CompletionSink>,
        tag: IoTag,
        work: impl FnOnce() -> Status + Send + 'static,
    ) -> Submitted {
        let job = Job {
            work: Box::new(work),
            sink: sink.clone(),
            tag,
        };
        if let Some(tx) = self.tx.get_or_init(|| self.start()) {
            let tx = tx.lock().unwrap_or_else(|e| e.into_inner());
            match tx.send(job) {
                Ok(()) => return Submitted::Pending,
                Err(e) => return Submitted::Done((e.0.work)()),
            }
        }
        if !self.warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                "no {} thread could be started: its work runs inline, on the caller's thread",
                self.name
            );
        }
        Submitted::Done((job.work)())
    }
}

fn worker(rx: &Mutex<Receiver<Job>>) {
    loop {
        let job = {
            let rx = rx.lock().unwrap_or_else(|e| e.into_inner());
            match rx.recv() {
                Ok(j) => j,
                Err(_) => return,
            }
        };
        let Job { work, sink, tag } = job;
        let status = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work))
            .unwrap_or(Status::INTERNAL_ERROR);
        CompletionSink::post_and_wake(sink, tag, status);
    }
}

/// The backend helper pool (`nvmf-helper-N`).
static HELPERS: JobPool = JobPool::new("nvmf-helper", HELPER_THREADS);

/// Runs `work` on a backend helper thread; its status is posted to `sink`
/// under `tag` (the command completes through the queue pair's `poll`). If
/// no helper thread can be started the work runs here, inline.
pub fn run(
    sink: &Arc<CompletionSink>,
    tag: IoTag,
    work: impl FnOnce() -> Status + Send + 'static,
) -> Submitted {
    HELPERS.run(sink, tag, work)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn job_completes_through_the_sink_and_releases_it() {
        let sink = CompletionSink::new();
        let tag = IoTag {
            cid: 7,
            bytes: 0,
            write: true,
            nsid: 0,
        };
        let r = run(&sink, tag, || {
            std::thread::sleep(Duration::from_millis(20));
            Status::WRITE_FAULT
        });
        assert_eq!(r, Submitted::Pending);
        let start = Instant::now();
        while sink.is_empty() || Arc::strong_count(&sink) > 1 {
            assert!(start.elapsed() < Duration::from_secs(10), "job never ran");
            std::thread::sleep(Duration::from_millis(1));
        }
        let mut got = Vec::new();
        sink.drain(|t, s| got.push((t.cid, s)));
        assert_eq!(got, vec![(7, Status::WRITE_FAULT)]);
    }

    /// A helper's post wakes the thread that owns the sink through its
    /// wake-up eventfd (what the reactor sleeps on), at once.
    #[test]
    fn post_wakes_the_owning_thread() {
        let fd = crate::wake::fd().expect("eventfd");
        crate::wake::clear();
        let sink = CompletionSink::new();
        assert!(sink.has_waker());
        let tag = IoTag {
            cid: 1,
            bytes: 0,
            write: false,
            nsid: 0,
        };
        let start = Instant::now();
        assert_eq!(run(&sink, tag, || Status::SUCCESS), Submitted::Pending);
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd for the duration of the call.
        let n = unsafe { libc::poll(&mut pfd, 1, 5000) };
        assert_eq!(n, 1, "eventfd not signalled");
        assert!(start.elapsed() < Duration::from_secs(5));
        assert!(!sink.is_empty());
    }
}
