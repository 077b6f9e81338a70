//! Multipath and HA harness for the kernel-host interop tests: several paths to one
//! subsystem, several nvmfd gateways in front of one shared file, a host-side TCP
//! forwarder a test can cut, and the guest kernel a scenario runs on.
//!
//! * [`Forwarder`]: 127.0.0.1:`port` → 127.0.0.1:`to`, one pair of copy threads per
//!   connection. [`Forwarder::cut`] ends every connection at once and refuses new ones
//!   (a path lost abruptly: a dead switch port, a killed proxy); [`Forwarder::restore`]
//!   lets connections through again.
//! * [`Gateway`]: the configuration of one nvmfd "gateway" exporting subsystem `nqn`
//!   (same serial, model and namespace NGUID/EUI-64/UUID on every gateway) from a file
//!   bdev on a file every gateway opens (O_DIRECT, nvmfd's io_uring file backend), with
//!   its own controller ID range (`min_cntlid`/`max_cntlid`: the Linux host refuses a
//!   second controller with a cntlid it already has in the subsystem) and listeners on
//!   any number of ports. [`Gateway::start`] runs it; `kill -9` and start again is a
//!   gateway crash and restart.
//! * Guest side: `tests/interop/mp-lib.sh` (connect every path, wait for paths, iopolicy,
//!   per-path I/O counts, a background fio crc32c verify loop that records the longest
//!   I/O latency fio saw: the failover pause) and the scenarios using it.
//!
//! The lead's ANA tests reuse these pieces; nothing here depends on ANA.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use serde_json::{json, Value};

use crate::Nvmfd;

/// The guest kernel a scenario runs on (`NVMFD_TESTBED_KERNEL` of the testbed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    /// Debian 12's own kernel (6.1): the default of every interop test.
    Debian12,
    /// Debian's bookworm-backports kernel (6.12).
    Backports612,
}

impl Kernel {
    /// `NVMFD_INTEROP_KERNEL` (`6.1` or `6.12`), else Debian 12's kernel: what
    /// [`run_guest`](crate::run_guest) boots.
    pub fn from_env() -> Kernel {
        match std::env::var("NVMFD_INTEROP_KERNEL").as_deref() {
            Ok("6.12") => Kernel::Backports612,
            _ => Kernel::Debian12,
        }
    }

    /// The testbed's `NVMFD_TESTBED_KERNEL` value.
    pub fn series(self) -> &'static str {
        match self {
            Kernel::Debian12 => "6.1",
            Kernel::Backports612 => "6.12",
        }
    }
}

// ------------------------------------------------------------- forwarder --

struct FwdShared {
    to: SocketAddr,
    blocked: AtomicBool,
    stop: AtomicBool,
    /// One clone of each side of every live connection, for `cut`.
    conns: Mutex<Vec<(TcpStream, TcpStream)>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

/// A host-side TCP forwarder a test controls (see the top comment). Stopped on drop.
pub struct Forwarder {
    /// The port the guest is given (`--host-port`).
    pub port: u16,
    shared: Arc<FwdShared>,
    accept: Option<JoinHandle<()>>,
}

impl Forwarder {
    /// Listens on 127.0.0.1 (a free port) and forwards every connection to 127.0.0.1:`to`.
    pub fn start(to: u16) -> Forwarder {
        let l = TcpListener::bind(("127.0.0.1", 0)).expect("bind forwarder");
        l.set_nonblocking(true).expect("nonblocking listener");
        let port = l.local_addr().unwrap().port();
        let shared = Arc::new(FwdShared {
            to: SocketAddr::from(([127, 0, 0, 1], to)),
            blocked: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            conns: Mutex::new(Vec::new()),
            threads: Mutex::new(Vec::new()),
        });
        let sh = shared.clone();
        let accept = thread::spawn(move || accept_loop(l, sh));
        Forwarder {
            port,
            shared,
            accept: Some(accept),
        }
    }

    /// Ends every forwarded connection at once (both sides) and refuses new ones until
    /// [`restore`](Self::restore). Returns how many connections were cut.
    pub fn cut(&self) -> usize {
        self.shared.blocked.store(true, Ordering::SeqCst);
        let conns = std::mem::take(&mut *self.shared.conns.lock().unwrap());
        for (a, b) in &conns {
            let _ = a.shutdown(Shutdown::Both);
            let _ = b.shutdown(Shutdown::Both);
        }
        conns.len()
    }

    /// Lets new connections through again.
    pub fn restore(&self) {
        self.shared.blocked.store(false, Ordering::SeqCst);
    }

    /// Connections forwarded now.
    pub fn live(&self) -> usize {
        self.shared.conns.lock().unwrap().len()
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.cut();
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
        for t in std::mem::take(&mut *self.shared.threads.lock().unwrap()) {
            let _ = t.join();
        }
    }
}

fn accept_loop(l: TcpListener, sh: Arc<FwdShared>) {
    while !sh.stop.load(Ordering::SeqCst) {
        let c = match l.accept() {
            Ok((c, _)) => c,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                thread::sleep(Duration::from_millis(10));
                continue;
            }
            Err(_) => {
                thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        if sh.blocked.load(Ordering::SeqCst) {
            drop(c); // refused: the path is down
            continue;
        }
        let _ = c.set_nonblocking(false);
        let Ok(up) = TcpStream::connect_timeout(&sh.to, Duration::from_secs(2)) else {
            continue;
        };
        let _ = c.set_nodelay(true);
        let _ = up.set_nodelay(true);
        let (Ok(c2), Ok(up2), Ok(c3), Ok(up3)) =
            (c.try_clone(), up.try_clone(), c.try_clone(), up.try_clone())
        else {
            continue;
        };
        sh.conns.lock().unwrap().push((c3, up3));
        let mut threads = sh.threads.lock().unwrap();
        threads.retain(|t| !t.is_finished());
        threads.push(thread::spawn(move || pump(c, up)));
        threads.push(thread::spawn(move || pump(up2, c2)));
    }
}

/// Copies `from` → `to` until either side ends, then ends both.
fn pump(mut from: TcpStream, mut to: TcpStream) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}

// -------------------------------------------------------------- gateways --

/// Namespace identifiers every gateway of a test reports for NSID 1.
pub const MP_NGUID: &str = "6e766d66642d6d756c74697061746801";
pub const MP_EUI64: &str = "6e766d6664000001";
pub const MP_UUID: &str = "6e766d66-642d-4d75-8c74-697061746801";

/// A file of `mb` MiB (zeroes) at `path`: the shared backend of the gateways.
pub fn shared_file(path: &Path, mb: u64) -> PathBuf {
    let f = std::fs::File::create(path).expect("create shared file");
    f.set_len(mb << 20).expect("size shared file");
    path.to_path_buf()
}

/// One nvmfd gateway of subsystem `nqn` (see the top comment).
#[derive(Debug, Clone)]
pub struct Gateway {
    pub nqn: String,
    pub file: PathBuf,
    /// Ports its subsystem (and the discovery subsystem) listens on, 127.0.0.1.
    pub ports: Vec<u16>,
    /// Controller ID range (`min_cntlid`, `max_cntlid`): disjoint across gateways.
    pub cntlids: (u16, u16),
}

impl Gateway {
    /// Gateway number `index` (0, 1, ...): controller IDs `index*1000+1 ..= index*1000+999`.
    pub fn new(nqn: &str, file: &Path, index: u16, ports: &[u16]) -> Gateway {
        Gateway {
            nqn: nqn.to_string(),
            file: file.to_path_buf(),
            ports: ports.to_vec(),
            cntlids: (index * 1000 + 1, index * 1000 + 999),
        }
    }

    fn listen(port: u16) -> Value {
        json!({"trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1",
               "trsvcid": port.to_string()})
    }

    /// SPDK `save_config`-shaped configuration of this gateway.
    pub fn config(&self) -> Value {
        let mut nvmf =
            vec![json!({"method": "nvmf_create_transport", "params": {"trtype": "TCP"}})];
        nvmf.extend(self.subsystem_calls());
        for p in &self.ports {
            nvmf.push(json!({"method": "nvmf_subsystem_add_listener", "params": {
                "nqn": "nqn.2014-08.org.nvmexpress.discovery", "listen_address": Self::listen(*p)}}));
        }
        json!({"subsystems": [
            {"subsystem": "bdev", "config": [{"method": "bdev_aio_create", "params": {
                "name": "Shared0", "filename": self.file.to_string_lossy(), "block_size": 512}}]},
            {"subsystem": "nvmf", "config": nvmf},
        ]})
    }

    /// The calls that create the subsystem, its namespace and listeners (also what a
    /// re-creation after `nvmf_delete_subsystem` sends).
    pub fn subsystem_calls(&self) -> Vec<Value> {
        let mut v = vec![
            json!({"method": "nvmf_create_subsystem", "params": {
                "nqn": self.nqn, "serial_number": "NVMFDMP0000001", "model_number": "nvmfd multipath",
                "allow_any_host": true, "min_cntlid": self.cntlids.0, "max_cntlid": self.cntlids.1}}),
            json!({"method": "nvmf_subsystem_add_ns", "params": {"nqn": self.nqn, "namespace": {
                "bdev_name": "Shared0", "nsid": 1, "nguid": MP_NGUID, "eui64": MP_EUI64,
                "uuid": MP_UUID}}}),
        ];
        for p in &self.ports {
            v.push(json!({"method": "nvmf_subsystem_add_listener", "params": {
                "nqn": self.nqn, "listen_address": Self::listen(*p)}}));
        }
        v
    }

    /// Starts nvmfd with this configuration in `dir` (created), waiting for its first port.
    pub fn start(&self, dir: &Path) -> Nvmfd {
        std::fs::create_dir_all(dir).expect("gateway dir");
        Nvmfd::start(dir, &self.config(), self.ports[0])
    }

    /// `nvmf_delete_subsystem` on a running gateway.
    pub fn delete_subsystem(&self, d: &Nvmfd) -> Result<(), String> {
        d.rpc(&["nvmf_delete_subsystem", &self.nqn]).map(|_| ())
    }

    /// Re-creates subsystem, namespace (same identifiers) and listeners over JSON-RPC.
    pub fn recreate_subsystem(&self, d: &Nvmfd) -> Result<(), String> {
        let (lo, hi) = (self.cntlids.0.to_string(), self.cntlids.1.to_string());
        d.rpc(&[
            "nvmf_create_subsystem",
            &self.nqn,
            "-a",
            "-s",
            "NVMFDMP0000001",
            "-d",
            "nvmfd multipath",
            "-i",
            &lo,
            "-I",
            &hi,
        ])?;
        d.rpc(&[
            "nvmf_subsystem_add_ns",
            &self.nqn,
            "Shared0",
            "-n",
            "1",
            "-g",
            MP_NGUID,
            "-e",
            MP_EUI64,
            "-u",
            MP_UUID,
        ])?;
        for p in &self.ports {
            d.rpc(&[
                "nvmf_subsystem_add_listener",
                &self.nqn,
                "-t",
                "tcp",
                "-a",
                "127.0.0.1",
                "-s",
                &p.to_string(),
            ])?;
        }
        Ok(())
    }
}

/// Runs the guest's `tests/interop/mp-failover.sh` over the paths `ports` with `env`: at
/// its "fail-path" checkpoint gateway `b` is killed with SIGKILL (a crash), at
/// "restore-path" `restart()` starts it again and the new daemon becomes `b`. The
/// failover pause is the run's `PAUSE_MS=` line ([`pause_ms`]).
pub fn kill9_failover(
    dir: &Path,
    ports: &[u16],
    env: &[(&str, String)],
    timeout: Duration,
    b: &mut Option<crate::Nvmfd>,
    mut restart: impl FnMut() -> crate::Nvmfd,
) -> crate::GuestRun {
    crate::run_guest(
        dir,
        "mp-failover.sh",
        ports,
        env,
        timeout,
        |cp, _| match cp {
            "fail-path" => {
                if let Some(d) = b.as_mut() {
                    d.kill_hard();
                }
                "ok gateway b killed (SIGKILL)".into()
            }
            "restore-path" => {
                *b = Some(restart());
                "ok gateway b restarted".into()
            }
            other => format!("fail: unknown checkpoint {other}"),
        },
    )
}

/// Prints the scenario's failover pause ([`pause_ms`]), or records a failure when the
/// guest printed none.
pub fn report_pause(test: &str, run: &crate::GuestRun, failures: &mut Vec<String>) {
    match pause_ms(&run.stdout) {
        Some(ms) => crate::say(&format!(
            "interop {test}: pause_ms={ms:.0} (longest fio I/O)"
        )),
        None => failures.push("the guest printed no PAUSE_MS= line".into()),
    }
}

/// The `PAUSE_MS=` value a multipath scenario printed (the longest I/O latency fio saw,
/// in ms), if any.
pub fn pause_ms(guest_stdout: &str) -> Option<f64> {
    guest_stdout
        .lines()
        .filter_map(|l| l.trim().strip_prefix("PAUSE_MS="))
        .filter_map(|v| v.trim().parse().ok())
        .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forwarder_forwards_cuts_and_restores() {
        let echo = TcpListener::bind(("127.0.0.1", 0)).unwrap();
        let to = echo.local_addr().unwrap().port();
        let srv = thread::spawn(move || {
            for c in echo.incoming().take(2) {
                let mut c = c.unwrap();
                let mut b = [0u8; 4];
                while let Ok(n) = c.read(&mut b) {
                    if n == 0 || c.write_all(&b[..n]).is_err() {
                        break;
                    }
                }
            }
        });
        let f = Forwarder::start(to);
        let mut c = TcpStream::connect(("127.0.0.1", f.port)).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        c.write_all(b"ping").unwrap();
        let mut b = [0u8; 4];
        c.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"ping");
        assert_eq!(f.cut(), 1);
        // The cut connection ends (end of file or reset), and a new one is refused.
        assert!(matches!(c.read(&mut b), Ok(0) | Err(_)));
        let mut d = TcpStream::connect(("127.0.0.1", f.port)).unwrap();
        d.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        assert!(
            matches!(d.read(&mut b), Ok(0) | Err(_)),
            "refused while cut"
        );
        f.restore();
        let mut e = TcpStream::connect(("127.0.0.1", f.port)).unwrap();
        e.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        e.write_all(b"pong").unwrap();
        e.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"pong");
        drop(e);
        drop(f);
        srv.join().unwrap();
    }

    #[test]
    fn gateways_share_identity_but_not_cntlids() {
        let a = Gateway::new("nqn.x:mp", Path::new("/tmp/f"), 0, &[4420]);
        let b = Gateway::new("nqn.x:mp", Path::new("/tmp/f"), 1, &[4421, 4422]);
        assert!(a.cntlids.1 < b.cntlids.0);
        let (ca, cb) = (a.config().to_string(), b.config().to_string());
        for s in [MP_NGUID, MP_EUI64, MP_UUID, "NVMFDMP0000001"] {
            assert!(ca.contains(s) && cb.contains(s));
        }
        assert!(cb.contains("\"4422\""));
        assert_eq!(pause_ms("x\nPAUSE_MS=12.5\nPAUSE_MS=40\n"), Some(40.0));
    }
}
