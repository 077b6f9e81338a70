//! Reactor supervision: no half-dead daemon.
//!
//! Owns [`run_supervised`], the body of every reactor thread. A reactor
//! catches a panic per connection and per RDMA queue (the connection or
//! queue is torn down, the reactor goes on); a panic that escapes anyway,
//! or a reactor loop that returns while the daemon is not shutting down,
//! would leave every queue of that reactor (and, on reactor 0, every RDMA
//! listener) dead in a process that still looks alive. Instead the death
//! is logged at once, naming the reactor and the panic message, and
//! reported to `on_death`, which in nvmfd makes the main thread stop the
//! other reactors and exit non-zero, so a supervisor (systemd's
//! `Restart=on-failure`) restarts it; with `--state` nothing is lost.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};

use tracing::error;

/// Runs reactor `id`'s loop `body`. When it panics, or returns while
/// `shutdown` is not set, `on_death` gets a line saying what happened
/// (also logged at error level). A panic is not propagated: the thread
/// ends normally and the main thread decides.
pub fn run_supervised(
    id: usize,
    shutdown: &AtomicBool,
    body: impl FnOnce(),
    on_death: impl FnOnce(String),
) {
    let outcome = catch_unwind(AssertUnwindSafe(body));
    let why = match outcome {
        Ok(()) if shutdown.load(Ordering::SeqCst) => return,
        Ok(()) => format!("reactor {id} stopped unexpectedly (not shutting down)"),
        Err(p) => {
            let msg = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "(no message)".to_string());
            format!("reactor {id} died: internal error (panic): {msg}")
        }
    };
    error!(
        reactor = id,
        "{why}; nvmfd is stopping with an error so that its supervisor restarts it"
    );
    on_death(why);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[test]
    fn a_panicking_reactor_is_reported_with_its_message() {
        let shutdown = AtomicBool::new(false);
        let seen = Mutex::new(None);
        run_supervised(
            3,
            &shutdown,
            || panic!("index out of bounds"),
            |why| *seen.lock().unwrap() = Some(why),
        );
        let why = seen.into_inner().unwrap().expect("death reported");
        assert!(why.contains("reactor 3 died"), "{why}");
        assert!(why.contains("index out of bounds"), "{why}");
    }

    #[test]
    fn a_reactor_that_returns_early_is_reported_but_not_at_shutdown() {
        let shutdown = AtomicBool::new(false);
        let seen = Mutex::new(None);
        run_supervised(1, &shutdown, || {}, |why| *seen.lock().unwrap() = Some(why));
        assert!(seen
            .into_inner()
            .unwrap()
            .is_some_and(|w| w.contains("reactor 1 stopped unexpectedly")));

        shutdown.store(true, Ordering::SeqCst);
        let mut called = false;
        run_supervised(1, &shutdown, || {}, |_| called = true);
        assert!(!called, "a reactor leaving at shutdown is no death");
    }
}
