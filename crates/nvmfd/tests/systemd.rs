//! nvmfd under systemd's service protocol (`Type=notify`, sd_notify(3)), with this test as
//! the service manager: a Unix datagram socket passed as `NOTIFY_SOCKET`, and
//! `WATCHDOG_USEC` as systemd sets it for `WatchdogSec=`.
//!
//! * `ready_status_watchdog_reload_and_stopping`: `READY=1` comes once the listener
//!   accepts; `WATCHDOG=1` keeps coming with `STATUS=` lines that count the controllers
//!   (a host connects: 1 controller); SIGHUP (`systemctl reload`) sends `RELOADING=1`,
//!   applies the edited configuration file live (a second namespace appears, the
//!   connected host's controller keeps working) and `READY=1` again; a broken file is
//!   refused, logged with its name, and changes nothing; SIGTERM sends `STOPPING=1` and
//!   nvmfd exits 0.
//! * `a_hung_reactor_stops_the_watchdog_pings`: a reactor that stops answering
//!   (`NVMFD_DEBUG_HANG_REACTOR`, debug builds) stops the `WATCHDOG=1` pings, so that
//!   systemd would restart the daemon; the log names the reactor.

use std::os::unix::net::UnixDatagram;
use std::time::{Duration, Instant};

use nvmf_host::{ConnectOptions, Controller, TransportId};
use nvmf_testkit::{free_port, Daemon, TestDir};

const NQN: &str = "nqn.2016-06.io.nvmfd:systemd";

fn config(port: u16, namespaces: usize) -> String {
    let mut bdevs = Vec::new();
    let mut nvmf = vec![
        r#"{"method":"nvmf_create_transport","params":{"trtype":"TCP"}}"#.to_string(),
        format!(
            r#"{{"method":"nvmf_create_subsystem","params":{{"nqn":"{NQN}","allow_any_host":true}}}}"#
        ),
    ];
    for n in 1..=namespaces {
        bdevs.push(format!(
            r#"{{"method":"bdev_malloc_create","params":{{"name":"M{n}","num_blocks":8192,"block_size":512}}}}"#
        ));
        nvmf.push(format!(
            r#"{{"method":"nvmf_subsystem_add_ns","params":{{"nqn":"{NQN}","namespace":{{"nsid":{n},"bdev_name":"M{n}"}}}}}}"#
        ));
    }
    nvmf.push(format!(
        r#"{{"method":"nvmf_subsystem_add_listener","params":{{"nqn":"{NQN}","listen_address":{{"trtype":"TCP","adrfam":"IPv4","traddr":"127.0.0.1","trsvcid":"{port}"}}}}}}"#
    ));
    format!(
        r#"{{"subsystems":[{{"subsystem":"bdev","config":[{}]}},{{"subsystem":"nvmf","config":[{}]}}]}}"#,
        bdevs.join(","),
        nvmf.join(",")
    )
}

/// The service manager's end: every datagram nvmfd sends, split into its lines.
struct Manager {
    sock: UnixDatagram,
    seen: Vec<String>,
}

impl Manager {
    fn new(dir: &TestDir) -> (Manager, String) {
        let path = dir.path().join("notify.sock");
        let sock = UnixDatagram::bind(&path).expect("bind the notify socket");
        sock.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        (
            Manager {
                sock,
                seen: Vec::new(),
            },
            path.display().to_string(),
        )
    }

    /// Receives until a line for which `want` holds (returned), failing after `limit`.
    fn until(&mut self, limit: Duration, what: &str, want: impl Fn(&str) -> bool) -> String {
        let t0 = Instant::now();
        let mut buf = [0u8; 4096];
        loop {
            if let Ok(n) = self.sock.recv(&mut buf) {
                let msg = String::from_utf8_lossy(&buf[..n]).to_string();
                for line in msg.lines() {
                    self.seen.push(line.to_string());
                    if want(line) {
                        return line.to_string();
                    }
                }
            }
            assert!(
                t0.elapsed() < limit,
                "no {what} within {limit:?}; received: {:?}",
                self.seen
            );
        }
    }

    /// Counts the lines equal to `line` received during `span`.
    fn count(&mut self, span: Duration, line: &str) -> usize {
        let t0 = Instant::now();
        let mut buf = [0u8; 4096];
        let mut n = 0;
        while t0.elapsed() < span {
            if let Ok(len) = self.sock.recv(&mut buf) {
                let msg = String::from_utf8_lossy(&buf[..len]).to_string();
                for l in msg.lines() {
                    self.seen.push(l.to_string());
                    n += usize::from(l == line);
                }
            }
        }
        n
    }
}

fn namespaces(d: &Daemon) -> usize {
    let v: serde_json::Value = serde_json::from_str(&d.rpc_ok(&["nvmf_get_subsystems"])).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .find(|s| s["nqn"] == NQN)
        .map_or(0, |s| s["namespaces"].as_array().map_or(0, Vec::len))
}

#[test]
fn ready_status_watchdog_reload_and_stopping() {
    let dir = TestDir::new("systemd");
    let (mut m, path) = Manager::new(&dir);
    let port = free_port();
    let mut d = Daemon::builder(config(port, 1))
        .args(["-m", "0"])
        .env("NOTIFY_SOCKET", &path)
        .env("WATCHDOG_USEC", "600000")
        .listening(&[port])
        .start();

    m.until(Duration::from_secs(20), "READY=1", |l| l == "READY=1");
    // READY means the listener accepts.
    std::net::TcpStream::connect(("127.0.0.1", port)).expect("READY=1 before the listener accepts");
    let pings = m.count(Duration::from_secs(2), "WATCHDOG=1");
    assert!(
        pings >= 4,
        "{pings} watchdog pings in 2 s (every 300 ms expected): {:?}",
        m.seen
    );

    let ctrl = Controller::connect(&ConnectOptions::new(TransportId::tcp(
        "127.0.0.1",
        &port.to_string(),
        NQN,
    )))
    .expect("connect");
    m.until(
        Duration::from_secs(5),
        "a status with the controller",
        |l| l.starts_with("STATUS=serving: 1 controller(s)"),
    );

    // systemctl reload: the edited file is applied live.
    std::fs::write(&d.config, config(port, 2)).unwrap();
    d.signal(libc::SIGHUP);
    m.until(Duration::from_secs(10), "RELOADING=1", |l| {
        l == "RELOADING=1"
    });
    m.until(Duration::from_secs(20), "READY=1 after the reload", |l| {
        l == "READY=1"
    });
    assert_eq!(namespaces(&d), 2, "the reload added namespace 2");
    ctrl.identify_controller()
        .expect("the host's controller survives the reload");

    // A broken file changes nothing and says why.
    std::fs::write(&d.config, "{\"subsystems\": [").unwrap();
    d.signal(libc::SIGHUP);
    m.until(Duration::from_secs(10), "RELOADING=1", |l| {
        l == "RELOADING=1"
    });
    m.until(
        Duration::from_secs(20),
        "READY=1 after the failed reload",
        |l| l == "READY=1",
    );
    assert_eq!(namespaces(&d), 2);
    d.wait_log_for("reload (SIGHUP) failed", Duration::from_secs(5));
    assert!(
        d.logs().contains(&d.config.display().to_string()),
        "the failure names the file: {}",
        d.logs()
    );

    drop(ctrl);
    d.signal(libc::SIGTERM);
    m.until(Duration::from_secs(10), "STOPPING=1", |l| l == "STOPPING=1");
    let st = d.wait_exit(Duration::from_secs(30));
    assert!(
        st.is_some_and(|s| s.success()),
        "exit: {st:?}\n{}",
        d.logs()
    );
}

#[test]
fn a_hung_reactor_stops_the_watchdog_pings() {
    let dir = TestDir::new("systemd-hang");
    let (mut m, path) = Manager::new(&dir);
    let port = free_port();
    let d = Daemon::builder(config(port, 1))
        .args(["-m", "0"])
        .env("NOTIFY_SOCKET", &path)
        .env("WATCHDOG_USEC", "600000")
        .env("NVMFD_DEBUG_HANG_REACTOR", "0")
        .listening(&[port])
        .start();
    m.until(Duration::from_secs(20), "READY=1", |l| l == "READY=1");
    // Reactor 0 answers two pings, then hangs at the third.
    d.wait_log_for("did not answer the watchdog", Duration::from_secs(10));
    // What was sent before the hang may still be queued in the socket.
    m.until(Duration::from_secs(5), "the not-answering status", |l| {
        l == "STATUS=reactor 0 not answering"
    });
    let pings = m.count(Duration::from_secs(2), "WATCHDOG=1");
    assert_eq!(pings, 0, "pings while reactor 0 hangs: {:?}", m.seen);
    assert!(
        d.logs().contains("reactor 0 did not answer"),
        "{}",
        d.logs()
    );
}

/// The packaged unit (`packaging/nvmfd.service`) passes `systemd-analyze verify`, with its
/// ExecStart pointed at the built nvmfd (the man page it names is only there once the
/// package is installed, so that one finding is allowed), and keeps the settings the
/// daemon relies on.
#[test]
fn the_packaged_unit_verifies() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let unit = std::fs::read_to_string(root.join("packaging/nvmfd.service")).unwrap();
    for needle in [
        "Type=notify",
        "WatchdogSec=",
        "ExecReload=/bin/sh -c 'kill -HUP $MAINPID'",
        "Restart=on-failure",
        "StateDirectory=nvmfd",
        "RuntimeDirectory=nvmfd",
        "ProtectSystem=strict",
        "--state /var/lib/nvmfd/state.json",
        "-r /run/nvmfd/nvmfd.sock",
    ] {
        assert!(unit.contains(needle), "the unit lacks {needle}");
    }
    let dir = TestDir::new("unit");
    let path = dir.path().join("nvmfd.service");
    let bin = nvmf_testkit::bins::nvmfd();
    std::fs::write(
        &path,
        unit.replace("/usr/sbin/nvmfd", &bin.display().to_string()),
    )
    .unwrap();
    let mut cmd = std::process::Command::new("systemd-analyze");
    cmd.arg("verify").arg(&path);
    let out = nvmf_testkit::run_bounded(cmd, Duration::from_secs(60));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let findings: Vec<&str> = text
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.contains("man nvmfd(8)"))
        .collect();
    assert!(
        findings.is_empty(),
        "systemd-analyze verify (exit {:?}):\n{text}",
        out.status.code()
    );
}

/// One journal entry of the native protocol (`KEY=value` lines, or `KEY`, a little-endian
/// length and the value for values with newlines).
fn parse_entry(mut b: &[u8]) -> std::collections::HashMap<String, String> {
    let mut out = std::collections::HashMap::new();
    while let Some(nl) = b.iter().position(|&c| c == b'\n') {
        let line = &b[..nl];
        if let Some(eq) = line.iter().position(|&c| c == b'=') {
            out.insert(
                String::from_utf8_lossy(&line[..eq]).into_owned(),
                String::from_utf8_lossy(&line[eq + 1..]).into_owned(),
            );
            b = &b[nl + 1..];
        } else {
            let key = String::from_utf8_lossy(line).into_owned();
            let len = u64::from_le_bytes(b[nl + 1..nl + 9].try_into().unwrap()) as usize;
            let val = &b[nl + 9..nl + 9 + len];
            out.insert(key, String::from_utf8_lossy(val).into_owned());
            b = &b[nl + 9 + len + 1..];
        }
    }
    out
}

/// Under systemd with its output going to the journal (`JOURNAL_STREAM`), each log line is a
/// journal entry whose fields name the host, subsystem, controller and peer
/// (`journalctl -u nvmfd HOSTNQN=...`); nothing is written to stderr. A stand-in journald
/// socket (`NVMFD_JOURNAL_SOCKET`) receives them.
#[test]
fn journal_entries_carry_the_host_subsystem_controller_and_peer() {
    let dir = TestDir::new("journal");
    let path = dir.path().join("journal.sock");
    let sock = UnixDatagram::bind(&path).expect("bind the journal socket");
    sock.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let port = free_port();
    let d = Daemon::builder(config(port, 1))
        .args(["-m", "0"])
        .env("JOURNAL_STREAM", "8:12345")
        .env("NVMFD_JOURNAL_SOCKET", &path.display().to_string())
        .start();
    let mut entries: Vec<std::collections::HashMap<String, String>> = Vec::new();
    let mut wait_for =
        |what: &str, want: &dyn Fn(&std::collections::HashMap<String, String>) -> bool| {
            let t0 = Instant::now();
            let mut buf = vec![0u8; 65536];
            loop {
                if let Some(e) = entries.iter().find(|e| want(e)) {
                    return e.clone();
                }
                if let Ok(n) = sock.recv(&mut buf) {
                    entries.push(parse_entry(&buf[..n]));
                }
                assert!(
                    t0.elapsed() < Duration::from_secs(20),
                    "no journal entry {what}; got: {entries:#?}"
                );
            }
        };
    let listening = wait_for("saying it listens", &|e| {
        e.get("MESSAGE")
            .is_some_and(|m| m.contains(&format!("listening on 127.0.0.1:{port}")))
    });
    assert_eq!(listening.get("PRIORITY").map(String::as_str), Some("6"));
    assert_eq!(
        listening.get("SYSLOG_IDENTIFIER").map(String::as_str),
        Some("nvmfd")
    );

    let hostnqn = "nqn.2014-08.org.nvmexpress:uuid:5eed5eed-0000-4000-8000-00000000a11c";
    let mut o = ConnectOptions::new(TransportId::tcp("127.0.0.1", &port.to_string(), NQN));
    o.hostnqn = hostnqn.into();
    let ctrl = Controller::connect(&o).expect("connect");
    let created = wait_for("for the new controller", &|e| {
        e.get("MESSAGE")
            .is_some_and(|m| m.starts_with("controller created"))
    });
    assert_eq!(
        created.get("HOSTNQN").map(String::as_str),
        Some(hostnqn),
        "{created:?}"
    );
    assert_eq!(
        created.get("SUBNQN").map(String::as_str),
        Some(NQN),
        "{created:?}"
    );
    assert!(
        created
            .get("CNTLID")
            .is_some_and(|c| c.parse::<u16>().is_ok()),
        "{created:?}"
    );
    assert!(
        created
            .get("PEER")
            .is_some_and(|p| p.starts_with("127.0.0.1:")),
        "{created:?}"
    );
    drop(ctrl);
    assert!(
        !d.logs().contains("controller created"),
        "with the journal, nothing goes to stderr: {}",
        d.logs()
    );
}

/// `JOURNAL_STREAM` inherited from elsewhere (it names another stream than this process's
/// stderr, as in a shell started from a service): nvmfd logs to stderr as usual.
#[test]
fn an_inherited_journal_stream_is_not_taken_for_the_journal() {
    let port = free_port();
    let d = Daemon::builder(config(port, 1))
        .args(["-m", "0"])
        .env("JOURNAL_STREAM", "1:1")
        .listening(&[port])
        .start();
    assert!(d.logs().contains("listening on"), "{}", d.logs());
}
