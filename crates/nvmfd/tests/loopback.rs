//! Loopback tests of the real `nvmfd` binary: a raw-socket NVMe/TCP host
//! (built on the nvmf-wire encoders) drives admin and I/O queues with and
//! without digests, and every malformed case must end in the spec's
//! C2HTermReq (or a clean close) while the daemon keeps serving others.

#[path = "common/raw_sock.rs"]
mod raw_sock;
#[path = "../../nvmf-tcp/tests/common/mod.rs"]
mod tcp_common;

use nvmf_testkit::{bins::nvmfd_command, free_port, Process as Nvmfd};
use nvmf_wire::command::{Command, SglDescriptor};
use nvmf_wire::fabrics::CNTLID_DYNAMIC;
use nvmf_wire::pdu::*;
use nvmf_wire::status::Status;
use raw_sock::Sock;
use std::io::{Read, Write};
use std::net::Shutdown;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tcp_common::host::*;
use tcp_common::{config_json, ALLOWED_HOST, RESTRICTED_NQN};

const IO_TIMEOUT: Duration = Duration::from_secs(5);

/// A running nvmfd; killed on drop (see [`Nvmfd`]), its config file
/// removed after.
struct Daemon {
    nvmfd: Nvmfd,
    port: u16,
    cfg: Option<PathBuf>,
    /// The daemon's RPC socket (removed with the daemon).
    sock: PathBuf,
}

impl std::ops::Deref for Daemon {
    type Target = Nvmfd;
    fn deref(&self) -> &Nvmfd {
        &self.nvmfd
    }
}

static SEQ: AtomicUsize = AtomicUsize::new(0);

fn write_cfg(text: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!(
        "nvmfd-test-{}-{}.json",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::write(&p, text).unwrap();
    p
}

impl Daemon {
    fn start(cores: &str) -> Daemon {
        // A port found free may be taken by a parallel test before nvmfd
        // binds it (nvmfd then exits with "Address already in use"): retry.
        for _ in 0..5 {
            let port = free_port();
            let cfg = write_cfg(&config_json(port));
            let mut d = Daemon::spawn(&["-c", cfg.to_str().unwrap(), "-m", cores], port);
            d.cfg = Some(cfg);
            let ready = format!("listening on 127.0.0.1:{port} (tcp)");
            if d.nvmfd.wait_ready(&ready, Duration::from_secs(10)) {
                return d;
            }
            std::thread::sleep(Duration::from_millis(50));
            assert!(
                d.logs().contains("Address already in use"),
                "nvmfd did not start; log:\n{}",
                d.logs()
            );
        }
        panic!("no free port for nvmfd after 5 tries");
    }

    fn spawn(args: &[&str], port: u16) -> Daemon {
        // Each daemon gets its own RPC socket (the default is shared).
        let sock =
            std::env::temp_dir().join(format!("nvmfd-loopback-{}-{port}.sock", std::process::id()));
        let nvmfd = Nvmfd::spawn(nvmfd_command().args(args).arg("-r").arg(&sock));
        Daemon {
            nvmfd,
            port,
            cfg: None,
            sock,
        }
    }

    /// Waits (10 s at most) for a log line containing `needle`.
    fn wait_log(&self, needle: &str) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if self.logged(needle) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("nvmfd never logged {needle:?}; log:\n{}", self.logs());
    }

    fn connect(&self) -> Sock {
        Sock::connect(self.port, IO_TIMEOUT)
    }

    /// Waits up to 10 s for the process to exit.
    fn wait_exit(&mut self) -> std::process::ExitStatus {
        match self.nvmfd.wait_exit(Duration::from_secs(10)) {
            Some(st) => st,
            None => panic!("nvmfd did not exit; log:\n{}", self.logs()),
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.nvmfd.kill();
        if let Some(p) = &self.cfg {
            let _ = std::fs::remove_file(p);
        }
        let _ = std::fs::remove_file(&self.sock);
    }
}

impl Sock {
    /// The peer closes (EOF or reset) within the read timeout, sending
    /// nothing more.
    fn expect_closed(&mut self) {
        let mut tmp = [0u8; 4096];
        match self.s.read(&mut tmp) {
            Ok(0) => {}
            Ok(n) => panic!("unexpected {n} more bytes before close"),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            Err(e) => panic!("connection not closed: {e}"),
        }
    }

    /// The target neither closed the connection nor sent anything within
    /// 300 ms.
    fn expect_open_idle(&mut self) {
        let mut tmp = [0u8; 64];
        let prev = self.s.read_timeout().unwrap();
        self.s
            .set_read_timeout(Some(std::time::Duration::from_millis(300)))
            .unwrap();
        match self.s.read(&mut tmp) {
            Ok(0) => panic!("connection closed"),
            Ok(n) => panic!("unexpected {n} bytes"),
            Err(e) => assert!(
                matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ),
                "{e}"
            ),
        }
        self.s.set_read_timeout(prev).unwrap();
    }

    fn expect_term(&mut self, h: &Host, fes: u16, fei: Option<u32>) {
        match self.recv(h) {
            Resp::Term { fes: f, fei: i, .. } => {
                assert_eq!(f, fes, "FES");
                if let Some(fei) = fei {
                    assert_eq!(i, fei, "FEI");
                }
            }
            other => panic!("expected C2HTermReq, got {other:?}"),
        }
        self.expect_closed();
    }
}

/// Full bring-up and I/O on fresh connections: the daemon is healthy.
fn exercise(d: &Daemon, digests: bool, seed: u64) {
    let mut admin = d.connect();
    let mut ah = Host::new();
    let cntlid = admin_up(&mut admin, &mut ah, digests, digests);
    let id = identify_ctrl(&mut admin, &mut ah);
    assert!(id.iter().any(|&b| b != 0));
    let mut io = d.connect();
    let mut h = Host::new();
    init(&mut io, &mut h, digests, digests);
    let c = connect(&mut io, &mut h, 1, 127, cntlid, DEFAULT_NQN, HOSTNQN);
    assert_eq!(c.status(), Status::SUCCESS, "I/O connect");
    let a = pattern(seed, 4096);
    assert_eq!(write(&mut io, &mut h, 16, &a, true), Status::SUCCESS);
    let b = pattern(seed + 1, 128 * 1024);
    assert_eq!(write(&mut io, &mut h, 512, &b, false), Status::SUCCESS);
    let (s, got) = read(&mut io, &mut h, 16, 4096);
    assert_eq!(s, Status::SUCCESS);
    assert!(got == a, "in-capsule write reads back");
    let (s, got) = read(&mut io, &mut h, 512, 128 * 1024);
    assert_eq!(s, Status::SUCCESS);
    assert!(got == b, "R2T write reads back");
}

#[test]
fn end_to_end_without_digests() {
    let d = Daemon::start("0");
    exercise(&d, false, 1);
    d.wait_log("connection accepted from 127.0.0.1:");
    d.wait_log("controller created");
}

#[test]
fn end_to_end_with_digests_on_two_reactors() {
    let cores = if std::thread::available_parallelism().map_or(1, |n| n.get()) > 1 {
        "0-1"
    } else {
        "0"
    };
    let d = Daemon::start(cores);
    exercise(&d, true, 2);
    exercise(&d, false, 3);
}

/// Opens a connection, does ICReq (optionally with header digests), and
/// returns it with its host codec.
fn opened(d: &Daemon, hdgst: bool) -> (Sock, Host) {
    let mut s = d.connect();
    let mut h = Host::new();
    init(&mut s, &mut h, hdgst, false);
    (s, h)
}

fn malformed_then_healthy(f: impl FnOnce(&Daemon)) {
    let d = Daemon::start("0");
    // A well-behaved admin connection stays up through the bad one.
    let mut bystander = d.connect();
    let mut bh = Host::new();
    admin_up(&mut bystander, &mut bh, false, false);
    f(&d);
    exercise(&d, false, 9);
    identify_ctrl(&mut bystander, &mut bh);
}

#[test]
fn bad_pdu_type() {
    malformed_then_healthy(|d| {
        let (mut s, h) = opened(d, false);
        let mut p = h.capsule(&Command::new(0x18, 1), &[]);
        p[0] = 0x0c;
        s.send(&p);
        s.expect_term(&h, FES_INVALID_HEADER_FIELD, Some(0));
    });
}

#[test]
fn header_length_mismatch() {
    malformed_then_healthy(|d| {
        let (mut s, h) = opened(d, false);
        let mut p = h.capsule(&Command::new(0x18, 1), &[]);
        p[2] = 24;
        s.send(&p);
        s.expect_term(&h, FES_INVALID_HEADER_FIELD, Some(2));
    });
}

#[test]
fn pdu_length_overflow() {
    malformed_then_healthy(|d| {
        let (mut s, h) = opened(d, false);
        let mut cmd = Command::new(0x01, 1);
        cmd.set_sgl(SglDescriptor::in_capsule(0, 512));
        let mut p = h.capsule(&cmd, &[0u8; 512]);
        p[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        s.send(&p);
        s.expect_term(&h, FES_DATA_LIMIT_EXCEEDED, None);
    });
}

#[test]
fn h2c_data_offset_outside_command() {
    malformed_then_healthy(|d| {
        let mut admin = d.connect();
        let mut ah = Host::new();
        let cntlid = admin_up(&mut admin, &mut ah, false, false);
        let (mut s, mut h) = opened(d, false);
        let c = connect(&mut s, &mut h, 1, 31, cntlid, DEFAULT_NQN, HOSTNQN);
        assert_eq!(c.status(), Status::SUCCESS);
        let mut cmd = Command::new(0x01, 77);
        cmd.set_nsid(1);
        cmd.set_lba_range(0, 16);
        cmd.set_sgl(SglDescriptor::transport(8192));
        s.send(&h.capsule(&cmd, &[]));
        let ttag = match s.recv(&h) {
            Resp::R2T { ttag, r2tl, .. } => {
                assert_eq!(r2tl, 8192);
                ttag
            }
            other => panic!("expected R2T, got {other:?}"),
        };
        s.send(&h.h2c(77, ttag, 16384, &[0u8; 4096], true));
        s.expect_term(&h, FES_DATA_OUT_OF_RANGE, Some(12));
    });
}

#[test]
fn io_command_before_connect() {
    malformed_then_healthy(|d| {
        let (mut s, h) = opened(d, false);
        let mut cmd = Command::new(0x02, 1);
        cmd.set_nsid(1);
        cmd.set_sgl(SglDescriptor::transport(4096));
        s.send(&h.capsule(&cmd, &[]));
        s.expect_term(&h, FES_PDU_SEQUENCE_ERROR, None);
    });
}

#[test]
fn capsule_before_icreq() {
    malformed_then_healthy(|d| {
        let mut s = d.connect();
        let h = Host::new();
        s.send(&h.capsule(&Command::new(0x18, 1), &[]));
        s.expect_term(&h, FES_PDU_SEQUENCE_ERROR, None);
    });
}

#[test]
fn header_digest_wrong() {
    malformed_then_healthy(|d| {
        let (mut s, h) = opened(d, true);
        let mut p = h.capsule(&Command::new(0x18, 1), &[]);
        p[73] ^= 0x5a;
        s.send(&p);
        s.expect_term(&h, FES_HEADER_DIGEST_ERROR, None);
    });
}

#[test]
fn abrupt_disconnect_mid_pdu() {
    malformed_then_healthy(|d| {
        let (mut s, h) = opened(d, false);
        let cmd = Command::connect(1, 0, 31, 0, 0);
        let p = h.capsule(&cmd, &[0u8; 1024]);
        s.send(&p[..100]);
        s.s.shutdown(Shutdown::Both).unwrap();
        drop(s);
        d.wait_log("closed: peer closed the connection in the middle of a PDU");
    });
}

#[test]
fn connect_invalid_host_and_unknown_subsystem() {
    let d = Daemon::start("0");
    let (mut s, mut h) = opened(&d, false);
    let c = connect(
        &mut s,
        &mut h,
        0,
        31,
        CNTLID_DYNAMIC,
        RESTRICTED_NQN,
        HOSTNQN,
    );
    assert_eq!(
        (c.status().sct, c.status().sc),
        (1, 0x84),
        "Connect Invalid Host"
    );
    // The connection stays open (as with SPDK's target and nvmet), so the
    // host reads the status; another Connect on it may succeed.
    let c = connect(
        &mut s,
        &mut h,
        0,
        31,
        CNTLID_DYNAMIC,
        RESTRICTED_NQN,
        ALLOWED_HOST,
    );
    assert_eq!(c.status(), Status::SUCCESS, "second Connect, allowed host");
    drop(s);

    let (mut s, mut h) = opened(&d, false);
    let c = connect(
        &mut s,
        &mut h,
        0,
        31,
        CNTLID_DYNAMIC,
        "nqn.2024-01.io.nvmfd:nope",
        HOSTNQN,
    );
    assert_eq!(
        (c.status().sct, c.status().sc),
        (1, 0x82),
        "Connect Invalid Parameters"
    );
    s.expect_open_idle();
    drop(s);

    let (mut s, mut h) = opened(&d, false);
    let c = connect(
        &mut s,
        &mut h,
        0,
        31,
        CNTLID_DYNAMIC,
        RESTRICTED_NQN,
        ALLOWED_HOST,
    );
    assert_eq!(c.status(), Status::SUCCESS, "allowed host");
    exercise(&d, false, 5);
}

#[test]
fn discovery_log_page() {
    let d = Daemon::start("0");
    let mut s = d.connect();
    let mut h = Host::new();
    admin_up_nqn(
        &mut s,
        &mut h,
        false,
        false,
        "nqn.2014-08.org.nvmexpress.discovery",
    );
    let (st, hdr) = get_log_page(&mut s, &mut h, 0x70, 1024);
    assert_eq!(st, Status::SUCCESS);
    let numrec = u64::from_le_bytes(hdr[8..16].try_into().unwrap());
    assert!(numrec >= 1, "discovery log lists the subsystems");
    let len = 1024 * (1 + numrec as u32);
    let (st, log) = get_log_page(&mut s, &mut h, 0x70, len);
    assert_eq!(st, Status::SUCCESS);
    assert_eq!(log.len(), len as usize);
    let text = String::from_utf8_lossy(&log);
    assert!(text.contains(DEFAULT_NQN));
    assert!(text.contains(&d.port.to_string()));
}

#[test]
fn sigterm_exits_zero() {
    let mut d = Daemon::start("0");
    let (_s, _h) = opened(&d, false);
    // SAFETY: plain kill(2) on our own child.
    unsafe {
        libc::kill(d.child.id() as i32, libc::SIGTERM);
    }
    let st = d.wait_exit();
    assert!(st.success(), "exit status {st:?}; log:\n{}", d.logs());
    d.wait_log("shutdown complete");
}

#[test]
fn config_error_exits_nonzero_before_serving() {
    let port = free_port();
    let bad = config_json(port).replace(r#""block_size":512"#, r#""block_size":3"#);
    let cfg = write_cfg(&bad);
    let mut d = Daemon::spawn(&["-c", cfg.to_str().unwrap(), "-m", "0"], port);
    d.cfg = Some(cfg);
    let st = d.wait_exit();
    assert!(!st.success());
    // The stderr reader may still be collecting the last lines.
    d.wait_log("block_size");
    let log = d.logs();
    assert!(
        log.contains("bdev_malloc_create"),
        "names the method: {log}"
    );
    assert!(log.contains("block_size"), "names the parameter: {log}");
    assert!(!log.contains("listening on"), "served nothing: {log}");
}

#[test]
fn help_and_version() {
    let out = nvmfd_command().arg("--help").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for needle in ["--config", "--cores", "--log-level", "0x3", "nvme connect"] {
        assert!(text.contains(needle), "--help mentions {needle}: {text}");
    }
    let out = nvmfd_command().arg("--version").output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("nvmfd "));
}

#[test]
fn garbage_connections_do_not_hurt_the_daemon() {
    let d = Daemon::start("0");
    for seed in 0..40u64 {
        let mut s = d.connect();
        let h = Host::new();
        let mut bytes = Vec::new();
        if seed % 2 == 0 {
            bytes.extend(h.icreq(seed % 4 == 0, seed % 3 == 0));
        }
        let mut junk = pattern(seed + 100, 16 + (seed as usize * 131) % 5000);
        if seed % 3 != 0 {
            junk[0] = (seed % 10) as u8;
            junk[2] = [8u8, 24, 72, 128][(seed % 4) as usize];
        }
        bytes.extend(junk);
        // The daemon may hang up before taking every byte.
        let _ = s.s.write_all(&bytes);
        if seed % 5 == 0 {
            drop(s);
            continue;
        }
        let _ = s.s.shutdown(Shutdown::Write);
        // The daemon hangs up (after a C2HTermReq, or at our EOF) within
        // the read timeout.
        let mut sink = Vec::new();
        match s.s.read_to_end(&mut sink) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            Err(e) => panic!("seed {seed}: garbage connection not closed: {e}"),
        }
    }
    exercise(&d, true, 11);
    assert!(!d.logs().contains("panic"), "log:\n{}", d.logs());
}
