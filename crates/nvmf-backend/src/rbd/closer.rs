//! Where rbd images are closed: never on the thread that drops the backend
//! (possibly a reactor), since `rbd_close` waits for the image's operations
//! in flight (up to the OSD op timeout when the cluster stopped answering).
//!
//! Owns [`hand_off`]: each close runs on a thread of its own
//! (`nvmf-rbd-close`, so one slow close never holds up another); when no
//! thread can be spawned then (out of threads or memory), the close goes to
//! the one long-lived fallback thread (`nvmf-rbd-closer`), which
//! [`ensure_started`] starts when the first image opens (the control plane:
//! an open fails with a clear error if even that thread cannot start). A
//! close is never run inline.

use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex, OnceLock};

/// A close to run.
pub type CloseJob = Box<dyn FnOnce() + Send>;

static FALLBACK: OnceLock<Option<Mutex<Sender<CloseJob>>>> = OnceLock::new();

fn fallback() -> Option<&'static Mutex<Sender<CloseJob>>> {
    FALLBACK
        .get_or_init(|| {
            let (tx, rx) = channel::<CloseJob>();
            std::thread::Builder::new()
                .name("nvmf-rbd-closer".into())
                .spawn(move || {
                    while let Ok(job) = rx.recv() {
                        job();
                    }
                })
                .ok()
                .map(|_| Mutex::new(tx))
        })
        .as_ref()
}

/// Starts the fallback closing thread if it is not running (called before
/// an image is opened). Err: it cannot be started.
pub fn ensure_started() -> Result<(), String> {
    fallback()
        .map(|_| ())
        .ok_or_else(|| "cannot start the nvmf-rbd-closer thread".to_string())
}

/// Runs `close` on a new thread made by `spawn`, or, when that fails, on
/// the fallback thread. Returns where it went (for the log and tests).
pub fn hand_off(
    close: CloseJob,
    spawn: impl FnOnce(CloseJob) -> std::io::Result<()>,
) -> Result<Where, String> {
    // The job is shared with the spawned thread's closure, so that a failed
    // spawn (which drops that closure) does not drop, and so run the drop
    // glue of, the job itself: it is taken back and sent to the fallback.
    let slot: Arc<Mutex<Option<CloseJob>>> = Arc::new(Mutex::new(Some(close)));
    let theirs = slot.clone();
    let spawned = spawn(Box::new(move || {
        let job = theirs.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(job) = job {
            job();
        }
    }));
    match spawned {
        Ok(()) => Ok(Where::OwnThread),
        Err(e) => {
            let job = slot.lock().unwrap_or_else(|p| p.into_inner()).take();
            let Some(job) = job else {
                // The spawned closure ran (and took it) although spawn
                // reported an error: nothing left to do.
                return Ok(Where::OwnThread);
            };
            match fallback() {
                Some(tx) => {
                    let tx = tx.lock().unwrap_or_else(|p| p.into_inner());
                    match tx.send(job) {
                        Ok(()) => Ok(Where::Fallback),
                        Err(back) => {
                            // The fallback thread is gone: keep the image
                            // open for ever rather than block this thread.
                            std::mem::forget(back.0);
                            Err(format!("cannot start a closing thread ({e}) and the fallback closer is gone: the image is left open"))
                        }
                    }
                }
                None => {
                    std::mem::forget(job);
                    Err(format!("cannot start a closing thread ({e}) nor the fallback closer: the image is left open"))
                }
            }
        }
    }
}

/// Where a close went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Where {
    OwnThread,
    Fallback,
}

/// The normal spawner: a thread named `nvmf-rbd-close`.
pub fn spawn_thread(job: CloseJob) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("nvmf-rbd-close".into())
        .spawn(job)
        .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::sync_channel;
    use std::time::Duration;

    #[test]
    fn a_close_never_runs_on_the_dropping_thread_even_when_no_thread_can_be_spawned() {
        // Issue 23 finding 7: when the closing thread could not be
        // spawned, the failed spawn dropped the closure and with it the
        // image, so rbd_close ran on whichever thread dropped the backend
        // (possibly a reactor).
        struct Image(std::sync::mpsc::SyncSender<String>);
        impl Drop for Image {
            fn drop(&mut self) {
                let me = std::thread::current().name().unwrap_or("").to_string();
                let _ = self.0.send(me);
            }
        }
        ensure_started().unwrap();
        let (tx, rx) = sync_channel(4);
        let image = Image(tx);
        let job: CloseJob = Box::new(move || drop(image));
        let failing = |_job: CloseJob| Err(std::io::Error::other("no more threads"));
        let at = hand_off(job, failing).unwrap();
        assert_eq!(at, Where::Fallback);
        let closed_on = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(closed_on, "nvmf-rbd-closer");

        let (tx, rx) = sync_channel(4);
        let image = Image(tx);
        let at = hand_off(Box::new(move || drop(image)), spawn_thread).unwrap();
        assert_eq!(at, Where::OwnThread);
        assert_eq!(
            rx.recv_timeout(Duration::from_secs(10)).unwrap(),
            "nvmf-rbd-close"
        );
    }
}
