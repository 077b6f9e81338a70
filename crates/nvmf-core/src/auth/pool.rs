//! The `nvmfd-auth` threads: where the FFDHE arithmetic of DH-HMAC-CHAP
//! runs (milliseconds to tens of milliseconds per exponentiation), so that
//! neither a reactor nor the backend helper pool (slow backend work of
//! other hosts' I/O) waits on it. A host flooding the target with
//! ffdhe8192 negotiations only queues behind itself and other
//! authentications (connections are capped per peer, `limits.rs`).
//!
//! Owns the threads (started on first use, [`AUTH_THREADS`], living for the
//! rest of the process) and the job queue; a job's completion goes to its
//! queue pair's `CompletionSink` with a wake-up of the owning reactor, like
//! the helper pool's. The queue is bounded by the commands hosts have
//! outstanding (each job is an Authentication Send that answered Pending).

use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex, OnceLock};

use nvmf_wire::status::Status;

use crate::backend::{CompletionSink, IoTag, Submitted};

/// Threads in the pool.
pub const AUTH_THREADS: usize = 1;

struct Job {
    work: Box<dyn FnOnce() + Send>,
    sink: Arc<CompletionSink>,
    tag: IoTag,
}

static POOL: OnceLock<Option<Mutex<Sender<Job>>>> = OnceLock::new();

fn start() -> Option<Mutex<Sender<Job>>> {
    let (tx, rx) = channel::<Job>();
    let rx = Arc::new(Mutex::new(rx));
    let mut started = 0;
    for i in 0..AUTH_THREADS {
        let rx = rx.clone();
        match std::thread::Builder::new()
            .name(format!("nvmfd-auth-{i}"))
            .spawn(move || worker(&rx))
        {
            Ok(_) => started += 1,
            Err(e) => tracing::warn!("cannot start an authentication thread: {e}"),
        }
    }
    (started > 0).then(|| Mutex::new(tx))
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
        let status = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)) {
            Ok(()) => Status::SUCCESS,
            Err(_) => Status::INTERNAL_ERROR,
        };
        CompletionSink::post_and_wake(sink, tag, status);
    }
}

/// Runs `work` on an authentication thread; success is posted to `sink`
/// under `tag` when it is done. Without a thread the work runs here
/// (logged once).
pub(crate) fn run(
    sink: &Arc<CompletionSink>,
    tag: IoTag,
    work: Box<dyn FnOnce() + Send>,
) -> Submitted {
    let job = Job {
        work,
        sink: sink.clone(),
        tag,
    };
    if let Some(tx) = POOL.get_or_init(start) {
        let tx = tx.lock().unwrap_or_else(|e| e.into_inner());
        match tx.send(job) {
            Ok(()) => return Submitted::Pending,
            Err(e) => {
                (e.0.work)();
                return Submitted::Done(Status::SUCCESS);
            }
        }
    }
    static WARNED: std::sync::Once = std::sync::Once::new();
    WARNED.call_once(|| tracing::warn!("no authentication thread: FFDHE runs inline"));
    (job.work)();
    Submitted::Done(Status::SUCCESS)
}
