//! The `nvmfd-auth` threads: where the FFDHE arithmetic of DH-HMAC-CHAP
//! runs (milliseconds to tens of milliseconds per exponentiation, more for
//! ffdhe8192), so that neither a reactor nor the backend helper pool waits
//! on it, and the scheduling that keeps hosts who cannot authenticate from
//! starving those who can.
//!
//! Owns the scheduler ([`run`]): [`auth_threads`] threads started on first
//! use, and two bounded queues of jobs (an Authentication Send that
//! answered Pending; its completion goes to its queue pair's
//! `CompletionSink` with a wake-up of the owning reactor):
//! - **known** ([`Class::Known`]): re-authentication on a queue that has
//!   authenticated, or any authentication from a peer address where a host
//!   authenticated within [`KNOWN_FOR`] ([`remember`]); always served first;
//! - **new** ([`Class::New`]): everyone else. Anybody who knows a host NQN
//!   (not a secret) can ask for an ffdhe8192 key pair, so these are capped
//!   ([`NEW_PER_ADDRESS`] queued or running per peer address,
//!   [`NEW_QUEUED`] queued in all) and served round robin over the peer
//!   addresses, so one address's flood delays another's first job by at
//!   most one of its own.
//!
//! A job over a cap is not queued: the Send fails at once with Command
//! Interrupted and the queue pair closes the queue, so a flood costs the
//! flooder its connections. A legitimate host's (re)authentication waits
//! for at most the jobs already running plus the known queue, never for
//! the flood.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use nvmf_wire::status::Status;

use crate::backend::{CompletionSink, IoTag, Submitted};

/// New-class jobs queued or running per peer address at most (a fresh host
/// connecting to several subsystems at once has a few).
pub const NEW_PER_ADDRESS: usize = 8;
/// New-class jobs queued (not running) in all at most.
pub const NEW_QUEUED: usize = 256;
/// Known-class jobs queued at most (bounded anyway by the queues of hosts
/// that have authenticated; this only guards memory).
pub const KNOWN_QUEUED: usize = 4096;
/// A peer address stays known this long after a host authenticated from it.
pub const KNOWN_FOR: Duration = Duration::from_secs(3600);
/// Peer addresses remembered at most (the oldest is forgotten first).
const KNOWN_ADDRESSES: usize = 4096;

/// Which queue an authentication job waits in (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    Known,
    New,
}

/// The job was not queued: its class is over a cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Busy;

/// Threads in the pool: half the CPUs, at least 1, at most 4 (the work is
/// bursty; reactors keep the rest).
pub fn auth_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get() / 2)
        .unwrap_or(1)
        .clamp(1, 4)
}

struct Job {
    work: Box<dyn FnOnce() + Send>,
    sink: Arc<CompletionSink>,
    tag: IoTag,
    /// Where a new-class job counts (none for known ones).
    addr: Option<IpAddr>,
}

#[derive(Default)]
struct Queues {
    known: VecDeque<Job>,
    /// New-class jobs by peer address, and the addresses in service order
    /// (each present once while it has jobs queued).
    new: HashMap<IpAddr, VecDeque<Job>>,
    turn: VecDeque<IpAddr>,
    new_queued: usize,
    /// New-class jobs queued or running, per peer address.
    per_addr: HashMap<IpAddr, usize>,
    /// Statistics (tests, logs).
    refused: u64,
}

struct Scheduler {
    q: Mutex<Queues>,
    ready: Condvar,
    threads: usize,
}

static SCHED: OnceLock<Option<Arc<Scheduler>>> = OnceLock::new();

fn scheduler() -> Option<&'static Arc<Scheduler>> {
    SCHED
        .get_or_init(|| {
            let s = Arc::new(Scheduler {
                q: Mutex::new(Queues::default()),
                ready: Condvar::new(),
                threads: auth_threads(),
            });
            let mut started = 0;
            for i in 0..s.threads {
                let s2 = s.clone();
                match std::thread::Builder::new()
                    .name(format!("nvmfd-auth-{i}"))
                    .spawn(move || worker(&s2))
                {
                    Ok(_) => started += 1,
                    Err(e) => tracing::warn!("cannot start an nvmfd-auth thread: {e}"),
                }
            }
            (started > 0).then_some(s)
        })
        .as_ref()
}

fn worker(s: &Scheduler) {
    loop {
        let job = {
            let mut q = s.q.lock().unwrap_or_else(|e| e.into_inner());
            loop {
                if let Some(j) = q.known.pop_front().or_else(|| q.pop_new()) {
                    break j;
                }
                q = s.ready.wait(q).unwrap_or_else(|e| e.into_inner());
            }
        };
        let Job {
            work,
            sink,
            tag,
            addr,
        } = job;
        let status = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)) {
            Ok(()) => Status::SUCCESS,
            Err(_) => Status::INTERNAL_ERROR,
        };
        if let Some(a) = addr {
            let mut q = s.q.lock().unwrap_or_else(|e| e.into_inner());
            release_addr(&mut q.per_addr, a);
        }
        CompletionSink::post_and_wake(sink, tag, status);
    }
}

impl Queues {
    /// The next new-class job, round robin over the peer addresses.
    fn pop_new(&mut self) -> Option<Job> {
        let a = self.turn.pop_front()?;
        let jobs = self.new.get_mut(&a)?;
        let j = jobs.pop_front();
        if jobs.is_empty() {
            self.new.remove(&a);
        } else {
            self.turn.push_back(a);
        }
        if j.is_some() {
            self.new_queued -= 1;
        }
        j
    }
}

fn release_addr(per_addr: &mut HashMap<IpAddr, usize>, a: IpAddr) {
    if let Some(n) = per_addr.get_mut(&a) {
        *n = n.saturating_sub(1);
        if *n == 0 {
            per_addr.remove(&a);
        }
    }
}

/// Runs `work` on an authentication thread in `class` (`peer`: the host's
/// address, which new-class jobs are counted by); success is posted to
/// `sink` under `tag` when it is done (a panic posts Internal Error).
/// `Err(Busy)` when the class is over a cap (nothing queued). Without a
/// thread the work runs here (logged).
pub(crate) fn run(
    sink: &Arc<CompletionSink>,
    tag: IoTag,
    work: Box<dyn FnOnce() + Send>,
    class: Class,
    peer: IpAddr,
) -> Result<Submitted, Busy> {
    let Some(s) = scheduler() else {
        static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        if !WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
            tracing::warn!("no nvmfd-auth thread could be started: DH-HMAC-CHAP arithmetic runs inline, on the reactor");
        }
        work();
        return Ok(Submitted::Done(Status::SUCCESS));
    };
    let mut q = s.q.lock().unwrap_or_else(|e| e.into_inner());
    let addr = match class {
        Class::Known => {
            if q.known.len() >= KNOWN_QUEUED {
                q.refused += 1;
                return Err(Busy);
            }
            None
        }
        Class::New => {
            let here = q.per_addr.get(&peer).copied().unwrap_or(0);
            if here >= NEW_PER_ADDRESS || q.new_queued >= NEW_QUEUED {
                q.refused += 1;
                return Err(Busy);
            }
            *q.per_addr.entry(peer).or_default() += 1;
            Some(peer)
        }
    };
    let job = Job {
        work,
        sink: sink.clone(),
        tag,
        addr,
    };
    match class {
        Class::Known => q.known.push_back(job),
        Class::New => {
            let jobs = q.new.entry(peer).or_default();
            let first = jobs.is_empty();
            jobs.push_back(job);
            if first {
                q.turn.push_back(peer);
            }
            q.new_queued += 1;
        }
    }
    drop(q);
    s.ready.notify_one();
    Ok(Submitted::Pending)
}

/// Jobs refused so far (over a cap).
pub fn refused() -> u64 {
    scheduler().map_or(0, |s| s.q.lock().unwrap_or_else(|e| e.into_inner()).refused)
}

/// Peer addresses where a host authenticated, and when (bounded).
fn known() -> &'static Mutex<HashMap<IpAddr, Instant>> {
    static KNOWN: OnceLock<Mutex<HashMap<IpAddr, Instant>>> = OnceLock::new();
    KNOWN.get_or_init(Mutex::default)
}

/// A host authenticated from `addr`: its later authentications from there
/// are in the known class for [`KNOWN_FOR`].
pub(crate) fn remember(addr: IpAddr) {
    let now = Instant::now();
    let mut k = known().lock().unwrap_or_else(|e| e.into_inner());
    if k.len() >= KNOWN_ADDRESSES && !k.contains_key(&addr) {
        k.retain(|_, at| now.saturating_duration_since(*at) < KNOWN_FOR);
        if k.len() >= KNOWN_ADDRESSES {
            if let Some(oldest) = k.iter().min_by_key(|(_, at)| **at).map(|(a, _)| *a) {
                k.remove(&oldest);
            }
        }
    }
    k.insert(addr, now);
}

/// Whether a host authenticated from `addr` within [`KNOWN_FOR`].
pub(crate) fn is_known(addr: IpAddr) -> bool {
    let k = known().lock().unwrap_or_else(|e| e.into_inner());
    k.get(&addr).is_some_and(|at| at.elapsed() < KNOWN_FOR)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_address_counts_go_back_to_nothing() {
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let mut m = HashMap::new();
        *m.entry(a).or_insert(0) += 2;
        release_addr(&mut m, a);
        assert_eq!(m.get(&a), Some(&1));
        release_addr(&mut m, a);
        assert!(m.is_empty());
        release_addr(&mut m, a);
        assert!(m.is_empty());
    }

    #[test]
    fn an_address_is_known_after_an_authentication() {
        let a: IpAddr = "192.0.2.77".parse().unwrap();
        assert!(!is_known(a));
        remember(a);
        assert!(is_known(a));
    }
}
