//! What a reactor applies to each connection before NVMe sees it: the
//! connection caps shared by all reactors and both transports (in total and
//! per peer IP address, counted at a TCP accept or an RDMA connect request
//! and at close under one small lock: control path, never per I/O; see
//! `rdma::route`), the TCP keepalive / TCP_USER_TIMEOUT settings of every
//! accepted socket (the backstop that detects a half-open peer whose
//! controller has keep-alive off), and [`LogLimiter`], the per-reactor rate
//! limit of per-connection log lines.

use socket2::{SockRef, TcpKeepalive};
use std::collections::HashMap;
use std::net::IpAddr;
use std::os::fd::AsFd;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Default of `--max-connections`.
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;
/// Default of `--max-connections-per-host`.
pub const DEFAULT_MAX_CONNECTIONS_PER_HOST: usize = 512;

#[derive(Debug, Default)]
struct Counts {
    total: usize,
    /// Connections refused by `max_total` / by `max_per_ip` so far.
    refused_total: u64,
    refused_per_ip: u64,
    /// Only addresses with open connections have an entry.
    per_ip: HashMap<IpAddr, usize>,
}

/// Connection caps shared by every reactor and transport. 0 = unlimited.
#[derive(Debug)]
pub struct ConnLimits {
    max_total: usize,
    max_per_ip: usize,
    counts: Mutex<Counts>,
}

/// Why an accepted connection was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    Total(usize),
    PerHost(usize),
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::Total(n) => write!(f, "{n} connections in total (--max-connections)"),
            Refused::PerHost(n) => write!(
                f,
                "{n} connections from this address (--max-connections-per-host)"
            ),
        }
    }
}

/// [`ConnLimits::usage`]: caps are 0 when unlimited.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ConnUsage {
    pub open: usize,
    pub max_total: usize,
    pub max_per_ip: usize,
    pub refused_total: u64,
    pub refused_per_ip: u64,
}

/// One admitted connection; gives its place back when dropped.
#[derive(Debug)]
pub struct ConnTicket {
    limits: Arc<ConnLimits>,
    ip: IpAddr,
}

impl ConnLimits {
    pub fn new(max_total: usize, max_per_ip: usize) -> Arc<ConnLimits> {
        Arc::new(ConnLimits {
            max_total,
            max_per_ip,
            counts: Mutex::new(Counts::default()),
        })
    }

    fn counts(&self) -> std::sync::MutexGuard<'_, Counts> {
        self.counts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Admit a connection from `ip`, or say which cap it would break.
    pub fn admit(self: &Arc<Self>, ip: IpAddr) -> Result<ConnTicket, Refused> {
        let ip = canonical(ip);
        let mut c = self.counts();
        if self.max_total != 0 && c.total >= self.max_total {
            c.refused_total += 1;
            return Err(Refused::Total(self.max_total));
        }
        let n = c.per_ip.get(&ip).copied().unwrap_or(0);
        if self.max_per_ip != 0 && n >= self.max_per_ip {
            c.refused_per_ip += 1;
            return Err(Refused::PerHost(self.max_per_ip));
        }
        c.total += 1;
        c.per_ip.insert(ip, n + 1);
        Ok(ConnTicket {
            limits: self.clone(),
            ip,
        })
    }

    /// Open connections, the caps and the refusals so far (`/metrics`).
    pub fn usage(&self) -> ConnUsage {
        let c = self.counts();
        ConnUsage {
            open: c.total,
            max_total: self.max_total,
            max_per_ip: self.max_per_ip,
            refused_total: c.refused_total,
            refused_per_ip: c.refused_per_ip,
        }
    }

    /// Open connections (all, and from `ip`).
    #[cfg(test)]
    pub fn open(&self, ip: IpAddr) -> (usize, usize) {
        let c = self.counts();
        (c.total, c.per_ip.get(&canonical(ip)).copied().unwrap_or(0))
    }
}

impl Drop for ConnTicket {
    fn drop(&mut self) {
        let mut c = self.limits.counts();
        c.total = c.total.saturating_sub(1);
        if let Some(n) = c.per_ip.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                c.per_ip.remove(&self.ip);
            }
        }
    }
}

/// An IPv4 peer on a dual-stack socket counts as its IPv4 address.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// TCP keepalive of accepted sockets: after `idle` without traffic the
/// kernel probes every `interval`; TCP_USER_TIMEOUT (`user_timeout`) bounds
/// both unanswered probes and unacknowledged data, so a peer that vanished
/// without a FIN or RST makes the socket fail with ETIMEDOUT in bounded time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keepalive {
    /// None: no keepalive probes.
    pub idle: Option<Duration>,
    pub interval: Duration,
    pub probes: u32,
    /// None: no TCP_USER_TIMEOUT.
    pub user_timeout: Option<Duration>,
}

/// Defaults of `--tcp-keepalive-*`.
pub const DEFAULT_KEEPALIVE_IDLE_S: u64 = 30;
pub const DEFAULT_KEEPALIVE_INTERVAL_S: u64 = 5;
pub const DEFAULT_KEEPALIVE_PROBES: u32 = 4;

impl Keepalive {
    /// From the CLI values: idle 0 turns probes off; user timeout None means
    /// idle + interval × probes (when the last probe goes unanswered), 0 off.
    pub fn from_cli(idle_s: u64, interval_s: u64, probes: u32, user_ms: Option<u64>) -> Self {
        let idle = (idle_s != 0).then(|| Duration::from_secs(idle_s));
        let interval = Duration::from_secs(interval_s.max(1));
        let probes = probes.max(1);
        let user_timeout = match user_ms {
            Some(0) => None,
            Some(ms) => Some(Duration::from_millis(ms)),
            None => idle.map(|i| i + interval * probes),
        };
        Keepalive {
            idle,
            interval,
            probes,
            user_timeout,
        }
    }

    /// Apply to an accepted socket.
    pub fn apply<S: AsFd>(&self, sock: &S) -> std::io::Result<()> {
        let s = SockRef::from(sock);
        if let Some(idle) = self.idle {
            let ka = TcpKeepalive::new()
                .with_time(idle)
                .with_interval(self.interval)
                .with_retries(self.probes);
            s.set_tcp_keepalive(&ka)?;
        }
        if let Some(t) = self.user_timeout {
            s.set_tcp_user_timeout(Some(t))?;
        }
        Ok(())
    }
}

/// Default of `--log-rate`.
pub const DEFAULT_LOG_RATE: u32 = 20;

/// At most `per_sec` lines per one-second window; the rest are counted and
/// reported as one "suppressed" line when the next window opens.
#[derive(Debug)]
pub struct LogLimiter {
    per_sec: u32,
    window: Instant,
    used: u32,
    suppressed: u64,
}

impl LogLimiter {
    /// `per_sec` 0: no limit.
    pub fn new(per_sec: u32) -> LogLimiter {
        LogLimiter {
            per_sec,
            window: Instant::now(),
            used: 0,
            suppressed: 0,
        }
    }

    /// Whether a line may be logged now. `report` gets the number of lines
    /// suppressed in the windows before, once, when a new window opens.
    pub fn allow(&mut self, now: Instant, report: impl FnOnce(u64)) -> bool {
        if self.per_sec == 0 {
            return true;
        }
        self.roll(now, report);
        if self.used < self.per_sec {
            self.used += 1;
            true
        } else {
            self.suppressed += 1;
            false
        }
    }

    /// Reports the suppressed count once its window is over (timer tick),
    /// so a burst's tail is accounted for even if no line follows.
    pub fn roll(&mut self, now: Instant, report: impl FnOnce(u64)) {
        if now.saturating_duration_since(self.window) >= Duration::from_secs(1) {
            self.window = now;
            self.used = 0;
            if self.suppressed > 0 {
                report(std::mem::take(&mut self.suppressed));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_total_and_per_ip() {
        let l = ConnLimits::new(3, 2);
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let t1 = l.admit(a).unwrap();
        let _t2 = l.admit(a).unwrap();
        assert_eq!(l.admit(a).unwrap_err(), Refused::PerHost(2));
        // The same address as an IPv4-mapped IPv6 peer.
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().unwrap();
        assert_eq!(l.admit(mapped).unwrap_err(), Refused::PerHost(2));
        let _t3 = l.admit(b).unwrap();
        assert_eq!(l.admit(b).unwrap_err(), Refused::Total(3));
        drop(t1);
        assert_eq!(l.open(a), (2, 1));
        let _t4 = l.admit(b).unwrap();
        assert_eq!(l.open(b), (3, 2));
        // refusals are counted by cap (`/metrics`)
        assert_eq!(
            l.usage(),
            ConnUsage {
                open: 3,
                max_total: 3,
                max_per_ip: 2,
                refused_total: 1,
                refused_per_ip: 2,
            }
        );
    }

    #[test]
    fn unlimited() {
        let l = ConnLimits::new(0, 0);
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let v: Vec<_> = (0..10_000).map(|_| l.admit(a).unwrap()).collect();
        assert_eq!(l.open(a), (10_000, 10_000));
        drop(v);
        assert_eq!(l.open(a), (0, 0));
    }

    #[test]
    fn log_limiter() {
        let t0 = Instant::now();
        let mut l = LogLimiter::new(3);
        let mut reported = Vec::new();
        let n = (0..10)
            .filter(|_| l.allow(t0, |k| reported.push(k)))
            .count();
        assert_eq!(n, 3);
        assert!(reported.is_empty());
        let t1 = t0 + Duration::from_millis(1100);
        assert!(l.allow(t1, |k| reported.push(k)));
        assert_eq!(reported, vec![7]);
        // The tick reports a tail with no line after it.
        for _ in 0..5 {
            l.allow(t1, |_| {});
        }
        l.roll(t1 + Duration::from_secs(2), |k| reported.push(k));
        assert_eq!(reported, vec![7, 3]);
        let mut u = LogLimiter::new(0);
        assert!((0..1000).all(|_| u.allow(t0, |_| unreachable!())));
    }

    #[test]
    fn keepalive_defaults() {
        let k = Keepalive::from_cli(30, 5, 4, None);
        assert_eq!(k.user_timeout, Some(Duration::from_secs(50)));
        let k = Keepalive::from_cli(0, 5, 4, None);
        assert_eq!((k.idle, k.user_timeout), (None, None));
        let k = Keepalive::from_cli(30, 5, 4, Some(0));
        assert_eq!(k.user_timeout, None);
    }
}
