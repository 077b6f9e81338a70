//! Shared test helpers: temporary directories, a server with a recording
//! live target on a temporary socket, raw-socket request helpers.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nvmf_config::TargetConfig;
use nvmf_rpc::framing::FrameDecoder;
use nvmf_rpc::{
    serve, ClientError, RecordingLive, RpcClient, RpcError, RpcServer, RpcService, StateFile,
};
use serde_json::Value;

pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: AtomicU32 = AtomicU32::new(0);
        let p = std::env::temp_dir().join(format!(
            "nvmf-rpc-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

// Fields drop in order: the server before the directory holding its socket.
pub struct Harness {
    pub server: RpcServer,
    pub sock: PathBuf,
    pub live: Arc<RecordingLive>,
    pub service: Arc<RpcService>,
    pub dir: TempDir,
}

impl Harness {
    pub fn new() -> Harness {
        Harness::with(TargetConfig::default(), false)
    }

    pub fn with(cfg: TargetConfig, state: bool) -> Harness {
        let dir = TempDir::new("srv");
        let sock = dir.path().join("rpc.sock");
        let live = Arc::new(RecordingLive::new());
        let sf = state.then(|| StateFile::new(dir.path().join("state.json")));
        let service = Arc::new(RpcService::new(cfg, live.clone(), sf));
        let server = serve(&sock, service.clone()).unwrap();
        Harness {
            dir,
            sock,
            live,
            service,
            server,
        }
    }

    pub fn client(&self) -> RpcClient {
        let mut c = RpcClient::connect(&self.sock, 0).unwrap();
        c.set_timeout(Some(Duration::from_secs(10))).unwrap();
        c
    }

    pub fn raw(&self) -> UnixStream {
        let s = UnixStream::connect(&self.sock).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s
    }

    pub fn state_path(&self) -> PathBuf {
        self.dir.path().join("state.json")
    }
}

/// Reads `n` JSON values from `s`.
pub fn read_values(s: &mut UnixStream, n: usize) -> Vec<Value> {
    let mut dec = FrameDecoder::new();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    while out.len() < n {
        while let Some(v) = dec.next_value().unwrap() {
            out.push(v);
        }
        if out.len() >= n {
            break;
        }
        let k = s.read(&mut buf).unwrap();
        assert!(
            k > 0,
            "connection closed after {} of {n} responses",
            out.len()
        );
        dec.push(&buf[..k]);
    }
    out
}

/// Reads until EOF; returns everything.
pub fn read_to_eof(s: &mut UnixStream) -> String {
    let mut v = Vec::new();
    s.read_to_end(&mut v).unwrap();
    String::from_utf8(v).unwrap()
}

pub fn send(s: &mut UnixStream, bytes: &[u8]) {
    s.write_all(bytes).unwrap();
}

/// The SPDK quick-start setup, call by call.
pub const QUICKSTART: &[(&str, &str)] = &[
    (
        "nvmf_create_transport",
        r#"{"trtype":"TCP","io_unit_size":8192,"max_io_size":131072,"in_capsule_data_size":8192}"#,
    ),
    (
        "bdev_malloc_create",
        r#"{"name":"Malloc0","num_blocks":1048576,"block_size":512}"#,
    ),
    (
        "nvmf_create_subsystem",
        r#"{"nqn":"nqn.2016-06.io.spdk:cnode1","allow_any_host":true,"serial_number":"SPDK00000000000001","model_number":"SPDK_Controller1"}"#,
    ),
    (
        "nvmf_subsystem_add_ns",
        r#"{"nqn":"nqn.2016-06.io.spdk:cnode1","namespace":{"bdev_name":"Malloc0"}}"#,
    ),
    (
        "nvmf_subsystem_add_listener",
        r#"{"nqn":"nqn.2016-06.io.spdk:cnode1","listen_address":{"trtype":"tcp","traddr":"127.0.0.1","trsvcid":"4420"}}"#,
    ),
];

pub fn quickstart(c: &mut RpcClient) {
    for (m, p) in QUICKSTART {
        let p: Value = serde_json::from_str(p).unwrap();
        c.call(m, Some(&p)).unwrap_or_else(|e| panic!("{m}: {e}"));
    }
}

/// One call through `c`: its result or its JSON-RPC error (a transport
/// error fails the test).
pub fn call(c: &mut RpcClient, m: &str, p: Value) -> Result<Value, RpcError> {
    let p = if p.is_null() { None } else { Some(p) };
    match c.call(m, p.as_ref()) {
        Ok(v) => Ok(v),
        Err(ClientError::Rpc(e)) => Err(e),
        Err(e) => panic!("{m}: transport error {e}"),
    }
}

/// Asserts the call fails with `code` and a message containing `needle`,
/// and that neither the model nor the live target changed.
pub fn fails(h: &Harness, c: &mut RpcClient, m: &str, p: Value, code: i32, needle: &str) {
    let before = h.service.config();
    let changes = h.live.changes().len();
    let e = call(c, m, p.clone()).expect_err(&format!("{m} {p} succeeded"));
    assert_eq!(e.code, code, "{m} {p}: {}", e.message);
    assert!(
        e.message.contains(needle),
        "{m} {p}: message {:?} lacks {needle:?}",
        e.message
    );
    assert_eq!(h.service.config(), before, "{m}: model changed on error");
    assert_eq!(
        h.live.changes().len(),
        changes,
        "{m}: live target changed on error"
    );
}
