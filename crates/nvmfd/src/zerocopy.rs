//! Zero-copy sends on the reactor's sockets (`MSG_ZEROCOPY`, SPDK's
//! `enable_zerocopy_send_server`): turning it on for a socket, making the
//! calls, reading the kernel's reports from the socket's error queue, and
//! keeping a closed connection's buffers until the kernel is done with
//! them. The bookkeeping of which slot waits for which call is nvmf-tcp's
//! (`zerocopy.rs`, `txq.rs`).
//!
//! A closed connection whose zero-copy calls are not all reported cannot
//! free its slot buffers: the kernel may still read them (a retransmission,
//! a NIC's DMA) and would send whatever was written there next. So the
//! reactor keeps the socket open (shut down, out of epoll) with a hold on
//! the queue's buffers ([`Draining`]): the request engine's teardown then
//! parks them (`nvmf_backend::parked`, the rules for buffers a backend
//! still uses), and the hold is dropped when the error queue has reported
//! every call. A kernel that never reports within [`DRAIN_LIMIT`] (longer
//! than any TCP user timeout nvmfd sets) gets the buffers for ever: they
//! are leaked, never freed early.

use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use nvmf_zerocopy::ZcTracker;
pub use nvmf_zerocopy::{drain, enable, send};

/// How long a closed connection's buffers wait for the kernel's reports.
pub const DRAIN_LIMIT: Duration = Duration::from_secs(300);

/// A closed connection's socket, kept open until the kernel has reported
/// every zero-copy call, the hold that keeps its buffers parked, and its
/// admission ticket: the host's connection caps go on counting it while
/// its buffers are held (else closing connections with zero-copy reads in
/// the socket would pile up memory past the caps).
pub struct Draining<S: AsRawFd, H, T = ()> {
    sock: S,
    hold: Option<H>,
    ticket: Option<T>,
    calls: ZcTracker,
    since: Instant,
}

/// What [`Draining::poll`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DrainState {
    /// Calls still unreported.
    Waiting(u32),
    /// Every call reported: the buffers can go.
    Done,
    /// [`DRAIN_LIMIT`] passed: the buffers were leaked.
    GaveUp(u32),
}

impl<S: AsRawFd, H, T> Draining<S, H, T> {
    /// Keeps `sock` (shut down both ways: nothing more is read or queued),
    /// `hold` and `ticket` until `calls` are all reported.
    pub fn new(sock: S, hold: H, ticket: T, calls: ZcTracker) -> Draining<S, H, T> {
        // SAFETY: shutdown(2) of a descriptor we own.
        unsafe { libc::shutdown(sock.as_raw_fd(), libc::SHUT_RDWR) };
        Draining {
            sock,
            hold: Some(hold),
            ticket: Some(ticket),
            calls,
            since: Instant::now(),
        }
    }

    /// Reads the error queue; drops the hold once every call is reported,
    /// or leaks it after [`DRAIN_LIMIT`].
    pub fn poll(&mut self, now: Instant) -> DrainState {
        let calls = &mut self.calls;
        // A failing error queue (the socket reset) still reports what it
        // has; what it does not is waited for until the limit.
        let _ = drain(self.sock.as_raw_fd(), |lo, hi, copied| {
            calls.complete(lo, hi, copied)
        });
        let left = self.calls.outstanding();
        if left == 0 {
            self.hold = None;
            self.ticket = None;
            return DrainState::Done;
        }
        if now.saturating_duration_since(self.since) > DRAIN_LIMIT {
            if let Some(h) = self.hold.take() {
                std::mem::forget(h);
            }
            // The leaked buffers stay leaked; the host's admission does not.
            self.ticket = None;
            return DrainState::GaveUp(left);
        }
        DrainState::Waiting(left)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvmf_zerocopy::SendKind;
    use std::io::{self, IoSlice, Read};
    use std::net::{TcpListener, TcpStream};
    use std::sync::{Arc, Weak};

    /// A real loopback connection: the sender zero-copies 8 MiB from a
    /// buffer the receiver does not read yet, so the kernel holds calls
    /// unreported; the sender's connection is then "closed" with the buffer
    /// held by a [`Draining`]. The buffer must stay alive (and unchanged)
    /// until the kernel reports every call, and go once it has.
    #[test]
    fn a_closed_connection_keeps_its_buffers_until_the_kernel_reports() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut rx = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (tx, _) = l.accept().unwrap();
        tx.set_nonblocking(true).unwrap();
        if let Err(e) = enable(tx.as_raw_fd()) {
            panic!("SO_ZEROCOPY: {e}");
        }
        let buf: Arc<Vec<u8>> = Arc::new((0..8u32 << 20).map(|i| (i * 7 + 3) as u8).collect());
        let canary: Weak<Vec<u8>> = Arc::downgrade(&buf);
        let mut calls = ZcTracker::default();
        let mut off = 0;
        // Send until the socket is full (the receiver reads nothing).
        for _ in 0..10_000 {
            if off == buf.len() {
                break;
            }
            match send(
                tx.as_raw_fd(),
                &[IoSlice::new(&buf[off..])],
                SendKind::ZeroCopy,
            ) {
                Ok(n) => {
                    calls.sent();
                    off += n;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => break,
                Err(e) => panic!("sendmsg: {e}"),
            }
        }
        assert!(off > 0, "nothing sent");
        let _ = drain(tx.as_raw_fd(), |lo, hi, c| calls.complete(lo, hi, c));
        assert!(
            calls.outstanding() > 0,
            "the kernel reported every call while the receiver read nothing"
        );
        // Closed: the buffer's only owner is now the hold.
        // The admission ticket (here an Arc standing in for it) stays with
        // the entry as long as the buffers do.
        let ticket = Arc::new(());
        let mut d = Draining::new(tx, buf, ticket.clone(), calls);
        assert!(matches!(d.poll(Instant::now()), DrainState::Waiting(_)));
        assert!(canary.upgrade().is_some(), "freed with calls outstanding");
        assert_eq!(
            Arc::strong_count(&ticket),
            2,
            "ticket released while draining"
        );
        // The receiver reads what was sent (shut down after the queued
        // data, so it ends); its bytes are the buffer's.
        rx.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut got = Vec::with_capacity(off);
        let _ = rx.read_to_end(&mut got);
        let want: Vec<u8> = (0..off as u32).map(|i| (i * 7 + 3) as u8).collect();
        assert!(got.len() <= off);
        assert!(got[..] == want[..got.len()], "bytes on the wire changed");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match d.poll(Instant::now()) {
                DrainState::Done => break,
                DrainState::Waiting(n) => {
                    assert!(Instant::now() < deadline, "{n} calls never reported");
                    assert!(
                        canary.upgrade().is_some(),
                        "freed with {n} calls outstanding"
                    );
                    std::thread::sleep(Duration::from_millis(10));
                }
                DrainState::GaveUp(n) => panic!("gave up with {n}"),
            }
        }
        assert!(
            canary.upgrade().is_none(),
            "kept after every call was reported"
        );
        assert_eq!(Arc::strong_count(&ticket), 1, "ticket kept after draining");
    }

    /// Past the limit the buffers are leaked (never freed early), but the
    /// admission ticket is released.
    #[test]
    fn giving_up_leaks_the_buffers_and_releases_the_ticket() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let _rx = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (tx, _) = l.accept().unwrap();
        let buf = Arc::new(vec![1u8; 64]);
        let canary = Arc::downgrade(&buf);
        let ticket = Arc::new(());
        let mut calls = ZcTracker::default();
        calls.sent();
        let mut d = Draining::new(tx, buf, ticket.clone(), calls);
        let late = Instant::now() + DRAIN_LIMIT + Duration::from_secs(1);
        assert!(matches!(d.poll(late), DrainState::GaveUp(1)));
        assert!(
            canary.upgrade().is_some(),
            "a buffer with a call unreported was freed"
        );
        assert_eq!(Arc::strong_count(&ticket), 1, "ticket kept after giving up");
    }
}
