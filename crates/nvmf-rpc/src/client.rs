//! Owns the client side: `RpcClient` connects to a Unix socket, sends each
//! request as one compact JSON object (no newline needed, like rpc.py) and
//! reads until one complete JSON response decodes. Used by the `nvmf rpc` CLI
//! and by tests.

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};

use crate::error::RpcError;
use crate::framing::FrameDecoder;

/// Why a call failed.
#[derive(Debug)]
pub enum ClientError {
    /// Connecting, sending or receiving failed.
    Io(io::Error),
    /// The server's reply is not a JSON-RPC response.
    Protocol(String),
    /// The server answered with a JSON-RPC error.
    Rpc(RpcError),
}

impl std::fmt::Display for ClientError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientError::Io(e) => write!(f, "{e}"),
            ClientError::Protocol(e) => write!(f, "bad response: {e}"),
            ClientError::Rpc(e) => write!(f, "{} (JSON-RPC error {})", e.message, e.code),
        }
    }
}

impl std::error::Error for ClientError {}

impl From<io::Error> for ClientError {
    fn from(e: io::Error) -> Self {
        ClientError::Io(e)
    }
}

/// One connection to an RPC server.
pub struct RpcClient {
    sock: UnixStream,
    dec: FrameDecoder,
    next_id: u64,
}

impl RpcClient {
    /// Connects to `path`, retrying `retries` times 200 ms apart (rpc.py's `-r`).
    pub fn connect(path: impl AsRef<Path>, retries: u32) -> io::Result<RpcClient> {
        let path = path.as_ref();
        let mut attempt = 0;
        loop {
            match UnixStream::connect(path) {
                Ok(sock) => {
                    return Ok(RpcClient {
                        sock,
                        dec: FrameDecoder::new(),
                        next_id: 1,
                    })
                }
                Err(e) if attempt >= retries => {
                    return Err(io::Error::new(
                        e.kind(),
                        format!(
                            "cannot connect to {}: {e} (is nvmfd running with its RPC server on this socket? see -s)",
                            path.display()
                        ),
                    ))
                }
                Err(_) => {
                    attempt += 1;
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
        }
    }

    /// Response timeout (default: none).
    pub fn set_timeout(&mut self, t: Option<Duration>) -> io::Result<()> {
        self.sock.set_read_timeout(t)
    }

    /// The request object `call` sends.
    pub fn request(id: u64, method: &str, params: Option<&Value>) -> Value {
        let mut req = json!({ "jsonrpc": "2.0", "method": method, "id": id });
        if let Some(p) = params {
            req["params"] = p.clone();
        }
        req
    }

    /// Calls `method` and returns its `result`.
    pub fn call(&mut self, method: &str, params: Option<&Value>) -> Result<Value, ClientError> {
        let id = self.next_id;
        self.next_id += 1;
        let req = Self::request(id, method, params);
        self.sock.write_all(req.to_string().as_bytes())?;
        let resp = self.recv()?;
        if let Some(err) = resp.get("error") {
            let code = err["code"].as_i64().unwrap_or(0) as i32;
            let msg = err["message"].as_str().unwrap_or("").to_string();
            return Err(ClientError::Rpc(RpcError::new(code, msg)));
        }
        if resp.get("id") != Some(&json!(id)) {
            return Err(ClientError::Protocol(format!(
                "expected a response to request {id}, got {resp}"
            )));
        }
        resp.get("result")
            .cloned()
            .ok_or_else(|| ClientError::Protocol(format!("no result in {resp}")))
    }

    /// Reads the next complete JSON value from the server.
    pub fn recv(&mut self) -> Result<Value, ClientError> {
        let mut buf = [0u8; 16 * 1024];
        loop {
            match self.dec.next_value() {
                Ok(Some(v)) => return Ok(v),
                Ok(None) => {}
                Err(e) => return Err(ClientError::Protocol(e.to_string())),
            }
            let n = match self.sock.read(&mut buf) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    return Err(ClientError::Io(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "timed out waiting for the response",
                    )))
                }
                Err(e) => return Err(e.into()),
            };
            if n == 0 {
                return Err(ClientError::Protocol(format!(
                    "connection closed with partial response: {:?}",
                    String::from_utf8_lossy(self.dec.pending())
                )));
            }
            self.dec.push(&buf[..n]);
        }
    }
}
