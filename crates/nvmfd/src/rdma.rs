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
//! [`RdmaControl`] is the control plane's handle: the first RDMA listener
//! (at start, or added live by RPC) starts the reactor; later ones, and
//! removals, reach it by message (channel + waker) and are answered within
//! a bounded wait, like the TCP reactors' commands.

use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Registry, Token, Waker};
use nvmf_config::{ListenerConfig, RdmaOptions, TransportType};
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

/// How long the control plane waits for the RDMA reactor's answer.
const REPLY_WAIT: Duration = Duration::from_secs(5);

/// A message from the control plane to the RDMA reactor.
pub enum RdmaCmd {
    /// Listen on one more address.
    Listen {
        cfg: ListenerConfig,
        reply: Sender<Result<(), String>>,
    },
    /// Disconnect the queues that came in on `addr` (of subsystem
    /// `only_nqn` only, when given); with `unlisten`, stop listening there.
    /// Answers how many queues were disconnected.
    Drop {
        addr: SocketAddr,
        only_nqn: Option<String>,
        unlisten: bool,
        reply: Sender<usize>,
    },
}

/// A running RDMA reactor: its thread, its waker (shutdown and commands)
/// and its command channel.
struct RdmaReactor {
    waker: Arc<Waker>,
    tx: Sender<RdmaCmd>,
    thread: std::thread::JoinHandle<()>,
}

/// The control plane's handle on NVMe/RDMA: starts the reactor with the
/// first RDMA listener, sends it later listeners and removals, stops it.
pub struct RdmaControl {
    target: Arc<Target>,
    fetch_timeout: Duration,
    max_fetch_bytes: u32,
    connect_timeout: Duration,
    /// The RDMA transport's own options (shared receive queues).
    options: RdmaOptions,
    shutdown: Arc<AtomicBool>,
    running: Mutex<Option<RdmaReactor>>,
}

impl RdmaControl {
    /// No reactor yet; `fetch_timeout` and `max_fetch_bytes` are the
    /// daemon's data-transfer limits (`--h2c-timeout-ms`, `--max-r2t-bytes`),
    /// `connect_timeout` its `--connect-timeout-ms`; `options` the RDMA
    /// transport's (`nvmf_create_transport -t RDMA`: SRQ or not, its depth).
    pub fn new(
        target: Arc<Target>,
        fetch_timeout: Duration,
        max_fetch_bytes: u32,
        connect_timeout: Duration,
        options: RdmaOptions,
        shutdown: Arc<AtomicBool>,
    ) -> RdmaControl {
        RdmaControl {
            target,
            fetch_timeout,
            max_fetch_bytes,
            connect_timeout,
            options,
            shutdown,
            running: Mutex::new(None),
        }
    }

    /// Listens on `l` (an NVMe/RDMA listener). The first one starts the
    /// RDMA reactor, with the RDMA transport's limits as configured now.
    /// Fails with the reason when RDMA cannot be used here (no rdma-core,
    /// no device, an address no RDMA device has).
    pub fn listen(&self, l: &ListenerConfig) -> Result<(), String> {
        let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(r) = running.as_ref() {
            let (tx, rx) = channel();
            let cmd = RdmaCmd::Listen {
                cfg: l.clone(),
                reply: tx,
            };
            if r.tx.send(cmd).is_err() || r.waker.wake().is_err() {
                return Err("the NVMe/RDMA reactor is not running".into());
            }
            return rx.recv_timeout(REPLY_WAIT).unwrap_or_else(|_| {
                Err(format!(
                    "NVMe/RDMA listener {}:{}: the RDMA reactor did not answer within {:?}",
                    l.traddr, l.trsvcid, REPLY_WAIT
                ))
            });
        }
        let params = request_params(&self.target, self.fetch_timeout, self.max_fetch_bytes);
        let r = start(
            self.target.clone(),
            l,
            params,
            self.connect_timeout,
            &self.options,
            self.shutdown.clone(),
        )
        .map_err(|e| format!("{e:#}"))?;
        *running = Some(r);
        Ok(())
    }

    /// See [`RdmaCmd::Drop`]; 0 when no RDMA reactor runs.
    pub fn drop_listener(&self, addr: SocketAddr, only_nqn: Option<&str>, unlisten: bool) -> usize {
        let running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        let Some(r) = running.as_ref() else {
            return 0;
        };
        let (tx, rx) = channel();
        let cmd = RdmaCmd::Drop {
            addr,
            only_nqn: only_nqn.map(str::to_string),
            unlisten,
            reply: tx,
        };
        if r.tx.send(cmd).is_err() || r.waker.wake().is_err() {
            return 0;
        }
        rx.recv_timeout(REPLY_WAIT).unwrap_or(0)
    }

    /// Stops the reactor (the shutdown flag must be set) and waits for it.
    pub fn stop(&self) {
        let r = self
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(r) = r {
            let _ = r.waker.wake();
            let _ = r.thread.join();
        }
    }
}

/// The request engine's limits for NVMe/RDMA queues: the RDMA transport's
/// configuration, with the data timeout and fetch allowance of the daemon.
fn request_params(target: &Target, fetch_timeout: Duration, max_fetch_bytes: u32) -> RequestParams {
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

/// Starts listening on `first` (NVMe/RDMA) and the thread that serves it.
fn start(
    target: Arc<Target>,
    first: &ListenerConfig,
    params: RequestParams,
    connect_timeout: Duration,
    options: &RdmaOptions,
    shutdown: Arc<AtomicBool>,
) -> Result<RdmaReactor> {
    let what = format!("NVMe/RDMA listener {}:{}", first.traddr, first.trsvcid);
    let mut port =
        RdmaPort::new(target, params, connect_timeout).map_err(|e| anyhow!("{what}: {e}"))?;
    port.set_options(options);
    port.listen(first).map_err(|e| anyhow!("{e}"))?;
    let poll = Poll::new()?;
    let waker = Arc::new(Waker::new(poll.registry(), WAKER)?);
    let (tx, rx) = channel();
    let thread = std::thread::Builder::new()
        .name("rdma-reactor".into())
        .spawn(move || run(port, poll, rx, shutdown))?;
    Ok(RdmaReactor { waker, tx, thread })
}

/// Carries out the control plane's messages.
fn commands(port: &mut RdmaPort, rx: &Receiver<RdmaCmd>, fds: &mut dyn FnMut(FdChange)) {
    // Bounded: what was sent before this wake-up (the sender waits for each
    // answer, so there are few).
    for _ in 0..64 {
        let Ok(cmd) = rx.try_recv() else {
            return;
        };
        match cmd {
            RdmaCmd::Listen { cfg, reply } => {
                let _ = reply.send(port.listen(&cfg));
            }
            RdmaCmd::Drop {
                addr,
                only_nqn,
                unlisten,
                reply,
            } => {
                let n = port.drop_listener(addr, only_nqn.as_deref(), unlisten, fds);
                let _ = reply.send(n);
            }
        }
    }
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

fn run(mut port: RdmaPort, mut poll: Poll, rx: Receiver<RdmaCmd>, shutdown: Arc<AtomicBool>) {
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
                WAKER => commands(&mut port, &rx, &mut |c| changes.push(c)),
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
