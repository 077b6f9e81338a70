//! Reactors: one thread per selected core, pinned, each with its own mio
//! `Poll` (epoll), its own `SO_REUSEPORT` listeners and its own connections.
//! Run to completion: a readable socket is read into its connection's receive
//! buffer, every complete PDU is processed, and all responses leave in one
//! vectored write. The thread sleeps in epoll when idle; a 100 ms tick drives
//! keep-alive, async events and deferred completions (`QueuePair::poll`).
//! The thread's io_uring (file bdevs) signals an eventfd in the same epoll
//! set: on it, completions are reaped and the connections with commands in
//! flight are polled and written at once.

use crate::listen::ListenAddr;
use mio::net::{TcpListener, TcpStream};
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token, Waker};
use nvmf_core::backend::uring;
use nvmf_core::queue::PortInfo;
use nvmf_core::target::Target;
use nvmf_tcp::{Connection, TcpParams};
use slab::Slab;
use std::io::{self, IoSlice, Read, Write};
use std::net::SocketAddr;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::{debug, info, warn};

/// Wakes the reactor (shutdown).
pub const WAKER_TOKEN: Token = Token(0);
const LISTENER_BASE: usize = 1;
const CONN_BASE: usize = 1 << 16;
/// The thread's io_uring completion eventfd.
const URING_TOKEN: Token = Token(CONN_BASE - 1);
/// Timer tick: keep-alive, AER and async completion polling.
const TICK: Duration = Duration::from_millis(100);
/// A connection whose peer does not take its last bytes (e.g. the
/// termination request) within this time is dropped anyway.
const CLOSE_LINGER: Duration = Duration::from_secs(2);
/// Read/process/write rounds per connection before other sockets get a turn.
const MAX_ROUNDS: usize = 8;
/// iovecs per writev.
const IOV_BATCH: usize = 64;

/// Everything a reactor thread needs; built on the main thread.
pub struct Reactor {
    pub id: usize,
    pub cpu: Option<usize>,
    pub poll: Poll,
    pub listeners: Vec<(TcpListener, Arc<ListenAddr>)>,
    pub target: Arc<Target>,
    pub params: TcpParams,
    pub shutdown: Arc<AtomicBool>,
}

/// A reactor's view of one TCP connection.
struct Conn {
    sock: TcpStream,
    peer: SocketAddr,
    sm: Connection,
    /// The socket may have unread bytes (edge-triggered epoll).
    rx_ready: bool,
    /// The socket may accept more bytes.
    tx_ready: bool,
    /// WRITABLE interest is registered.
    want_writable: bool,
    /// epoll reported the peer's FIN (or an error): read until EOF, a short
    /// read does not mean the socket is drained of events.
    read_closed: bool,
    /// When the state machine asked to close while output was still queued.
    closing_since: Option<Instant>,
}

enum Outcome {
    Keep,
    Close(String),
}

impl Reactor {
    /// Creates the poll instance and the waker main uses to stop it.
    pub fn new_poll() -> io::Result<(Poll, Arc<Waker>)> {
        let poll = Poll::new()?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKER_TOKEN)?);
        Ok((poll, waker))
    }

    pub fn run(mut self) {
        if let Some(cpu) = self.cpu {
            match crate::cpus::pin_current_thread(cpu) {
                Ok(()) => debug!(reactor = self.id, cpu, "reactor pinned"),
                Err(e) => warn!(reactor = self.id, cpu, "cannot pin reactor thread: {e}"),
            }
        }
        for (i, (l, _)) in self.listeners.iter_mut().enumerate() {
            if let Err(e) =
                self.poll
                    .registry()
                    .register(l, Token(LISTENER_BASE + i), Interest::READABLE)
            {
                warn!(reactor = self.id, "cannot register listener: {e}");
            }
        }
        // This thread's io_uring: batched submissions, completions wake epoll.
        uring::set_batching(true);
        match uring::eventfd() {
            Ok(fd) => {
                if let Err(e) = self.poll.registry().register(
                    &mut SourceFd(&fd),
                    URING_TOKEN,
                    Interest::READABLE,
                ) {
                    warn!(
                        reactor = self.id,
                        "cannot register the io_uring eventfd: {e}"
                    );
                }
            }
            Err(e) => debug!(reactor = self.id, "no io_uring on this thread: {e}"),
        }
        let mut uring_ready = false;
        let mut events = Events::with_capacity(1024);
        let mut conns: Slab<Conn> = Slab::with_capacity(64);
        let mut again: Vec<usize> = Vec::with_capacity(64);
        let mut again_next: Vec<usize> = Vec::with_capacity(64);
        let mut tick_keys: Vec<usize> = Vec::with_capacity(64);
        let mut retry_accept = false;
        let mut next_tick = Instant::now() + TICK;

        while !self.shutdown.load(Ordering::Relaxed) {
            let now = Instant::now();
            // No connection and nothing to retry: sleep until an accept or
            // a wake-up, no timer. Otherwise wake for the next tick.
            let timeout = if !again.is_empty() {
                Some(Duration::ZERO)
            } else if conns.is_empty() && !retry_accept {
                None
            } else {
                Some(next_tick.saturating_duration_since(now))
            };
            if let Err(e) = self.poll.poll(&mut events, timeout) {
                if e.kind() != io::ErrorKind::Interrupted {
                    warn!(reactor = self.id, "epoll failed: {e}");
                }
                continue;
            }
            if self.shutdown.load(Ordering::Relaxed) {
                break;
            }
            for ev in events.iter() {
                let t = ev.token().0;
                if t == WAKER_TOKEN.0 {
                    continue;
                } else if t == URING_TOKEN.0 {
                    uring::clear_eventfd();
                    uring_ready = true;
                } else if t < CONN_BASE {
                    let i = t - LISTENER_BASE;
                    if !self.accept_all(i, &mut conns) {
                        retry_accept = true;
                    }
                } else {
                    let key = t - CONN_BASE;
                    let Some(c) = conns.get_mut(key) else {
                        continue;
                    };
                    if ev.is_readable() || ev.is_read_closed() || ev.is_error() {
                        c.rx_ready = true;
                    }
                    if ev.is_read_closed() || ev.is_error() {
                        c.read_closed = true;
                    }
                    if ev.is_writable() || ev.is_write_closed() {
                        c.tx_ready = true;
                    }
                    self.service_key(key, &mut conns, &mut again_next);
                }
            }
            // Connections that still had readable bytes after their turn.
            for key in again.drain(..) {
                if conns.contains(key) {
                    self.service_key(key, &mut conns, &mut again_next);
                }
            }
            std::mem::swap(&mut again, &mut again_next);
            again.sort_unstable();
            again.dedup();

            // File bdev completions: deliver them now, not on the next tick.
            if uring::flush() > 0 || std::mem::take(&mut uring_ready) {
                self.poll_executing(&mut conns, &mut again, &mut tick_keys);
                uring::flush();
            }

            let now = Instant::now();
            if conns.is_empty() && !retry_accept {
                next_tick = now + TICK;
            } else if now >= next_tick {
                next_tick = now + TICK;
                if retry_accept {
                    retry_accept = false;
                    for i in 0..self.listeners.len() {
                        if !self.accept_all(i, &mut conns) {
                            retry_accept = true;
                        }
                    }
                }
                tick_keys.clear();
                tick_keys.extend(conns.iter().map(|(k, _)| k));
                for &key in &tick_keys {
                    if let Some(c) = conns.get_mut(key) {
                        let polled = catch_unwind(AssertUnwindSafe(|| c.sm.poll(now)));
                        if polled.is_err() {
                            self.close(key, &mut conns, "internal error (panic) in poll".into());
                            continue;
                        }
                        if let Some(since) = c.closing_since {
                            if now.duration_since(since) > CLOSE_LINGER {
                                let reason = c.sm.close_reason().unwrap_or("closing").to_string();
                                self.close(
                                    key,
                                    &mut conns,
                                    format!("{reason} (peer stopped reading)"),
                                );
                                continue;
                            }
                        }
                    }
                    self.service_key(key, &mut conns, &mut again);
                }
            }
        }
        let n = conns.len();
        for (_, c) in conns.iter_mut() {
            let _ = self.poll.registry().deregister(&mut c.sock);
        }
        drop(conns);
        debug!(reactor = self.id, connections = n, "reactor stopped");
    }

    /// Accepts until the listen queue is empty. Returns false when accepting
    /// failed for a reason that needs a retry later (e.g. out of descriptors).
    fn accept_all(&mut self, i: usize, conns: &mut Slab<Conn>) -> bool {
        loop {
            let Some((listener, laddr)) = self.listeners.get(i) else {
                return true;
            };
            let (mut sock, peer) = match listener.accept() {
                Ok(x) => x,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::ConnectionAborted => continue,
                Err(e) => {
                    warn!(reactor = self.id, "accept on {} failed: {e}", laddr.addr);
                    return false;
                }
            };
            if let Err(e) = sock.set_nodelay(true) {
                debug!("TCP_NODELAY failed for {peer}: {e}");
            }
            let port = Arc::new(PortInfo {
                trtype: laddr.cfg.trtype,
                adrfam: laddr.cfg.adrfam,
                traddr: laddr.cfg.traddr.clone(),
                trsvcid: laddr.cfg.trsvcid.clone(),
                peer,
            });
            let sm = Connection::new(self.target.clone(), port, &self.params);
            let entry = conns.vacant_entry();
            let key = entry.key();
            if let Err(e) =
                self.poll
                    .registry()
                    .register(&mut sock, Token(CONN_BASE + key), Interest::READABLE)
            {
                warn!("cannot register connection from {peer}: {e}");
                continue;
            }
            info!(
                reactor = self.id,
                "connection accepted from {peer} on {} (tcp)", laddr.addr
            );
            entry.insert(Conn {
                sock,
                peer,
                sm,
                rx_ready: true,
                tx_ready: true,
                want_writable: false,
                read_closed: false,
                closing_since: None,
            });
        }
    }

    /// Polls (delivers late completions) and services every connection
    /// with commands waiting for an asynchronous backend.
    fn poll_executing(
        &self,
        conns: &mut Slab<Conn>,
        again: &mut Vec<usize>,
        keys: &mut Vec<usize>,
    ) {
        let now = Instant::now();
        keys.clear();
        keys.extend(
            conns
                .iter()
                .filter(|(_, c)| c.sm.has_executing())
                .map(|(k, _)| k),
        );
        for &key in keys.iter() {
            let Some(c) = conns.get_mut(key) else {
                continue;
            };
            if catch_unwind(AssertUnwindSafe(|| c.sm.poll(now))).is_err() {
                self.close(key, conns, "internal error (panic) in poll".into());
                continue;
            }
            self.service_key(key, conns, again);
        }
    }

    fn service_key(&self, key: usize, conns: &mut Slab<Conn>, again: &mut Vec<usize>) {
        let Some(c) = conns.get_mut(key) else { return };
        // A bug must cost one connection, not the reactor and all of its
        // connections: a panic closes just this one.
        let outcome = catch_unwind(AssertUnwindSafe(|| service(c)))
            .unwrap_or_else(|_| Outcome::Close("internal error (panic) while serving".into()));
        match outcome {
            Outcome::Keep => {
                if c.rx_ready && c.sm.wants_read() && c.closing_since.is_none() {
                    again.push(key);
                }
                let want_w = c.sm.has_output();
                if want_w != c.want_writable {
                    let interest = if want_w {
                        Interest::READABLE | Interest::WRITABLE
                    } else {
                        Interest::READABLE
                    };
                    if let Err(e) = self.poll.registry().reregister(
                        &mut c.sock,
                        Token(CONN_BASE + key),
                        interest,
                    ) {
                        self.close(key, conns, format!("epoll reregister failed: {e}"));
                        return;
                    }
                    c.want_writable = want_w;
                }
            }
            Outcome::Close(reason) => self.close(key, conns, reason),
        }
    }

    fn close(&self, key: usize, conns: &mut Slab<Conn>, reason: String) {
        if let Some(mut c) = conns.try_remove(key) {
            let _ = self.poll.registry().deregister(&mut c.sock);
            info!(
                reactor = self.id,
                "connection from {} closed: {reason}", c.peer
            );
            // Dropping `c` drops its QueuePair (controller teardown for an
            // admin queue) and closes the socket.
        }
    }
}

/// Reads, processes and writes until the socket has nothing more for us (or
/// the round budget is used up). Never blocks.
fn service(c: &mut Conn) -> Outcome {
    for _ in 0..MAX_ROUNDS {
        // Read everything available (bounded by the receive buffer and by
        // output backpressure); the state machine processes every complete
        // PDU as it arrives.
        let mut read_any = false;
        while c.rx_ready && c.sm.wants_read() {
            let buf = c.sm.recv_buf();
            let want = buf.len();
            match c.sock.read(buf) {
                Ok(0) => {
                    let why = if c.sm.close_reason().is_some() {
                        c.sm.close_reason().unwrap_or("closed").to_string()
                    } else if c.sm.has_partial_input() {
                        "peer closed the connection in the middle of a PDU".to_string()
                    } else {
                        "peer closed the connection".to_string()
                    };
                    return Outcome::Close(why);
                }
                Ok(n) => {
                    c.sm.on_recv(n);
                    read_any = true;
                    // A short read drained the socket (epoll(7)): no need
                    // for another read() that returns EAGAIN.
                    if n < want && !c.read_closed {
                        c.rx_ready = false;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => c.rx_ready = false,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Outcome::Close(format!("read error: {e}")),
            }
        }
        // One vectored write carries everything produced this turn.
        while c.tx_ready && c.sm.has_output() {
            let res = {
                let mut iov = [IoSlice::new(&[]); IOV_BATCH];
                let n = c.sm.output(&mut iov);
                c.sock.write_vectored(&iov[..n])
            };
            match res {
                Ok(0) => return Outcome::Close("socket accepted no bytes".into()),
                Ok(n) => c.sm.consume_output(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => c.tx_ready = false,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Outcome::Close(format!("write error: {e}")),
            }
        }
        if let Some(reason) = c.sm.close_reason() {
            if !c.sm.has_output() {
                return Outcome::Close(reason.to_string());
            }
            if c.closing_since.is_none() {
                c.closing_since = Some(Instant::now());
            }
            return Outcome::Keep;
        }
        if !(read_any && c.rx_ready && c.sm.wants_read()) {
            break;
        }
    }
    Outcome::Keep
}
