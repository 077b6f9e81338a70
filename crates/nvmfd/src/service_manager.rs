//! nvmfd's side of systemd's service protocol (`Type=notify`, sd_notify(3)), through the
//! `sd-notify` crate; everything here is a no-op when the daemon was not started by a
//! service manager (no `NOTIFY_SOCKET`).
//!
//! * `READY=1` once the RPC socket and every listener accept (and again after a reload),
//!   `RELOADING=1` while `systemctl reload` (SIGHUP) applies the configuration file,
//!   `STOPPING=1` when a clean stop begins.
//! * A watchdog thread: every few seconds it pings every reactor by message and waits
//!   for the answers. Only when every reactor answered does it send `WATCHDOG=1` (when
//!   the unit has `WatchdogSec=`) and a `STATUS=` line with the controllers and queues.
//!   A reactor stuck in a loop or a blocking call stops the pings, and systemd restarts
//!   the daemon (`Restart=on-failure`); the log names the reactor that did not answer.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sd_notify::NotifyState;
use tracing::{debug, error, info, warn};

use crate::live::ReactorHandle;
use crate::reactor::ReactorCmd;

/// Whether a service manager listens (`NOTIFY_SOCKET` set).
pub fn enabled() -> bool {
    std::env::var_os("NOTIFY_SOCKET").is_some()
}

fn notify(states: &[NotifyState]) {
    if !enabled() {
        return;
    }
    if let Err(e) = sd_notify::notify(states) {
        debug!("sd_notify: {e}");
    }
}

/// `READY=1` with a status line.
pub fn ready(status: &str) {
    notify(&[NotifyState::Ready, NotifyState::Status(status)]);
}

/// `RELOADING=1` (with the monotonic time systemd ≥ 253 wants) and a status line.
pub fn reloading() {
    let mut states = vec![
        NotifyState::Reloading,
        NotifyState::Status("reloading the configuration file"),
    ];
    if let Ok(now) = NotifyState::monotonic_usec_now() {
        states.push(now);
    }
    notify(&states);
}

/// `STOPPING=1` and a status line.
pub fn stopping(why: &str) {
    notify(&[NotifyState::Stopping, NotifyState::Status(why)]);
}

/// What the reactors answered a ping with.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Liveness {
    pub admin_queues: usize,
    pub io_queues: usize,
}

/// Pings every reactor and waits up to `limit` for all of them: their totals, or the
/// first reactor that did not answer.
pub fn ping_all(reactors: &[ReactorHandle], limit: Duration) -> Result<Liveness, usize> {
    let (tx, rx) = std::sync::mpsc::channel();
    let mut asked = vec![false; reactors.len()];
    for (i, r) in reactors.iter().enumerate() {
        asked[i] = r.send(ReactorCmd::Ping {
            reactor: i,
            reply: tx.clone(),
        });
    }
    drop(tx);
    let deadline = Instant::now() + limit;
    let mut answered = vec![false; reactors.len()];
    let mut total = Liveness::default();
    while answered.iter().zip(&asked).any(|(a, s)| *s && !*a) {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok((i, l)) => {
                if let Some(a) = answered.get_mut(i) {
                    *a = true;
                }
                total.admin_queues += l.admin_queues;
                total.io_queues += l.io_queues;
            }
            Err(_) => break,
        }
    }
    match answered.iter().zip(&asked).position(|(a, s)| !*a || !*s) {
        Some(i) => Err(i),
        None => Ok(total),
    }
}

/// The status line: controllers (admin queues) and I/O queues served.
pub fn status_line(l: Liveness, reactors: usize) -> String {
    format!(
        "serving: {} controller(s), {} I/O queue(s) on {reactors} reactor(s)",
        l.admin_queues, l.io_queues
    )
}

/// Starts the watchdog thread (see the top comment) when a service manager listens. The
/// period is half of `WatchdogSec=` (5 s without one); a reactor gets half the period to
/// answer.
pub fn spawn_watchdog(
    reactors: Arc<Vec<ReactorHandle>>,
    shutdown: Arc<AtomicBool>,
) -> Option<std::thread::JoinHandle<()>> {
    if !enabled() {
        return None;
    }
    let interval = sd_notify::watchdog_enabled();
    let watchdog = interval.is_some();
    let period = interval.map_or(Duration::from_secs(5), |d| {
        (d / 2).max(Duration::from_millis(100))
    });
    if let Some(d) = interval {
        info!(
            "systemd watchdog: {} ms; a ping every {} ms while every reactor answers",
            d.as_millis(),
            period.as_millis()
        );
    }
    std::thread::Builder::new()
        .name("watchdog".into())
        .spawn(move || {
            let mut stuck: Option<usize> = None;
            while !shutdown.load(Ordering::SeqCst) {
                let t0 = Instant::now();
                match ping_all(&reactors, period / 2) {
                    Ok(l) => {
                        if let Some(r) = stuck.take() {
                            warn!(reactor = r, "reactor {r} answers again");
                        }
                        let status = status_line(l, reactors.len());
                        if watchdog {
                            notify(&[NotifyState::Watchdog, NotifyState::Status(&status)]);
                        } else {
                            notify(&[NotifyState::Status(&status)]);
                        }
                    }
                    Err(r) => {
                        if stuck.replace(r).is_none() {
                            error!(
                                reactor = r,
                                "reactor {r} did not answer the watchdog's ping within {} ms: \
                                 no watchdog ping is sent while it does not, so that systemd \
                                 restarts nvmfd",
                                (period / 2).as_millis()
                            );
                        }
                        notify(&[NotifyState::Status(&format!("reactor {r} not answering"))]);
                    }
                }
                let spent = t0.elapsed();
                // Sleeps in short steps, so that a stop is not delayed.
                let mut left = period.saturating_sub(spent);
                while !left.is_zero() && !shutdown.load(Ordering::SeqCst) {
                    let step = left.min(Duration::from_millis(100));
                    std::thread::sleep(step);
                    left -= step;
                }
            }
        })
        .map_err(|e| warn!("cannot start the watchdog thread: {e}"))
        .ok()
}
