//! The `nvmfd-auth` threads: where the FFDHE arithmetic of DH-HMAC-CHAP
//! runs (milliseconds to tens of milliseconds per exponentiation), so that
//! neither a reactor nor the backend helper pool (slow backend work of
//! other hosts' I/O) waits on it. A host flooding the target with
//! ffdhe8192 negotiations only queues behind itself and other
//! authentications (connections are capped per peer, `limits.rs`).
//!
//! Owns the pool (a `JobPool` of nvmf-backend's helper module, [`AUTH_THREADS`]
//! threads started on first use); a job's completion goes to its queue
//! pair's `CompletionSink` with a wake-up of the owning reactor, like the
//! helper pool's. The queue is bounded by the commands hosts have
//! outstanding (each job is an Authentication Send that answered Pending).

use std::sync::Arc;

use nvmf_wire::status::Status;

use crate::backend::helper::JobPool;
use crate::backend::{CompletionSink, IoTag, Submitted};

/// Threads in the pool.
pub const AUTH_THREADS: usize = 1;

static POOL: JobPool = JobPool::new("nvmfd-auth", AUTH_THREADS);

/// Runs `work` on an authentication thread; success is posted to `sink`
/// under `tag` when it is done (a panic posts Internal Error). Without a
/// thread the work runs here (logged).
pub(crate) fn run(
    sink: &Arc<CompletionSink>,
    tag: IoTag,
    work: Box<dyn FnOnce() + Send>,
) -> Submitted {
    POOL.run(sink, tag, move || {
        work();
        Status::SUCCESS
    })
}
