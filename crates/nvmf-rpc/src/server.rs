//! Owns the JSON-RPC server on a Unix stream socket, off the data path: one
//! accept thread plus one blocking thread per client connection (few, short
//! lived), all calling into a shared `RpcService`. Each connection may send
//! any number of requests back to back (see `framing`); each response is one
//! compact JSON value followed by a newline. A parse error is answered with
//! code -32700 (id null) and the connection is closed, as SPDK does.

use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use serde_json::json;

use crate::error::PARSE_ERROR;
use crate::framing::FrameDecoder;
use crate::service::RpcService;

/// A running server. Dropping it (or `shutdown`) stops accepting and removes
/// the socket file; connections in progress finish their current request.
pub struct RpcServer {
    path: PathBuf,
    /// A duplicate of the listening socket, to wake the accept on shutdown.
    wake: OwnedFd,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// Binds `path` (a stale socket file nobody answers on is replaced; a live
/// one is an `AddrInUse` error) and serves `service` on its own thread.
pub fn serve(path: impl AsRef<Path>, service: Arc<RpcService>) -> io::Result<RpcServer> {
    let path = path.as_ref().to_path_buf();
    let listener = bind(&path)?;
    let wake = OwnedFd::from(listener.try_clone()?);
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let thread = std::thread::Builder::new()
        .name("nvmf-rpc".into())
        .spawn(move || accept_loop(listener, service, stop2))?;
    Ok(RpcServer {
        path,
        wake,
        stop,
        thread: Some(thread),
    })
}

fn bind(path: &Path) -> io::Result<UnixListener> {
    match UnixListener::bind(path) {
        Ok(l) => Ok(l),
        Err(e) if e.kind() == io::ErrorKind::AddrInUse => {
            if UnixStream::connect(path).is_ok() {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!(
                        "{}: another process serves RPC on this socket",
                        path.display()
                    ),
                ));
            }
            // Nobody answers: replace a stale socket, but never delete
            // anything else that happens to sit at this path.
            use std::os::unix::fs::FileTypeExt;
            let is_socket = std::fs::symlink_metadata(path)
                .map(|m| m.file_type().is_socket())
                .unwrap_or(false);
            if !is_socket {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!(
                        "{}: exists and is not a socket; refusing to replace it",
                        path.display()
                    ),
                ));
            }
            std::fs::remove_file(path)?;
            UnixListener::bind(path)
        }
        Err(e) => Err(io::Error::new(
            e.kind(),
            format!("cannot listen on {}: {e}", path.display()),
        )),
    }
}

fn accept_loop(listener: UnixListener, service: Arc<RpcService>, stop: Arc<AtomicBool>) {
    for conn in listener.incoming() {
        if stop.load(Ordering::Acquire) {
            break;
        }
        let conn = match conn {
            Ok(c) => c,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) if e.kind() == io::ErrorKind::ConnectionAborted => continue,
            Err(_) if stop.load(Ordering::Acquire) => break,
            Err(_) => {
                // EMFILE and friends: back off instead of spinning.
                std::thread::sleep(std::time::Duration::from_millis(50));
                continue;
            }
        };
        let service = service.clone();
        let _ = std::thread::Builder::new()
            .name("nvmf-rpc-conn".into())
            .spawn(move || {
                let _ = serve_connection(conn, &service);
            });
    }
}

/// Serves one connection until the peer closes it or sends malformed JSON.
pub fn serve_connection<S: Read + Write>(mut conn: S, service: &RpcService) -> io::Result<()> {
    let mut dec = FrameDecoder::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match conn.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        dec.push(&buf[..n]);
        loop {
            match dec.next_value() {
                Ok(Some(req)) => {
                    if let Some(resp) = service.handle(&req) {
                        let mut out = resp.to_string().into_bytes();
                        out.push(b'\n');
                        conn.write_all(&out)?;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    let resp = json!({
                        "jsonrpc": "2.0",
                        "id": null,
                        "error": { "code": PARSE_ERROR, "message": e.to_string() },
                    });
                    let mut out = resp.to_string().into_bytes();
                    out.push(b'\n');
                    conn.write_all(&out)?;
                    return Ok(());
                }
            }
        }
    }
}

impl RpcServer {
    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Stops accepting connections and removes the socket file.
    pub fn shutdown(&mut self) {
        if let Some(t) = self.thread.take() {
            self.stop.store(true, Ordering::Release);
            // shutdown(2) on a listening socket makes a blocked accept return.
            // SAFETY: `wake` is an open socket descriptor owned by `self`.
            unsafe { libc::shutdown(self.wake.as_raw_fd(), libc::SHUT_RDWR) };
            let _ = t.join();
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

impl Drop for RpcServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}
