//! The NVMe/RDMA reactor: one thread that owns the target's RDMA port
//! (`nvmf_rdma::RdmaPort`: CM listeners, every RDMA queue pair accepted on
//! them) for its life. Its epoll set holds the RDMA CM event channel, each
//! connection's completion channel (added and removed as the port says),
//! the thread's backend wake-up eventfd (io_uring and helper completions)
//! and a waker for shutdown. Run to completion like the TCP reactors: a
//! readable completion channel is drained, the queue runs, and everything
//! it asks for is posted in one list per queue; a 100 ms tick drives
//! keep-alive, asynchronous events and deferred completions; the thread
//! sleeps in epoll when idle.
//!
//! RDMA listeners are set up at start only: a live configuration change
//! that adds one is refused with a message to restart (see `live.rs`).

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Registry, Token, Waker};
use nvmf_config::{ListenerConfig, TransportType};
use nvmf_core::backend::{uring, wake};
use nvmf_core::request::{BufPolicy, RequestParams};
use nvmf_core::Target;
use nvmf_rdma::{FdChange, RdmaPort};
use tracing::{info, warn};

const WAKER: Token = Token(0);
const CM: Token = Token(1);
const BACKEND: Token = Token(2);
const CONN_BASE: usize = 16;
const TICK: Duration = Duration::from_millis(100);

/// A running RDMA reactor: wake it to make it see the shutdown flag.
pub struct RdmaReactor {
    pub waker: Arc<Waker>,
    pub thread: std::thread::JoinHandle<()>,
}

/// The request engine's limits for NVMe/RDMA queues: the RDMA transport's
/// configuration, with the data timeout and fetch allowance of the daemon.
pub fn request_params(
    target: &Target,
    fetch_timeout: Duration,
    max_fetch_bytes: u32,
) -> RequestParams {
    let l = target.limits_for(TransportType::Rdma);
    let max_io = l.max_io_size.max(4096);
    let budget = usize::try_from(l.data_buffer_budget()).unwrap_or(usize::MAX);
    RequestParams {
        in_capsule_data_size: l.in_capsule_data_size,
        admin_in_capsule_data_size: l.in_capsule_data_size,
        max_io_size: max_io,
        buffers: BufPolicy::new(
            budget,
            (l.in_capsule_data_size as usize).max(4096),
            max_io as usize,
        ),
        max_fetch_bytes,
        fetch_timeout,
        fetch_timeout_name: "RDMA READ timeout",
    }
}

/// Starts listening on `listeners` (all NVMe/RDMA) and the thread that
/// serves them. Fails with the reason when RDMA cannot be used here (no
/// rdma-core, no device, an address no RDMA device has).
pub fn start(
    target: Arc<Target>,
    listeners: &[&ListenerConfig],
    params: RequestParams,
    connect_timeout: Duration,
    shutdown: Arc<AtomicBool>,
) -> Result<RdmaReactor> {
    let first = listeners
        .first()
        .map(|l| format!("NVMe/RDMA listener {}:{}", l.traddr, l.trsvcid))
        .unwrap_or_default();
    let mut port =
        RdmaPort::new(target, params, connect_timeout).map_err(|e| anyhow!("{first}: {e}"))?;
    for l in listeners {
        port.listen(l).map_err(|e| anyhow!("{e}"))?;
    }
    let poll = Poll::new()?;
    let waker = Arc::new(Waker::new(poll.registry(), WAKER)?);
    let thread = std::thread::Builder::new()
        .name("rdma-reactor".into())
        .spawn(move || run(port, poll, shutdown))?;
    Ok(RdmaReactor { waker, thread })
}

fn apply(reg: &Registry, ch: FdChange) {
    match ch {
        FdChange::Add { fd, key } => {
            if let Err(e) = reg.register(
                &mut SourceFd(&fd),
                Token(CONN_BASE + key),
                Interest::READABLE,
            ) {
                warn!("cannot watch an RDMA completion channel: {e}");
            }
        }
        FdChange::Remove { fd, .. } => {
            let _ = reg.deregister(&mut SourceFd(&fd));
        }
    }
}

fn run(mut port: RdmaPort, mut poll: Poll, shutdown: Arc<AtomicBool>) {
    let cm: RawFd = port.channel_fd();
    if let Err(e) = poll
        .registry()
        .register(&mut SourceFd(&cm), CM, Interest::READABLE)
    {
        warn!("cannot watch the RDMA CM event channel: {e}: NVMe/RDMA connections are not served");
        return;
    }
    uring::set_batching(true);
    if let Ok(fd) = wake::fd() {
        let _ = poll
            .registry()
            .register(&mut SourceFd(&fd), BACKEND, Interest::READABLE);
    }
    info!("NVMe/RDMA reactor running");
    let mut events = Events::with_capacity(256);
    let mut next_tick = Instant::now() + TICK;
    let mut changes: Vec<FdChange> = Vec::new();
    while !shutdown.load(Ordering::Relaxed) {
        let now = Instant::now();
        let timeout = if port.connections() == 0 {
            None
        } else {
            Some(next_tick.saturating_duration_since(now))
        };
        if let Err(e) = poll.poll(&mut events, timeout) {
            if e.kind() != std::io::ErrorKind::Interrupted {
                warn!("epoll failed: {e}");
            }
            continue;
        }
        let mut backend = false;
        for ev in events.iter() {
            match ev.token() {
                WAKER => {}
                CM => port.on_cm_events(&mut |c| changes.push(c)),
                BACKEND => {
                    wake::clear();
                    backend = true;
                }
                Token(t) => port.on_cq(t - CONN_BASE, &mut |c| changes.push(c)),
            }
            for c in changes.drain(..) {
                apply(poll.registry(), c);
            }
        }
        if uring::flush() > 0 || backend {
            port.poll_executing(&mut |c| changes.push(c));
            uring::flush();
        }
        let now = Instant::now();
        if now >= next_tick {
            next_tick = now + TICK;
            port.tick(now, &mut |c| changes.push(c));
        }
        for c in changes.drain(..) {
            apply(poll.registry(), c);
        }
    }
    info!("NVMe/RDMA reactor stopped");
}
