//! Logging to journald with structured fields, when nvmfd runs under systemd with its output
//! going to the journal (`JOURNAL_STREAM` set) and journald's socket is there.
//!
//! Each log event becomes one journal entry in journald's native protocol: `MESSAGE`,
//! `PRIORITY` (error 3, warn 4, info 6, debug and trace 7), `SYSLOG_IDENTIFIER=nvmfd`, and
//! every field of the event upper-cased (`hostnqn` → `HOSTNQN`, `subnqn`, `cntlid`, `peer`,
//! `reactor`, `group`, ...), so that `journalctl -u nvmfd HOSTNQN=nqn...` finds one host's
//! lines. The entry is built on the thread that logs, queued (bounded, dropping when full, as
//! the stderr writer does) and sent by the `nvmfd-journal` thread: a slow journald never
//! blocks a reactor. Entries that were dropped are counted and reported in the next one
//! sent.
//!
//! Not tracing-journald: it sends each entry from the thread that logs, and a full journal
//! socket blocks that thread, which a reactor must never do.
//!
//! `NVMFD_JOURNAL_SOCKET` replaces journald's socket path (the tests' stand-in journald).

use std::fmt::Write as _;
use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::Arc;

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::Context;
use tracing_subscriber::Layer;

/// journald's socket.
const JOURNALD_SOCKET: &str = "/run/systemd/journal/socket";
/// Entries waiting for the journal thread before new ones are dropped.
const QUEUE: usize = 8192;

/// Where the journal is, when nvmfd should log there (see the top comment). systemd sets
/// `JOURNAL_STREAM=DEV:INO` for a service whose stderr is a journal stream; a process that
/// only inherited the variable (a shell started from such a service) has another stderr,
/// so the device and inode must be stderr's own. `NVMFD_JOURNAL_SOCKET` (a test's stand-in
/// journald) skips that check.
pub fn socket_path() -> Option<PathBuf> {
    let stream = std::env::var("JOURNAL_STREAM").ok()?;
    if let Some(p) = std::env::var_os("NVMFD_JOURNAL_SOCKET") {
        let p = PathBuf::from(p);
        return p.exists().then_some(p);
    }
    if !stderr_is(&stream) {
        return None;
    }
    let p = PathBuf::from(JOURNALD_SOCKET);
    p.exists().then_some(p)
}

/// Whether stderr is the stream `JOURNAL_STREAM` names (`DEV:INO`, decimal).
fn stderr_is(stream: &str) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Some((dev, ino)) = stream.split_once(':') else {
        return false;
    };
    let (Ok(dev), Ok(ino)) = (dev.parse::<u64>(), ino.parse::<u64>()) else {
        return false;
    };
    // fstat(2) of fd 2, through the /proc link to it.
    match std::fs::metadata("/proc/self/fd/2") {
        Ok(m) => m.dev() == dev && m.ino() == ino,
        Err(_) => false,
    }
}

/// The layer that queues entries for the journal thread.
pub struct JournalLayer {
    tx: SyncSender<Vec<u8>>,
    dropped: Arc<AtomicU64>,
}

/// Starts the journal thread sending to `path`; the layer feeds it.
pub fn layer(path: PathBuf) -> std::io::Result<JournalLayer> {
    let sock = UnixDatagram::unbound()?;
    let (tx, rx) = sync_channel::<Vec<u8>>(QUEUE);
    let dropped = Arc::new(AtomicU64::new(0));
    std::thread::Builder::new()
        .name("nvmfd-journal".into())
        .spawn(move || {
            for entry in rx {
                // Nothing to tell when journald itself refuses: stderr goes to it too.
                let _ = sock.send_to(&entry, &path);
            }
        })?;
    Ok(JournalLayer { tx, dropped })
}

/// Appends one journal field. Values with a newline use the protocol's length-prefixed form.
fn field(out: &mut Vec<u8>, name: &str, value: &str) {
    out.extend_from_slice(name.as_bytes());
    if value.contains('\n') {
        out.push(b'\n');
        out.extend_from_slice(&(value.len() as u64).to_le_bytes());
        out.extend_from_slice(value.as_bytes());
    } else {
        out.push(b'=');
        out.extend_from_slice(value.as_bytes());
    }
    out.push(b'\n');
}

/// A tracing field name as a journal field name: upper case, `_` for anything else, never
/// starting with `_` or a digit (those are journald's own), and not one this layer writes.
pub fn journal_name(name: &str) -> Option<String> {
    let mut s: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect();
    while s.starts_with(|c: char| c == '_' || c.is_ascii_digit()) {
        s.remove(0);
    }
    let own = ["MESSAGE", "PRIORITY", "SYSLOG_IDENTIFIER"];
    (!s.is_empty() && !own.contains(&s.as_str())).then_some(s)
}

struct Fields {
    message: String,
    rest: Vec<(String, String)>,
}

impl Visit for Fields {
    fn record_str(&mut self, f: &Field, value: &str) {
        if f.name() == "message" {
            self.message.push_str(value);
        } else if let Some(n) = journal_name(f.name()) {
            self.rest.push((n, value.to_string()));
        }
    }

    fn record_debug(&mut self, f: &Field, value: &dyn std::fmt::Debug) {
        if f.name() == "message" {
            let _ = write!(self.message, "{value:?}");
        } else if let Some(n) = journal_name(f.name()) {
            self.rest.push((n, format!("{value:?}")));
        }
    }
}

fn priority(l: &Level) -> &'static str {
    match *l {
        Level::ERROR => "3",
        Level::WARN => "4",
        Level::INFO => "6",
        _ => "7",
    }
}

/// The entry of one event (see the top comment).
pub fn entry(level: &Level, message: &str, fields: &[(String, String)], dropped: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(128 + message.len());
    let mut msg = message.to_string();
    if dropped > 0 {
        let _ = write!(
            msg,
            " ({dropped} earlier log entries dropped: the journal was slow)"
        );
    }
    field(&mut out, "MESSAGE", &msg);
    field(&mut out, "PRIORITY", priority(level));
    field(&mut out, "SYSLOG_IDENTIFIER", "nvmfd");
    for (k, v) in fields {
        field(&mut out, k, v);
    }
    out
}

impl<S: Subscriber> Layer<S> for JournalLayer {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let mut f = Fields {
            message: String::new(),
            rest: Vec::new(),
        };
        event.record(&mut f);
        let dropped = self.dropped.swap(0, Ordering::Relaxed);
        let e = entry(event.metadata().level(), &f.message, &f.rest, dropped);
        match self.tx.try_send(e) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.dropped.fetch_add(dropped + 1, Ordering::Relaxed);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_journal_stream_must_be_stderr_itself() {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata("/proc/self/fd/2").unwrap();
        assert!(stderr_is(&format!("{}:{}", m.dev(), m.ino())));
        assert!(!stderr_is(&format!("{}:{}", m.dev(), m.ino() + 1)));
        assert!(!stderr_is("8:12345x"));
        assert!(!stderr_is(""));
    }

    #[test]
    fn names_are_journal_field_names() {
        assert_eq!(journal_name("hostnqn").as_deref(), Some("HOSTNQN"));
        assert_eq!(journal_name("group.name").as_deref(), Some("GROUP_NAME"));
        assert_eq!(journal_name("_pid"), Some("PID".into()));
        assert_eq!(journal_name("2x").as_deref(), Some("X"));
        assert_eq!(journal_name("priority"), None);
        assert_eq!(journal_name("__"), None);
    }

    #[test]
    fn an_entry_in_the_native_protocol() {
        let e = entry(
            &Level::WARN,
            "two\nlines",
            &[("CNTLID".into(), "1".into())],
            3,
        );
        let text = String::from_utf8_lossy(&e);
        assert!(text.contains("PRIORITY=4\n"), "{text}");
        assert!(text.contains("SYSLOG_IDENTIFIER=nvmfd\n"));
        assert!(text.contains("CNTLID=1\n"));
        // The multi-line message in the length-prefixed form.
        let msg = "two\nlines (3 earlier log entries dropped: the journal was slow)";
        let mut want = b"MESSAGE\n".to_vec();
        want.extend_from_slice(&(msg.len() as u64).to_le_bytes());
        want.extend_from_slice(msg.as_bytes());
        want.push(b'\n');
        assert!(e.starts_with(&want));
    }
}
